"""The readers hand out AppDefinitions judged with their namespace, and nothing malformed in a
Session stops the scheduler's key mapping or the worker cache (issue #15, items 5, 6 and 8)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.mapping import instance_id, keys_for
from warmpool.keys import SessionKey, TimeoutKey
from warmpool.kube.reader import CachedReader, LiveReader
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, Invalid
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

NS = "ns1"


def appdef_obj(name: str, spec_name: str, created: str, **spec: Any) -> dict[str, Any]:
    return appdef_body(NS, name, appdef_spec(
        name, min_instances=1, max_instances=3, spec_name=spec_name, image="img",
        ingressname=None, resources=False, **spec), metadata={
            "uid": f"uid-{name}-0123456789ab", "resourceVersion": "3", "generation": 1,
            "creationTimestamp": created})


def session_obj(name: str, annotation: str) -> dict[str, Any]:
    return session_body(NS, name, session_spec(name, "jane@example.com", workspace=None),
                        metadata={"uid": f"uid-{name}", "resourceVersion": "4",
                                  "annotations": {v.ANNOTATION_INSTANCE_ID: annotation}})


class Listed:
    """An API server that lists `objects` and has no events to watch."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    def list_pages(self, api_version: str, kind: str, namespace: str | None,
                   **kw: Any) -> Iterator[tuple[list[dict[str, Any]], str]]:
        yield [dict(o) for o in self.objects
               if o["kind"] == kind and kw.get("field_selector") is None], "1"

    def list(self, api_version: str, kind: str, namespace: str | None,
             **kw: Any) -> tuple[list[dict[str, Any]], str]:
        return [dict(o) for o in self.objects if o["kind"] == kind], "1"

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        return next((dict(o) for o in self.objects
                     if o["kind"] == kind and o["metadata"]["name"] == name), None)

    def watch(self, api_version: str, kind: str, namespace: str | None,
              **kw: Any) -> Iterator[dict[str, Any]]:
        time.sleep(0.02)  # stimulus: an empty watch lasts a moment (nothing ever happens here)
        yield from ()


COLLIDING = [appdef_obj("java-old", "java", "2026-01-01T00:00:00Z"),
             appdef_obj("java-new", "Java", "2026-01-02T00:00:00Z")]


def test_the_cached_reader_makes_the_later_colliding_appdefinition_invalid(make_cache) -> None:
    reader = CachedReader(make_cache(Listed(COLLIDING)), None)  # type: ignore[arg-type]
    assert isinstance(reader.appdef(NS, "java-old"), AppDefinition)
    later = reader.appdef(NS, "java-new")
    assert isinstance(later, Invalid) and "AppDefinition 'java-old'" in later.message


def test_the_live_reader_makes_the_later_colliding_appdefinition_invalid() -> None:
    reader = LiveReader(Listed(COLLIDING))  # type: ignore[arg-type]
    assert isinstance(reader.appdef(NS, "java-old"), AppDefinition)
    assert isinstance(reader.appdef(NS, "java-new"), Invalid)


def test_the_readers_apply_the_configured_ceiling(make_cache) -> None:
    big = [appdef_obj("big", "big", "2026-01-01T00:00:00Z", maxInstances=50)]
    assert isinstance(LiveReader(Listed(big)).appdef(NS, "big"), AppDefinition)  # type: ignore
    for reader in (LiveReader(Listed(big), max_instances_ceiling=10),  # type: ignore[arg-type]
                   CachedReader(make_cache(Listed(big)), None,  # type: ignore[arg-type]
                                max_instances_ceiling=10)):
        parsed = reader.appdef(NS, "big")
        assert isinstance(parsed, Invalid) and "ceiling of 10" in parsed.message


@pytest.mark.parametrize("raw", ["²", "1" * 5000, "007", "-1"])
def test_the_scheduler_maps_a_malformed_instance_id_without_raising(raw: str) -> None:
    obj = session_obj("s1", raw)
    assert instance_id(obj) is None
    assert keys_for(v.SESSION_KIND, "ADDED", obj, None) == [SessionKey(NS, "s1"),
                                                            TimeoutKey(NS, "s1")]


def test_the_worker_cache_indexes_a_session_with_a_malformed_instance_id(make_cache) -> None:
    c = make_cache(Listed([session_obj("odd", "²"), session_obj("plain", "2")]))
    got = {s.name: s.instance_id for s in c.sessions_of(NS, "java")}
    assert got == {"odd": None, "plain": 2}
