"""`scheduler.app.Scheduler` on a static fake API: resyncs, leader gating, producer errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import pytest

from scheduler.app import Scheduler, SchedulerConfig
from tests.producers import Recorder
from tests.waiting import wait_for
from warmpool.pool import vocabulary as v

NS = "ns1"


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "resourceVersion": "1", "uid": f"u-{name}", **extra}


OBJECTS: dict[str, list[dict[str, Any]]] = {
    "AppDefinition": [{"metadata": meta("java", generation=1)}],
    "Session": [{"metadata": meta("s1"), "spec": {"appDefinition": "python"}},
                {"metadata": meta("s2"), "spec": {}}],
    "Service": [{"metadata": meta("instance-1-x-abc", ownerReferences=[
        {"apiVersion": v.APPDEF_API_VERSION, "kind": "AppDefinition", "name": "orphaned",
         "uid": "u"}])}],
    "Deployment": [],
    "ConfigMap": [],
    "PoolSchedule": [],
}


class StaticKube:
    """Lists the same objects forever; watches deliver what is pushed into `events`."""

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {k: [] for k in OBJECTS}
        self.lock = threading.Lock()

    def list_pages(self, api_version: str, kind: str, namespace: str | None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   page_size: int = 500, metadata_only: bool = False) -> Any:
        yield [dict(o) for o in OBJECTS[kind]], "1"

    def watch(self, api_version: str, kind: str, namespace: str | None, *,
              resource_version: str, label_selector: str | None = None,
              field_selector: str | None = None, timeout_seconds: int = 300,
              metadata_only: bool = False) -> Any:
        time.sleep(0.02)  # stimulus: each fake watch lasts a moment, as a quiet server's
        with self.lock:
            pending, self.events[kind] = self.events[kind], []
        yield from pending


class FakeElector:
    def __init__(self, leading: bool = False) -> None:
        self.leading = leading
        self.identity = "fake"
        self.last_error = None

    def is_leader(self) -> bool:
        return self.leading

    def observed_holder(self) -> str:
        return "fake" if self.leading else "other"

    def run(self, stop: threading.Event) -> None:
        stop.wait()

    def release(self) -> bool:
        self.leading = False
        return True


class FlakyProducer:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.added: list[str] = []

    def add_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("redis down")
        self.added.extend(k if isinstance(k, str) else k[0] for k in keys)


@pytest.fixture
def make():
    made: list[Scheduler] = []

    def build(producer: Any, **cfg: Any) -> tuple[Scheduler, StaticKube]:
        kube = StaticKube()
        s = Scheduler(lambda: kube, producer, SchedulerConfig(namespaces=[NS], **cfg))  # type: ignore[arg-type]
        made.append(s)
        return s, kube

    yield build
    for s in made:
        s.stop(timeout=5)


def test_startup_resync_names_every_known_appdefinition(make) -> None:
    rec = Recorder()
    s, _ = make(rec)
    s.start()
    wait_for(lambda: rec.added, timeout=5)
    assert rec.added == ["pool/ns1/java", "pool/ns1/orphaned", "pool/ns1/python"]
    assert s.ready() and s.healthy() and s.stats.last_resync_reason == "startup"


def test_a_resync_key_waits_for_a_cache_as_new_as_the_schedulers_view(make) -> None:
    """A resync's keys carry, per kind, the newest version this scheduler holds in their
    namespace ("<Kind>/*"), with the queue's "run in full" mark: a worker whose watches are
    behind runs them only once it has caught up (ClusterCache.fresh), so a Session the
    scheduler knows is never concluded away on a lagging cache."""
    producer = FlakyProducer(failures=0)
    s, _ = make(producer)
    s.start()
    wait_for(lambda: producer.added, timeout=5)
    with s._lock:
        s._pending.clear()
    sent: list[Any] = []
    s.producer = type("P", (), {"add_many": lambda _self, keys: sent.extend(keys)})()
    s.resync("test")
    wait_for(lambda: len(sent) == 3, timeout=5)
    for item in sent:
        assert isinstance(item, tuple)
        _, triggers = item
        assert triggers == {"AppDefinition/*": "1", "Session/*": "1", "Service/*": "1",
                            "*": "1"}
    assert s.seen_versions("elsewhere") == {}


def test_events_are_mapped_and_added(make) -> None:
    rec = Recorder()
    s, kube = make(rec)
    s.start()
    wait_for(lambda: len(rec.added) == 3, timeout=5)
    with kube.lock:
        kube.events["Session"].append({"type": "ADDED", "object": {
            "metadata": meta("s3", resourceVersion="5"), "spec": {"appDefinition": "java"}}})
    wait_for(lambda: "session/ns1/s3" in rec.added, timeout=5)


def test_a_status_write_maps_to_nothing_and_each_event_is_hashed_once(make, monkeypatch) -> None:
    """A Deployment's status write (the deployment controller's, many per instance change)
    adds no key; a change of its spec adds its instance's. Each event's object is hashed
    once, when its reflector keeps the stub: the comparison reads that stub's digest."""
    from scheduler import mapping

    hashed: list[str] = []
    real = mapping.digest

    def counted(obj: Any) -> str:
        hashed.append(str(obj.get("metadata", {}).get("resourceVersion")))
        return real(obj)

    monkeypatch.setattr(mapping, "digest", counted)
    rec = Recorder()
    s, kube = make(rec)
    s.start()
    wait_for(lambda: len(rec.added) == 3, timeout=5)
    owner = [{"apiVersion": v.APPDEF_API_VERSION, "kind": "AppDefinition", "name": "java",
              "uid": "u-java"}]

    def deployment(k: int, rv: str, image: str, ready: int) -> dict[str, Any]:
        return {"metadata": meta(f"instance-{k}-java-x", resourceVersion=rv,
                                 ownerReferences=owner),
                "spec": {"template": {"spec": {"containers": [{"image": image}]}}},
                "status": {"readyReplicas": ready}}

    with kube.lock:
        kube.events["Deployment"] += [{"type": "ADDED", "object": deployment(2, "7", "a", 0)},
                                      {"type": "ADDED", "object": deployment(3, "8", "a", 0)}]
    wait_for(lambda: "instance/ns1/java/3" in rec.added, timeout=5)
    hashed.clear()
    mark = rec.mark()
    with kube.lock:  # in one watch, in order: a status write of 2, a spec change of 3
        kube.events["Deployment"] += [
            {"type": "MODIFIED", "object": deployment(2, "9", "a", 1)},
            {"type": "MODIFIED", "object": deployment(3, "10", "b", 0)}]
    wait_for(lambda: rec.since(mark), timeout=5)
    assert rec.since(mark) == ["instance/ns1/java/3"]
    assert hashed == ["9", "10"]


