"""`warmpool.kube.reflector`: list/watch/resume/relist against a scripted API, and the backoff."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import pytest

from scheduler.mapping import summarize
from tests.waiting import wait_for
from warmpool.kube.api import Gone
from warmpool.kube.reflector import Backoff, Reflector, Watched, is_gone

NS = "ns1"


def cm(name: str, rv: int, data: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(rv),
                         "ownerReferences": [{"apiVersion": "theia.cloud/v1beta11",
                                              "kind": "AppDefinition", "name": "java",
                                              "uid": "u"}]},
            "data": {"x": data}}


def ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: int) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "ConfigMap",
                                           "metadata": {"resourceVersion": str(rv)}}}


class ApiError410(Exception):
    """What the client's Watch raises on an ERROR event when a timeout is set."""

    status = 410


class ScriptedKube:
    """`list` answers from `lists`; each `watch` plays the next script (a list of events, or an
    exception to raise, or events then an exception); an empty script ends the watch."""

    def __init__(self) -> None:
        self.lists: deque[tuple[list[dict[str, Any]], str]] = deque()
        self.watches: deque[list[Any]] = deque()
        self.watch_rvs: list[str] = []
        self.list_calls = 0
        self.timeouts: list[int] = []
        self.metadata_only: list[tuple[str, bool]] = []  # (list|watch, asked metadata only)

    def list_pages(self, api_version: str, kind: str, namespace: str | None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   page_size: int = 500, metadata_only: bool = False) -> Any:
        self.list_calls += 1
        self.metadata_only.append(("list", metadata_only))
        items, rv = self.lists.popleft()
        for start in range(0, max(1, len(items)), page_size):
            yield [dict(i) for i in items[start:start + page_size]], rv

    def watch(self, api_version: str, kind: str, namespace: str | None, *,
              resource_version: str, label_selector: str | None = None,
              field_selector: str | None = None, timeout_seconds: int = 300,
              metadata_only: bool = False) -> Any:
        self.metadata_only.append(("watch", metadata_only))
        self.watch_rvs.append(resource_version)
        self.timeouts.append(timeout_seconds)
        script = self.watches.popleft() if self.watches else []
        if not script:
            time.sleep(0.01)  # stimulus: an empty watch lasts a moment, as a quiet server's
        for step in script:
            if isinstance(step, BaseException):
                raise step
            yield step


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any] | None]] = []
        self.lock = threading.Lock()

    def __call__(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        with self.lock:
            self.events.append((etype, obj["metadata"]["name"], old))

    def names(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(e, n) for e, n, _ in self.events]


@pytest.fixture
def run_reflector():
    started: list[tuple[Reflector, threading.Event]] = []

    def start(kube: ScriptedKube, handler: Recorder, **kw: Any) -> Reflector:
        r = Reflector(kube, Watched("ConfigMap", "v1", "sel"), NS, handler,  # type: ignore[arg-type]
                      summarize=summarize,
                      backoff=Backoff(initial=0.01, cap=0.02), **kw)
        stop = threading.Event()
        r.start(stop)
        started.append((r, stop))
        return r

    yield start
    for r, stop in started:
        stop.set()
        r.resume()
        r.join(5)
        assert not r.alive()


def test_first_list_is_silent_then_watch_events_are_reported_and_resumed(run_reflector) -> None:
    kube = ScriptedKube()
    kube.lists.append(([cm("a", 5), cm("b", 6)], "10"))
    kube.watches.append([ev("ADDED", cm("c", 11)), ev("MODIFIED", cm("a", 12, "new")),
                         bookmark(14)])
    kube.watches.append([ev("DELETED", cm("b", 15))])
    rec = Recorder()
    r = run_reflector(kube, rec, timeout_range=(300, 600))
    wait_for(lambda: len(rec.events) == 3, timeout=5)
    assert rec.names() == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    # MODIFIED carries the cached stub of the previous version; DELETED the last stub.
    assert rec.events[1][2]["metadata"]["resourceVersion"] == "5"
    assert rec.events[2][2]["metadata"]["resourceVersion"] == "6"
    assert kube.watch_rvs[:3] == ["10", "14", "15"]
    assert kube.list_calls == 1
    assert all(300 <= t <= 600 for t in kube.timeouts)
    assert sorted(n for _, n in r.cache) == ["a", "c"]
    assert r.synced.is_set()


@pytest.mark.parametrize("gone", [Gone("too old"), ApiError410("Expired")])
def test_410_relists_and_reports_what_changed_and_what_vanished(run_reflector, gone) -> None:
    kube = ScriptedKube()
    kube.lists.append(([cm("keep", 5), cm("change", 6), cm("vanish", 7), cm("status", 8)], "10"))
    kube.watches.append([gone])
    changed_obj = cm("change", 20, "new data")
    kube.lists.append(([cm("keep", 5), changed_obj, cm("new", 21), cm("status", 22)], "30"))
    rec = Recorder()
    r = run_reflector(kube, rec)
    wait_for(lambda: r.stats.relists_after_gone == 1 and kube.list_calls == 2, timeout=5)
    wait_for(lambda: len(rec.events) >= 4, timeout=5)
    got = sorted(rec.names())
    assert got == [("ADDED", "new"), ("DELETED", "vanish"), ("MODIFIED", "change"),
                   ("MODIFIED", "status")]
    deleted = next(e for e in rec.events if e[0] == "DELETED")
    assert deleted[2]["metadata"]["resourceVersion"] == "7"  # the stub it kept
    wait_for(lambda: "30" in kube.watch_rvs, timeout=5)
    assert sorted(n for _, n in r.cache) == ["change", "keep", "new", "status"]


def test_other_errors_back_off_and_resume_without_relisting(run_reflector) -> None:
    kube = ScriptedKube()
    kube.lists.append(([cm("a", 5)], "10"))
    kube.watches.append([ev("MODIFIED", cm("a", 11, "x")), ConnectionResetError("dropped")])
    kube.watches.append([RuntimeError("500 from the server")])
    kube.watches.append([ev("MODIFIED", cm("a", 12, "y"))])
    rec = Recorder()
    r = run_reflector(kube, rec)
    wait_for(lambda: len(rec.events) == 2, timeout=5)
    assert kube.list_calls == 1
    assert kube.watch_rvs[:3] == ["10", "11", "11"]
    assert r.stats.errors == 2 and "500" in (r.stats.last_error or "")


def test_list_errors_are_retried(run_reflector) -> None:
    class FailingOnce(ScriptedKube):
        def list_pages(self, *a: Any, **kw: Any) -> Any:
            if self.list_calls == 0:
                self.list_calls += 1
                raise ConnectionRefusedError("apiserver down")
            return super().list_pages(*a, **kw)

    kube = FailingOnce()
    kube.lists.append(([cm("a", 5)], "10"))
    r = run_reflector(kube, Recorder())
    wait_for(r.synced.is_set, timeout=5)
    assert r.stats.errors == 1


def test_repeated_and_out_of_order_events(run_reflector) -> None:
    kube = ScriptedKube()
    kube.lists.append(([cm("a", 5)], "10"))
    kube.watches.append([ev("MODIFIED", cm("a", 5)),  # the listed version again: no change
                         ev("ADDED", cm("a", 11, "z")),  # known object: reported MODIFIED
                         ev("DELETED", cm("ghost", 12))])  # never seen: old is None
    rec = Recorder()
    run_reflector(kube, rec)
    wait_for(lambda: len(rec.events) == 2, timeout=5)
    assert rec.names() == [("MODIFIED", "a"), ("DELETED", "ghost")]
    assert rec.events[1][2] is None


def test_handler_errors_do_not_stop_the_watch(run_reflector) -> None:
    calls: list[str] = []

    def handler(etype: str, obj: dict[str, Any], old: Any) -> None:
        calls.append(obj["metadata"]["name"])
        raise ValueError("bug")

    kube = ScriptedKube()
    kube.lists.append(([], "10"))
    kube.watches.append([ev("ADDED", cm("a", 11)), ev("ADDED", cm("b", 12))])
    run_reflector(kube, handler)
    wait_for(lambda: calls == ["a", "b"], timeout=5)


class CountingEvent(threading.Event):
    """An Event that counts the waits on it: how often a parked loop has looked."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_hold_parks_between_watches_and_resume_continues(run_reflector) -> None:
    kube = ScriptedKube()
    kube.lists.append(([], "10"))
    r = run_reflector(kube, Recorder())
    wait_for(r.synced.is_set, timeout=5)
    go = r._go = CountingEvent()  # the loop's go-ahead, read afresh before each watch
    go.set()
    assert r.hold(wait=5)
    n, checked = len(kube.watch_rvs), go.waits
    # Parked: the loop asks for the go-ahead again and again, and opens no watch meanwhile
    # (its empty scripted watches would otherwise follow each other every 10 ms).
    wait_for(lambda: go.waits >= checked + 2, timeout=5, message="the parked loop checking")
    assert len(kube.watch_rvs) == n
    r.resume()
    wait_for(lambda: len(kube.watch_rvs) > n, timeout=5)


def test_backoff_doubles_to_the_cap_with_jitter_and_resets() -> None:
    now = [0.0]
    b = Backoff(rand=lambda: 0.0, clock=lambda: now[0])
    delays = [b.next() for _ in range(8)]
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0])
    now[0] += 121  # two minutes without a failure
    assert b.next() == pytest.approx(0.8)
    full = Backoff(rand=lambda: 1.0, clock=lambda: 0.0)
    assert [full.next() for _ in range(3)] == pytest.approx([1.6, 3.2, 6.4])
    b.reset()
    assert b.next() == pytest.approx(0.8)


def test_is_gone() -> None:
    assert is_gone(Gone("x")) and is_gone(ApiError410())
    assert not is_gone(RuntimeError()) and not is_gone(Exception())


def test_repeated_watch_failures_without_progress_relist(run_reflector) -> None:
    kube = ScriptedKube()
    kube.lists.append(([cm("a", 5)], "10"))
    kube.watches.extend([[RuntimeError("504 too large resource version")]] * 3)
    kube.lists.append(([cm("a", 6, "changed")], "20"))
    rec = Recorder()
    r = run_reflector(kube, rec)
    wait_for(lambda: kube.list_calls == 2, timeout=5)
    wait_for(lambda: rec.names() == [("MODIFIED", "a")], timeout=5)
    assert kube.watch_rvs[:3] == ["10", "10", "10"]
    wait_for(lambda: "20" in kube.watch_rvs, timeout=5)
    assert r.stats.relists_after_gone == 0


def test_a_watch_open_long_past_its_timeout_is_stuck(run_reflector) -> None:
    release = threading.Event()

    class Hanging(ScriptedKube):
        def watch(self, *a: Any, **kw: Any) -> Any:
            self.watch_rvs.append(kw["resource_version"])
            release.wait(10)  # a half-open connection: no data, no end
            yield from ()

    kube = Hanging()
    kube.lists.append(([], "10"))
    r = run_reflector(kube, Recorder(), timeout_range=(1, 1), stuck_grace=0.2)
    wait_for(lambda: kube.watch_rvs, timeout=5)
    assert not r.stuck()
    wait_for(r.stuck, timeout=5)
    release.set()
    wait_for(lambda: not r.stuck(), timeout=5)


def test_a_watch_cut_after_it_brought_events_retries_at_the_first_backoff_step(
    run_reflector,
) -> None:
    """A link that cuts every watch a moment after it delivered: each cut is retried after
    the backoff's first step, not after a delay doubled by the earlier cuts (which would
    leave the cache deaf for up to the 30 s cap once the link is healthy again); and no
    relist, since the watches worked."""
    kube = ScriptedKube()
    kube.lists.append(([cm("a", 5)], "10"))
    for rv in range(11, 16):
        kube.watches.append([ev("MODIFIED", cm("a", rv, str(rv))), ConnectionResetError("cut")])
    rec = Recorder()
    r = run_reflector(kube, rec)
    wait_for(lambda: len(rec.events) == 5, timeout=5)
    wait_for(lambda: r.stats.errors == 5, timeout=5)
    assert r.backoff._delay == r.backoff.initial
    assert kube.list_calls == 1


def test_watches_failing_at_once_back_off_exponentially(run_reflector) -> None:
    kube = ScriptedKube()
    kube.lists.append(([cm("a", 5)], "10"))
    kube.watches.extend([[RuntimeError("500")]] * 2)
    rec = Recorder()
    r = run_reflector(kube, rec)
    wait_for(lambda: r.stats.errors == 2, timeout=5)
    assert r.backoff._delay > r.backoff.initial


def _partial(name: str, rv: int) -> dict[str, Any]:
    """A ReplicaSet as a metadata-only list or watch sends it."""
    return {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(rv)}}


def test_a_metadata_only_watch_asks_for_metadata_and_keeps_the_watched_kind() -> None:
    kube = ScriptedKube()
    kube.lists.append(([_partial("a", 5)], "10"))
    kube.watches.append([ev("ADDED", _partial("b", 11))])
    rec = Recorder()
    kept: list[tuple[str, str]] = []

    def keep(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        kept.append((obj["kind"], obj["apiVersion"]))
        return obj

    r = Reflector(kube, Watched("ReplicaSet", "apps/v1", "sel", metadata_only=True),  # type: ignore[arg-type]
                  NS, rec, summarize=keep, backoff=Backoff(initial=0.01, cap=0.02),
                  report_first_list=True)
    stop = threading.Event()
    r.start(stop)
    try:
        wait_for(lambda: len(rec.events) == 2, timeout=5)
    finally:
        stop.set()
        r.join(5)
    assert kube.metadata_only[:2] == [("list", True), ("watch", True)]
    assert kept == [("ReplicaSet", "apps/v1")] * 2
    assert r.get(NS, "b")["kind"] == "ReplicaSet"  # type: ignore[index]
