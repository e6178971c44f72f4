"""The metadata accessors (warmpool.pool.meta) and the pool object kinds derived from `Part`."""

from __future__ import annotations

from typing import Any

import pytest

from warmpool.pool.meta import (
    annotations_of,
    labels_of,
    meta_of,
    name_of,
    namespace_of,
    owner_refs,
    resource_version_of,
    uid_of,
)
from warmpool.pool.parts import PARTS, POOL_KIND_NAMES, POOL_KINDS

FULL: dict[str, Any] = {
    "metadata": {
        "name": "n", "namespace": "ns", "uid": "u", "resourceVersion": "7",
        "labels": {"a": "1"}, "annotations": {"b": "2"},
        "ownerReferences": [{"kind": "Session", "name": "s", "uid": "su"}],
    },
}


@pytest.mark.parametrize("obj", [
    None, {}, {"metadata": None}, {"metadata": {}},
    {"metadata": {"labels": None, "annotations": None, "ownerReferences": None}},
])
def test_whatever_is_missing_or_null_reads_as_empty(obj: dict[str, Any] | None) -> None:
    assert (labels_of(obj), annotations_of(obj), owner_refs(obj)) == ({}, {}, ())
    assert (name_of(obj), namespace_of(obj), uid_of(obj), resource_version_of(obj)) == (
        "", "", "", "")
    assert dict(meta_of(obj)) == ((obj or {}).get("metadata") or {})


def test_the_objects_own_values_are_returned_not_copies() -> None:
    meta = FULL["metadata"]
    assert meta_of(FULL) is meta
    assert labels_of(FULL) is meta["labels"]
    assert annotations_of(FULL) is meta["annotations"]
    assert owner_refs(FULL) is meta["ownerReferences"]
    assert (name_of(FULL), namespace_of(FULL), uid_of(FULL), resource_version_of(FULL)) == (
        "n", "ns", "u", "7")


def test_the_empty_default_cannot_be_changed_by_a_caller() -> None:
    """One shared empty mapping is handed to every caller: writing to it must fail, or one
    caller's write would show in every other object's labels."""
    with pytest.raises(TypeError):
        labels_of(None)["x"] = "y"  # type: ignore[index]
    assert labels_of({}) == {}


def test_the_pool_kinds_are_those_of_the_five_each_once_services_first() -> None:
    assert set(POOL_KINDS) == {(p.api_version, p.kind) for p in PARTS}
    assert len(POOL_KINDS) == len(set(POOL_KINDS))
    assert POOL_KINDS == (("v1", "Service"), ("apps/v1", "Deployment"), ("v1", "ConfigMap"))
    assert POOL_KIND_NAMES == ("Service", "Deployment", "ConfigMap")


def test_every_watcher_of_the_pool_objects_watches_those_kinds() -> None:
    from metrics.labels import WATCHED_KINDS
    from scheduler.app import WATCHED
    from warmpool.kube import cache
    from warmpool.kube.observe import POOL_SELECTOR, POOL_WATCHES

    assert [(w.api_version, w.kind, w.label_selector) for w in POOL_WATCHES] == [
        (api, kind, POOL_SELECTOR) for api, kind in POOL_KINDS]
    # The scheduler and the workers' caches watch the same: a Service's and a Deployment's
    # metadata alone (all `strip` keeps of them), a ConfigMap whole (its data is read).
    assert set(POOL_WATCHES) <= set(WATCHED)
    assert set(POOL_WATCHES) <= set(cache.WATCHES)
    assert [w.kind for w in POOL_WATCHES if w.metadata_only] == ["Service", "Deployment"]
    assert cache.SERVICES.kind == "Service" and cache.SERVICES.metadata_only
    assert [w.kind for w in WATCHED] == list(WATCHED_KINDS)
