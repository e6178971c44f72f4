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
        self.lists = 0  # a Lease watch lists once when it starts

    def _record(self, etype: str, obj: dict[str, Any]) -> None:
        self.log.append((self.rv, etype, copy.deepcopy(obj)))

    def list(self, api_version: str, kind: str, namespace: str, *,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        with self.lock:
            self.lists += 1
            return [copy.deepcopy(o) for o in self.objects.values()], str(self.rv)

    def watch(self, api_version: str, kind: str, namespace: str, *, resource_version: str,
              label_selector: str | None = None, timeout_seconds: int = 300) -> Any:
        seen = int(resource_version)
        end = time.monotonic() + 0.5  # a watch ends now and then, as a server's does
        while time.monotonic() < end:
            with self.lock:
                new = [e for e in self.log if e[0] > seen]
            for rv, etype, obj in new:
                seen = rv
                yield {"type": etype, "object": obj}
            time.sleep(0.005)  # stimulus: the fake server's poll of its event log

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
    """A fake monotonic clock: it stands still until the test moves it (`advance`), so an
    elector waiting on it retries only when the test says time has passed."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class SteppingClock(Clock):
    """A fake clock that the elector's own pauses move on (its `wait`): each wait returns at
    once, the clock that much later. With one elector looping, the times at which it acts
    are exact, whatever the machine's load."""

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        self.t += seconds
        return event.wait(0.001)  # yield the CPU to the test's thread, a millisecond


def advance_until(clock: Clock, condition: Any, step: float, timeout: float = 10) -> None:
    """Move `clock` on by `step` per poll until `condition()` holds (real timeout: a bug)."""
    def moved() -> bool:
        if condition():
            return True
        clock.advance(step)
        return False
    wait_for(moved, timeout=timeout, interval=0.02)


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
    store, clock = LeaseStore(), Clock()
    fast = dict(lease_duration=3, renew_deadline=1.0, retry_period=0.1)
    log: list[tuple[str, float]] = []

    def make(name: str) -> LeaderElector:
        return LeaderElector(
            store, LeaderConfig(namespace="ns", identity=name, **fast),  # type: ignore
            on_started=lambda: log.append((f"{name}+", clock.t)),
            on_stopped=lambda: log.append((f"{name}-", clock.t)), clock=clock)

    a, b = make("a"), make("b")
    stop_a, stop_b = threading.Event(), threading.Event()
    ta = threading.Thread(target=a.run, args=(stop_a,), daemon=True)
    ta.start()
    wait_for(a.is_leader, timeout=5)
    tb = threading.Thread(target=b.run, args=(stop_b,), daemon=True)
    tb.start()
    wait_for(lambda: b.observed_holder() == "a" and store.lists == 2, timeout=5,
             message="b a candidate, both Lease watches started")
    assert not b.is_leader()
    # Stop a: it releases, and b takes over on the watch's news while the clock stands still
    # (long before the lease duration: no time passed at all).
    released_at = clock.t
    stop_a.set()
    ta.join(5)
    wait_for(b.is_leader, timeout=5)
    assert [e for e, _ in log] == ["a+", "a-", "b+"]
    assert log[-1][1] == released_at

    # b's renewals start failing: it gives up leadership by itself after the renew deadline,
    # on its own clock, long before its lease (3 s) would let anyone else take over.
    def fail() -> None:
        raise ConnectionError("apiserver unreachable")

    store.before_write = fail
    clock.advance(0.9)
    assert b.is_leader()  # within the renew deadline, renewals failing or not
    advance_until(clock, lambda: log[-1][0] == "b-", step=0.05)
    gave_up = log[-1][1] - released_at
    assert 1.0 <= gave_up < 3.0, gave_up
    store.before_write = None
    advance_until(clock, b.is_leader, step=0.05)  # and it leads again once it can renew
    stop_b.set()
    tb.join(5)
    assert "holderIdentity" not in store.spec()


@pytest.mark.parametrize("watch", [True, False])
def test_a_watching_candidate_takes_a_released_lease_without_waiting_a_retry_period(
    watch: bool,
) -> None:
    store, clock = LeaseStore(), Clock()
    slow = dict(lease_duration=30, renew_deadline=20, retry_period=1.0, watch=watch)
    taken_at: list[float] = []
    a = LeaderElector(store, LeaderConfig(namespace="ns", identity="a", **slow),  # type: ignore
                      clock=clock)
    b = LeaderElector(store, LeaderConfig(namespace="ns", identity="b", **slow),  # type: ignore
                      clock=clock, on_started=lambda: taken_at.append(clock.t))
    stop_a, stop_b = threading.Event(), threading.Event()
    ta = threading.Thread(target=a.run, args=(stop_a,), daemon=True)
    tb = threading.Thread(target=b.run, args=(stop_b,), daemon=True)
    ta.start()
    wait_for(a.is_leader, timeout=5)
    tb.start()
    wait_for(lambda: b.observed_holder() == "a" and store.lists == (2 if watch else 0),
             timeout=5, message="b a candidate, its Lease watch started")
    released_at = clock.t
    stop_a.set()
    ta.join(5)
    # a released it (a write with no holder); a watching b may already hold it again by now
    assert any(e[2]["spec"].get("holderIdentity") is None for e in store.log[1:]), store.log
    if watch:
        # The clock stands still, so b's next retry never comes: only its watch can wake it.
        wait_for(b.is_leader, timeout=5)
        assert clock.t == released_at
    else:
        advance_until(clock, b.is_leader, step=0.02)
        took = taken_at[0] - released_at
        # its next retry: a retry period (x 1 to 1.2) after the last, on the fake clock (the
        # bound leaves the stepping room for a slow thread, as the wall-clock one did)
        assert 1.0 <= took < 2.0, took
    stop_b.set()
    tb.join(5)


def test_a_candidate_retries_right_when_a_dead_holders_lease_runs_out() -> None:
    store, clock = LeaseStore(), SteppingClock()
    cfg = dict(lease_duration=3, renew_deadline=2, retry_period=1.0)
    dead = LeaderElector(store, LeaderConfig(namespace="ns", identity="dead", **cfg),  # type: ignore
                         clock=clock)
    assert dead.try_acquire_or_renew()  # ... and then never renews again (SIGKILL)
    t0 = clock.t  # b first sees the record now (its first attempt, before any pause)
    writes: list[float] = []
    store.before_write = lambda: writes.append(clock.t)
    b = LeaderElector(store, LeaderConfig(namespace="ns", identity="b", **cfg),  # type: ignore
                      clock=clock, wait=clock.wait)
    stop = threading.Event()
    t = threading.Thread(target=b.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(lambda: store.spec().get("holderIdentity") == "b", timeout=10)
    finally:
        stop.set()
        t.join(5)
    # Its first write, the take-over: 3 s after b first saw the record, plus the 0.05 s it
    # adds; not at one of its retries (every 1 to 1.2 s), up to a retry period later.
    assert writes[0] - t0 == pytest.approx(3.05), writes[0] - t0


def test_a_renewal_that_ends_after_the_deadline_is_a_new_term() -> None:
    """One renewal so slow that `is_leader()` turned false while it was in flight (the
    scheduler dropped what it offered then as a standby's), then succeeds: the elector ends
    that term and starts a new one (`on_started`: the scheduler resyncs), instead of carrying
    on as if nothing had been missed. Before the fix it just went on leading."""
    store, clock = LeaseStore(), Clock()
    log: list[str] = []
    e = LeaderElector(
        store, LeaderConfig(namespace="ns", identity="a", lease_duration=3,  # type: ignore
                            renew_deadline=1.0, retry_period=0.3),
        on_started=lambda: log.append("+"), on_stopped=lambda: log.append("-"), clock=clock)
    stop = threading.Event()
    t = threading.Thread(target=e.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(e.is_leader, timeout=5)
        assert log == ["+"]
        slow: list[bool] = []

        def slow_once() -> None:
            if not slow:
                slow.append(e.is_leader())  # leader when the renewal starts
                clock.advance(1.2)  # the write takes longer than the renew deadline
                slow.append(e.is_leader())  # and no longer leader while it is in flight

        store.before_write = slow_once
        advance_until(clock, lambda: len(slow) == 2, step=0.05)
        assert slow == [True, False]
        # That renewal started too long ago to count; the next one makes it lead again, as
        # a new term.
        advance_until(clock, lambda: len(log) >= 3, step=0.05)
        assert log == ["+", "-", "+"]
        assert e.is_leader()
        advance_until(clock, lambda: clock.t > 1010, step=0.1)  # and later renewals are not
        assert log == ["+", "-", "+"]
    finally:
        stop.set()
        t.join(5)