def test_periodic_resync(make) -> None:
    rec = Recorder()
    s, _ = make(rec, resync_period=0.3)
    s.start()
    wait_for(lambda: s.stats.resyncs >= 3, timeout=5)
    assert s.stats.last_resync_reason == "periodic"


def test_standby_adds_nothing_and_resyncs_when_it_takes_over(make) -> None:
    rec = Recorder()
    s, kube = make(rec)
    s.elector = FakeElector(leading=False)  # type: ignore[assignment]
    s.start()
    wait_for(s.ready, timeout=5)
    with kube.lock:
        kube.events["Session"].append({"type": "ADDED", "object": {
            "metadata": meta("s3", resourceVersion="5"), "spec": {"appDefinition": "java"}}})
    # Dropped, not added: the drop is counted where the add would have been made.
    wait_for(lambda: s.stats.dropped_not_leader >= 1, timeout=5)
    assert rec.added == []
    s.elector.leading = True  # type: ignore[attr-defined]
    s._started_leading()
    wait_for(lambda: rec.added, timeout=5)
    assert rec.added == ["pool/ns1/java", "pool/ns1/orphaned", "pool/ns1/python"]
    assert s.stats.last_resync_reason == "new leader"


def test_losing_the_lease_drops_pending_keys_at_once(make) -> None:
    gate, entered = threading.Event(), threading.Event()

    class Slow(Recorder):
        def add_many(self, keys: Iterable[str]) -> Any:
            entered.set()
            gate.wait(5)
            return super().add_many(keys)

    rec = Slow()
    s, _ = make(rec)
    elector = FakeElector(leading=True)
    s.elector = elector  # type: ignore[assignment]
    s.start()
    wait_for(entered.is_set, timeout=5, message="the resync's add under way")
    s.offer([])  # nothing
    from warmpool.keys import SessionKey
    s.offer([SessionKey(NS, "late")])  # waits behind the slow add
    dropped = s.stats.dropped_not_leader
    elector.leading = False
    s._stopped_leading()
    # Dropped at once, not sent later: nothing is pending any more, so nothing can add it.
    assert s.stats.dropped_not_leader == dropped + 1 and not s._pending
    gate.set()
    wait_for(lambda: rec.added, timeout=5)
    assert "session/ns1/late" not in rec.added


def test_producer_errors_are_retried_without_losing_keys(make) -> None:
    producer = FlakyProducer(failures=2)
    s, _ = make(producer)
    s.start()
    wait_for(lambda: producer.added, timeout=10)
    assert producer.added == ["pool/ns1/java", "pool/ns1/orphaned", "pool/ns1/python"]
    assert s.stats.enqueue_errors == 2


def test_status_reports_watches(make) -> None:
    s, _ = make(Recorder())
    s.start()
    wait_for(s.ready, timeout=5)
    st = s.status()
    assert st["ready"] and st["leader"] and set(st["watches"]) == {
        f"{k}@{NS}" for k in OBJECTS}
    s.stop()
    assert not s.healthy()


def test_a_resync_merged_with_a_triggered_add_still_asks_for_a_full_run() -> None:
    """A key pending with an event's version and then added by a resync is sent once, with
    the queue's "run in full" trigger beside the version, so the queue never skips that run
    as own writes."""
    from scheduler.app import UNTRIGGERED, _items
    from scheduler.mapping import merge_triggers
    from warmpool.keys import InstanceKey

    key = InstanceKey("ns1", "java", 1)
    triggers: dict[str, str] = {}
    merge_triggers(triggers, {"Service/ws-1": "5"})
    merge_triggers(triggers, {UNTRIGGERED: ""})
    merge_triggers(triggers, {"Service/ws-1": "7"})
    assert list(_items([(key, triggers)])) == [(str(key), {"Service/ws-1": "7", "*": "1"})]
    assert list(_items([(key, {"Service/ws-1": "7"})])) == [(str(key), {"Service/ws-1": "7"})]
    assert list(_items([(key, {UNTRIGGERED: ""})])) == [str(key)]
