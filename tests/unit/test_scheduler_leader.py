"""`scheduler.leader`: the Lease protocol on an in-memory API with resourceVersion checks."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from scheduler.leader import LeaderConfig, LeaderElector, Record
from tests.waiting import wait_for
from warmpool.kube.api import Conflict


class LeaseStore:
    """get / create / merge_patch of one namespaced kind, with the server's optimistic
    concurrency: a stale resourceVersion precondition or an existing name is a Conflict."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0
        self.lock = threading.Lock()
        self.before_write: Any = None  # hook: called before each write (race injection)
        self.log: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, object) for watches

    def _record(self, etype: str, obj: dict[str, Any]) -> None:
        self.log.append((self.rv, etype, copy.deepcopy(obj)))

    def list(self, api_version: str, kind: str, namespace: str, *,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.objects.values()], str(self.rv)

    def watch(self, api_version: str, kind: str, namespace: str, *, resource_version: str,
              label_selector: str | None = None, timeout_seconds: int = 300) -> Any:
        seen = int(resource_version)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            with self.lock:
                new = [e for e in self.log if e[0] > seen]
            for rv, etype, obj in new:
                seen = rv
                yield {"type": etype, "object": obj}
            time.sleep(0.005)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        with self.lock:
            obj = self.objects.get((namespace, name))
            return copy.deepcopy(obj)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.before_write:
            self.before_write()
        with self.lock:
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            if key in self.objects:
                raise Conflict("AlreadyExists")
            self.rv += 1
            obj = copy.deepcopy(body)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[key] = obj
            self._record("ADDED", obj)
            return copy.deepcopy(obj)

    def merge_patch(self, api_version: str, kind: str, namespace: str, name: str,
                    patch: dict[str, Any], *, resource_version: str | None = None) -> Any:
        if self.before_write:
            self.before_write()
        with self.lock:
            obj = self.objects[(namespace, name)]
            if resource_version is not None and obj["metadata"]["resourceVersion"] != \
                    resource_version:
                raise Conflict("the object has been modified")
            for k, val in patch["spec"].items():
                if val is None:
                    obj["spec"].pop(k, None)
                else:
                    obj["spec"][k] = val
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._record("MODIFIED", obj)
            return copy.deepcopy(obj)

    def spec(self) -> dict[str, Any]:
        (obj,) = self.objects.values()
        return obj["spec"]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(store: LeaseStore, identity: str, clock: Clock | None = None,
            **kw: Any) -> LeaderElector:
    cfg = LeaderConfig(namespace="ns", identity=identity, **kw)
    return LeaderElector(store, cfg, clock=clock or Clock())  # type: ignore[arg-type]


def test_first_candidate_creates_the_lease_and_leads() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, "a", clock)
    assert a.try_acquire_or_renew()
    spec = store.spec()
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0 and spec["acquireTime"] == spec["renewTime"]
    assert spec["renewTime"].endswith("Z") and "." in spec["renewTime"]
    assert store.objects[("ns", "warmpool-scheduler")]["metadata"]["labels"] == {
        "warmpool.io/lease": "warmpool-scheduler"}


def test_a_held_lease_is_taken_only_after_the_duration_on_the_candidates_clock() -> None:
    store, ca, cb = LeaseStore(), Clock(), Clock()
    a, b = elector(store, "a", ca), elector(store, "b", cb)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    cb.t += 14.9
    assert not b.try_acquire_or_renew()  # a has not renewed, but 15 s have not passed yet
    ca.t += 10
    assert a.try_acquire_or_renew()  # a renews: b sees a new record, its timer restarts
    cb.t += 1
    assert not b.try_acquire_or_renew()
    cb.t += 14.9
    assert not b.try_acquire_or_renew()
    cb.t += 0.2
    assert b.try_acquire_or_renew()
    spec = store.spec()
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, "a", clock)
    a.try_acquire_or_renew()
    first = dict(store.spec())
    a.try_acquire_or_renew()
    spec = store.spec()
    assert spec["acquireTime"] == first["acquireTime"]
    assert spec["leaseTransitions"] == first["leaseTransitions"]


def test_is_leader_ends_at_the_renew_deadline_by_itself() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, "a", clock)
    assert not a.is_leader()
    a.try_acquire_or_renew()
    a._leading = True  # what run() does after a successful acquire
    assert a.is_leader()
    clock.t += 9.9
    assert a.is_leader()
    clock.t += 0.2
    assert not a.is_leader()


def test_release_lets_a_standby_take_over_at_once() -> None:
    store = LeaseStore()
    a, b = elector(store, "a"), elector(store, "b")
    a.try_acquire_or_renew()
    a._leading = True
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert not a.is_leader()
    spec = store.spec()
    assert "holderIdentity" not in spec and spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert b.try_acquire_or_renew()  # no waiting for the lease duration
    assert store.spec()["holderIdentity"] == "b" and store.spec()["leaseTransitions"] == 1
    assert not a.release()  # not the holder any more: leaves it alone


def test_two_candidates_racing_for_a_free_lease_give_one_winner() -> None:
    store = LeaseStore()
    store.create({"metadata": {"name": "warmpool-scheduler", "namespace": "ns"}, "spec": {}})
    a, b = elector(store, "a"), elector(store, "b")
    # Both read the same resourceVersion before either writes.
    inner = store.before_write
    b_result: list[bool] = []

    def b_goes_first() -> None:
        store.before_write = inner
        b_result.append(b.try_acquire_or_renew())

    store.before_write = b_goes_first
    assert not a.try_acquire_or_renew()
    assert b_result == [True]
    assert store.spec()["holderIdentity"] == "b"


def test_two_candidates_racing_to_create_give_one_winner() -> None:
    store = LeaseStore()
    a, b = elector(store, "a"), elector(store, "b")
    inner = store.before_write

    def b_creates_first() -> None:
        store.before_write = inner
        assert b.try_acquire_or_renew()

    store.before_write = b_creates_first
    assert not a.try_acquire_or_renew()
    assert store.spec()["holderIdentity"] == "b"


def test_record_of_an_empty_lease() -> None:
    assert Record.of({"spec": {}}) == Record("", 0, None, None, 0)


@pytest.mark.parametrize("kw", [dict(lease_duration=10, renew_deadline=10),
                                dict(renew_deadline=2, retry_period=2),
                                dict(lease_duration=0.4, renew_deadline=0.3,
                                     retry_period=0.1)])
def test_config_is_validated(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LeaderConfig(namespace="ns", **kw)


def test_run_loop_hands_over_on_stop_and_on_lost_renewals() -> None:
    store = LeaseStore()
    fast = dict(lease_duration=3, renew_deadline=1.0, retry_period=0.1)
    log: list[str] = []
    a = LeaderElector(store, LeaderConfig(namespace="ns", identity="a", **fast),  # type: ignore
                      on_started=lambda: log.append("a+"), on_stopped=lambda: log.append("a-"))
    b = LeaderElector(store, LeaderConfig(namespace="ns", identity="b", **fast),  # type: ignore
                      on_started=lambda: log.append("b+"), on_stopped=lambda: log.append("b-"))
    stop_a, stop_b = threading.Event(), threading.Event()
    ta = threading.Thread(target=a.run, args=(stop_a,))
    ta.start()
    wait_for(a.is_leader, timeout=5)
    tb = threading.Thread(target=b.run, args=(stop_b,))
    tb.start()
    wait_for(lambda: b.observed_holder() == "a", timeout=5)
    assert not b.is_leader()
    # Stop a: it releases, b takes over on its next retry, long before the lease duration.
    stop_a.set()
    ta.join(5)
    wait_for(b.is_leader, timeout=1.0, interval=0.02)
    assert log[:3] == ["a+", "a-", "b+"]

    # b's renewals start failing: it gives up leadership by itself after the renew deadline.
    def fail() -> None:
        raise ConnectionError("apiserver unreachable")

    store.before_write = fail
    wait_for(lambda: not b.is_leader(), timeout=3, interval=0.02)
    wait_for(lambda: log[-1] == "b-", timeout=3)
    store.before_write = None
    wait_for(b.is_leader, timeout=5)  # and it leads again once it can renew
    stop_b.set()
    tb.join(5)
    assert "holderIdentity" not in store.spec()


@pytest.mark.parametrize("watch", [True, False])
def test_a_watching_candidate_takes_a_released_lease_without_waiting_a_retry_period(
    watch: bool,
) -> None:
    store = LeaseStore()
    slow = dict(lease_duration=30, renew_deadline=20, retry_period=1.0, watch=watch)
    a = LeaderElector(store, LeaderConfig(namespace="ns", identity="a", **slow))  # type: ignore
    b = LeaderElector(store, LeaderConfig(namespace="ns", identity="b", **slow))  # type: ignore
    stop_a, stop_b = threading.Event(), threading.Event()
    ta = threading.Thread(target=a.run, args=(stop_a,))
    tb = threading.Thread(target=b.run, args=(stop_b,))
    ta.start()
    wait_for(a.is_leader, timeout=5)
    tb.start()
    wait_for(lambda: b.observed_holder() == "a", timeout=5)
    time.sleep(0.3)  # let b's watch start
    t0 = time.monotonic()
    stop_a.set()
    ta.join(5)
    wait_for(b.is_leader, timeout=5, interval=0.01)
    took = time.monotonic() - t0
    stop_b.set()
    tb.join(5)
    if watch:
        assert took < 0.5, took  # woken by the watch, not by its next retry (1 to 1.2 s)
    else:
        assert took < 2.0, took  # its next retry


def test_a_candidate_retries_right_when_a_dead_holders_lease_runs_out() -> None:
    store = LeaseStore()
    cfg = dict(lease_duration=3, renew_deadline=2, retry_period=1.0)
    dead = LeaderElector(store, LeaderConfig(namespace="ns", identity="dead", **cfg))  # type: ignore
    assert dead.try_acquire_or_renew()  # ... and then never renews again (SIGKILL)
    t0 = time.monotonic()
    b = LeaderElector(store, LeaderConfig(namespace="ns", identity="b", **cfg))  # type: ignore
    stop = threading.Event()
    t = threading.Thread(target=b.run, args=(stop,))
    t.start()
    try:
        wait_for(b.is_leader, timeout=10, interval=0.01)
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(5)
    # 3 s after b first saw the record; not up to a retry period (1-1.2 s) later.
    assert 3.0 <= took < 3.6, took
