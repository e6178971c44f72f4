"""The per-key protocol, script by script, on fakeredis (real Lua via lupa).

Deliveries are simulated by popping dramatiq's list directly, so each state transition is
driven and observed without worker threads.
"""

from __future__ import annotations

import time
from collections import Counter

import fakeredis
import pytest
import redis
from dramatiq.message import Message

from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.keyed import AddResult
from warmpool.queue.lease import LeaseLost
from warmpool.queue.maintenance import CRASH_ERROR, Maintenance
from warmpool.queue.observer import NullObserver
from warmpool.queue.settings import QueueSettings


def route(key: str) -> str:
    return "job"


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def _rec(self, name: str, *args: object) -> None:
        self.calls.append((name, args))

    def on_add(self, key: str, result: str) -> None:
        self._rec("add", key, result)

    def on_start(self, key: str, queue_seconds: float | None) -> None:
        self._rec("start", key)

    def on_skip(self, key: str, reason: str) -> None:
        self._rec("skip", key, reason)

    def on_done(self, key: str, result: str, work_seconds: float) -> None:
        self._rec("done", key, result)

    def on_retry(self, key: str, delay_seconds: float, failures: int) -> None:
        self._rec("retry", key, delay_seconds, failures)

    def on_dead_letter(self, key: str, error: str) -> None:
        self._rec("dead", key)

    def on_lease_lost(self, key: str) -> None:
        self._rec("lost", key)

    def on_contention(self, key: str, holder: str) -> None:
        self._rec("contention", key)

    def on_recovered(self, key: str, result: str) -> None:
        self._rec("recovered", key, result)

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


@pytest.fixture
def client() -> redis.Redis:
    return fakeredis.FakeRedis()


@pytest.fixture
def settings() -> QueueSettings:
    return QueueSettings(redis_url="redis://unused", max_failures=4, backoff_cap=0.02)


@pytest.fixture
def observer() -> Recorder:
    return Recorder()


@pytest.fixture
def jobs(client: redis.Redis, settings: QueueSettings, observer: Recorder) -> Jobs:
    return Jobs(client, settings, router=route, observer=observer)


def queued_keys(jobs: Jobs) -> list[str]:
    lo = jobs.queue.layout
    rids = jobs.client.lrange(lo.messages_list, 0, -1)
    return [Message.decode(jobs.client.hget(lo.messages, rid)).args[0] for rid in rids]


def deliver(jobs: Jobs) -> JobContext | str | None:
    """Fetch the next message the way dramatiq's consumer does (LPOP) and begin it: from the
    claims queue first, as a worker's priority queue would."""
    lo = jobs.queue.layout
    for queue in lo.queues:
        rid = jobs.client.lpop(lo.messages_list_of(queue))
        if rid is not None:
            break
    else:
        return None
    body = jobs.client.hget(lo.messages_of(queue), rid)
    jobs.client.hdel(lo.messages_of(queue), rid)  # the ack
    msg = Message.decode(body)
    assert msg.options["redis_message_id"] == rid.decode()
    return jobs.begin(msg.args[0], msg.message_id, ("", rid.decode()))


def run_all(jobs: Jobs) -> Counter[str]:
    """Deliver and finish every queued message; count runs per key."""
    runs: Counter[str] = Counter()
    while (ctx := deliver(jobs)) is not None:
        if isinstance(ctx, JobContext):
            runs[ctx.key] += 1
            jobs.finish(ctx)
    return runs


def make_due(jobs: Jobs, key: str) -> None:
    jobs.client.zadd(jobs.queue.layout.delayed, {key: 0}, xx=True)


def expire_lease(jobs: Jobs, key: str) -> None:
    """What the server does when a holder stops renewing: the lease key vanishes."""
    lo = jobs.queue.layout
    jobs.client.delete(lo.lease(key))
    jobs.client.zadd(lo.inflight, {key: 0}, xx=True)


# --- add / dedup -----------------------------------------------------------------------


def test_add_is_stingy_while_waiting(jobs: Jobs) -> None:
    results = [jobs.queue.add("a") for _ in range(5)]
    assert results == [AddResult.ENQUEUED] + [AddResult.DEDUPLICATED] * 4
    assert queued_keys(jobs) == ["a"]
    assert run_all(jobs) == {"a": 1}


def test_message_matches_dramatiq_layout(jobs: Jobs) -> None:
    jobs.queue.add("a")
    lo = jobs.queue.layout
    (rid,) = jobs.client.lrange(lo.messages_list, 0, -1)
    msg = Message.decode(jobs.client.hget(lo.messages, rid))
    assert (msg.queue_name, msg.actor_name, msg.args, msg.kwargs) == ("warmpool", "job", ("a",), {})
    assert lo.messages_list == "dramatiq:warmpool" and lo.messages == "dramatiq:warmpool.msgs"


def test_fifo_by_first_add(jobs: Jobs) -> None:
    for key in ["c", "a", "b", "a", "c"]:
        jobs.queue.add(key)
    assert queued_keys(jobs) == ["c", "a", "b"]


def test_add_many(jobs: Jobs) -> None:
    results = jobs.queue.add_many(["a", "b", "a"], chunk=2)
    assert results == [AddResult.ENQUEUED, AddResult.ENQUEUED, AddResult.DEDUPLICATED]
    assert run_all(jobs) == {"a": 1, "b": 1}


# --- start / done / rerun ----------------------------------------------------------------


def test_start_takes_lease_fence_and_inflight(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    lo = jobs.queue.layout
    assert not jobs.client.sismember(lo.dirty, "a")
    assert jobs.client.get(lo.lease("a")).decode() == ctx.token
    assert 0 < jobs.client.pttl(lo.lease("a")) <= jobs.settings.lease_ttl_ms
    assert jobs.client.zscore(lo.inflight, "a") is not None
    assert ctx.fence >= 1 and ctx.attempt == 1 and ctx.queued_seconds is not None
    ctx.ensure_held()
    done = jobs.finish(ctx)
    assert (done.outcome, done.rerun) == ("success", False)
    assert jobs.client.get(lo.lease("a")) is None
    assert jobs.client.zscore(lo.inflight, "a") is None


def test_added_while_running_runs_exactly_once_more(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    assert [jobs.queue.add("a") for _ in range(3)] == [
        AddResult.RERUN,
        AddResult.DEDUPLICATED,
        AddResult.DEDUPLICATED,
    ]
    assert queued_keys(jobs) == []  # nothing to deliver while it runs
    assert jobs.finish(ctx).rerun is True
    assert queued_keys(jobs) == ["a"]
    assert run_all(jobs) == {"a": 1}
    assert queued_keys(jobs) == []


def test_busy_key_is_skipped_and_rerun_by_holder(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    holder = jobs.acquire("a")  # e.g. a claim job's secondary lease
    assert holder is not None
    assert deliver(jobs) == "busy"
    assert ("skip", ("a", "busy")) in observer.calls
    assert jobs.client.sismember(jobs.queue.layout.dirty, "a")  # still owed
    assert jobs.release(holder).rerun is True
    assert run_all(jobs) == {"a": 1}


def test_duplicate_message_is_stale(jobs: Jobs) -> None:
    jobs.queue.add("a")
    lo = jobs.queue.layout
    rid, body = jobs.messages.body("a")  # a duplicate, as crash recovery can produce
    jobs.client.hset(lo.messages, rid, body)
    jobs.client.rpush(lo.messages_list, rid)
    first = deliver(jobs)
    assert isinstance(first, JobContext)
    jobs.finish(first)
    assert deliver(jobs) == "stale"


def test_start_retry_of_own_call_is_not_busy(jobs: Jobs) -> None:
    """A start whose reply was lost and retried finds its own token: still ours."""
    jobs.queue.add("a")
    token = jobs.book.new_token()
    first = jobs.scripts.start("a", token, 10_000)
    jobs.book.new_token = lambda: token  # type: ignore[method-assign]
    ctx = jobs.begin("a")
    assert isinstance(ctx, JobContext)
    assert ctx.token == first.value  # type: ignore[union-attr]


# --- leases ------------------------------------------------------------------------------


def test_release_with_old_token_leaves_new_holder_alone(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    old = deliver(jobs)
    assert isinstance(old, JobContext)
    expire_lease(jobs, "a")
    jobs.queue.add("a")
    new = deliver(jobs)
    assert isinstance(new, JobContext)
    lo = jobs.queue.layout
    assert jobs.finish(old).outcome == "lost"
    assert ("lost", ("a",)) in observer.calls
    assert jobs.client.get(lo.lease("a")).decode() == new.token
    assert jobs.client.zscore(lo.inflight, "a") is not None
    assert jobs.finish(new).outcome == "success"


def test_renewal_with_foreign_token_fails(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    assert jobs.scripts.renew(10_000, [("a", ctx.token), ("a", "1|someone-else")]) == [True, False]
    jobs.client.set(jobs.queue.layout.lease("a"), "999|thief")
    jobs.book.renew_once()
    assert ctx.lease.lost
    assert ("lost", ("a",)) in observer.calls
    with pytest.raises(LeaseLost):
        ctx.ensure_held()


def test_renewal_extends_ttl_and_deadline(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    lo = jobs.queue.layout
    jobs.client.pexpire(lo.lease("a"), 100)
    jobs.client.zadd(lo.inflight, {"a": 1})
    before = ctx.lease.valid_until
    jobs.book.renew_once()
    assert jobs.client.pttl(lo.lease("a")) > 100
    assert jobs.client.zscore(lo.inflight, "a") > 1
    assert ctx.lease.valid_until > before


def test_lease_lapses_locally_without_renewal(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    ctx.lease.valid_until = time.monotonic() - 0.001
    with pytest.raises(LeaseLost):
        ctx.ensure_held()


def test_fence_only_grows(jobs: Jobs) -> None:
    fences = []
    for _ in range(3):
        jobs.queue.add("a")
        ctx = deliver(jobs)
        assert isinstance(ctx, JobContext)
        fences.append(ctx.fence)
        other = ctx.try_lease("b")
        assert other is not None
        fences.append(other.fence)
        jobs.finish(ctx)
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_try_lease_never_waits_and_reruns_on_release(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("s1")
    jobs.queue.add("s2")
    c1, c2 = deliver(jobs), deliver(jobs)
    assert isinstance(c1, JobContext) and isinstance(c2, JobContext)
    lease = c1.try_lease("i1")
    assert lease is not None and c1.try_lease("i1") is lease
    assert c1.try_lease("s1") is c1.lease
    assert c2.try_lease("i1") is None
    assert ("contention", ("i1",)) in observer.calls
    jobs.queue.add("i1")  # a reconcile is owed while the claim holds i1
    assert queued_keys(jobs) == []
    c1.release(lease)
    assert queued_keys(jobs) == ["i1"]
    assert c2.try_lease("i1") is not None
    jobs.finish(c2)  # releases i1 too: dirty? no -> nothing more queued
    jobs.finish(c1)
    assert run_all(jobs) == {"i1": 1}


def test_secondary_leases_released_with_job(jobs: Jobs) -> None:
    jobs.queue.add("s")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    assert ctx.try_lease("i") is not None
    jobs.finish(ctx)
    assert jobs.client.get(jobs.queue.layout.lease("i")) is None
    assert jobs.book.held() == []


# --- failures, backoff, dead letters -----------------------------------------------------


def fail_once(jobs: Jobs, key: str) -> tuple[str, int | None, int]:
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext) and ctx.key == key
    done = jobs.finish(ctx, RuntimeError(f"boom {ctx.attempt}"))
    return done.outcome, done.delay_ms, done.failures


def test_backoff_grows_caps_and_resets(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    seen = []
    for _ in range(3):
        seen.append(fail_once(jobs, "a"))
        lo = jobs.queue.layout
        assert jobs.client.zscore(lo.delayed, "a") is not None
        assert not jobs.client.sismember(lo.dirty, "a")
        make_due(jobs, "a")
        Maintenance(jobs).promote_due()
    assert seen == [("retry", 5, 1), ("retry", 10, 2), ("retry", 20, 3)]
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext) and ctx.attempt == 4
    assert jobs.finish(ctx).outcome == "success"
    lo = jobs.queue.layout
    assert jobs.client.hget(lo.failures, "a") is None and jobs.client.hget(lo.errors, "a") is None
    jobs.queue.add("a")
    assert fail_once(jobs, "a") == ("retry", 5, 1)
    assert ("retry", ("a", 0.005, 1)) in observer.calls


def test_backoff_cap(client: redis.Redis) -> None:
    s = QueueSettings(redis_url="x", max_failures=20, backoff_base=0.005, backoff_cap=0.03)
    jobs = Jobs(client, s, router=route)
    jobs.queue.add("a")
    delays = []
    for _ in range(6):
        delays.append(fail_once(jobs, "a")[1])
        make_due(jobs, "a")
        Maintenance(jobs).promote_due()
    assert delays == [5, 10, 20, 30, 30, 30]


def test_failure_of_readded_key_reruns_at_once(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    jobs.queue.add("a")
    done = jobs.finish(ctx, RuntimeError("x"))
    assert (done.outcome, done.rerun, done.delay_ms) == ("retry", True, 0)
    assert jobs.client.zscore(jobs.queue.layout.delayed, "a") is None
    assert queued_keys(jobs) == ["a"]


def test_dead_letter_after_max_failures_keeps_error(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    outcomes = []
    for _ in range(4):
        outcomes.append(fail_once(jobs, "a")[0])
        make_due(jobs, "a")
        Maintenance(jobs).promote_due()
    assert outcomes == ["retry", "retry", "retry", "dead"]
    assert ("dead", ("a",)) in observer.calls
    lo = jobs.queue.layout
    assert queued_keys(jobs) == []
    assert jobs.client.zscore(lo.delayed, "a") is None
    assert jobs.client.hget(lo.failures, "a") is None
    assert "boom 4" in jobs.client.hget(lo.errors, "a").decode()
    assert lo.xq == "dramatiq:warmpool.XQ" and jobs.client.zcard(lo.xq) == 1
    (dead,) = jobs.queue.list_dead()
    assert dead.key == "a" and dead.actor == "job" and "boom 4" in dead.error
    assert dead.failures == 4


def test_one_dead_letter_per_key_and_success_clears_it(jobs: Jobs) -> None:
    for _ in range(2):
        jobs.queue.add("a")
        for _ in range(4):
            fail_once(jobs, "a")
            make_due(jobs, "a")
            Maintenance(jobs).promote_due()
    assert len(jobs.queue.list_dead()) == 1
    jobs.queue.add("a")
    assert run_all(jobs) == {"a": 1}
    assert jobs.queue.list_dead() == []
    assert jobs.client.hlen(jobs.queue.layout.dead) == 0


def test_dead_letter_of_readded_key_still_reruns(jobs: Jobs) -> None:
    jobs.queue.add("a")
    for _ in range(3):
        fail_once(jobs, "a")
        make_due(jobs, "a")
        Maintenance(jobs).promote_due()
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    jobs.queue.add("a")  # new work arrived during the last failing run
    done = jobs.finish(ctx, RuntimeError("last"))
    assert (done.outcome, done.rerun) == ("dead", True)
    assert queued_keys(jobs) == ["a"]


def test_redrive_by_key_and_by_id_and_purge(jobs: Jobs) -> None:
    for key in ("a", "b"):
        jobs.queue.add(key)
        for _ in range(4):
            fail_once(jobs, key)
            make_due(jobs, key)
            Maintenance(jobs).promote_due()
    dead = {d.key: d for d in jobs.queue.list_dead()}
    assert set(dead) == {"a", "b"}
    assert jobs.queue.retry_dead("a") == "enqueued"
    assert jobs.queue.retry_dead("a") == "missing"
    assert jobs.queue.retry_dead(dead["b"].message_id) == "enqueued"
    assert jobs.queue.list_dead() == []
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext) and ctx.attempt == 1
    jobs.finish(ctx)
    run_all(jobs)
    jobs.queue.add("c")
    for _ in range(4):
        fail_once(jobs, "c")
        make_due(jobs, "c")
        Maintenance(jobs).promote_due()
    assert jobs.queue.purge_dead() == 1
    assert jobs.queue.list_dead() == [] and jobs.queue.retry_dead("c") == "missing"


def test_redrive_plain_dramatiq_message(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    msg = Message(
        queue_name="warmpool",
        actor_name="plain",
        args=(1, 2),
        kwargs={},
        options={"redis_message_id": "r1", "traceback": "tb"},
    )
    jobs.client.zadd(lo.xq, {"r1": 1})
    jobs.client.hset(lo.xq_messages, "r1", msg.encode())
    (dead,) = jobs.queue.list_dead()
    assert dead.key is None and dead.error == "tb"
    assert jobs.queue.retry_dead("r1") == "enqueued"
    (rid,) = jobs.client.lrange(lo.messages_list, 0, -1)
    again = Message.decode(jobs.client.hget(lo.messages, rid))
    assert again.args == (1, 2) and again.options["redis_message_id"] == rid.decode()
    assert "traceback" not in again.options


# --- delayed adds ------------------------------------------------------------------------


def test_delayed_add_only_moves_earlier(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    q = jobs.queue
    assert q.add_after("a", 10) == AddResult.DELAYED
    first = jobs.client.zscore(lo.delayed, "a")
    assert q.add_after("a", 20) == AddResult.DEDUPLICATED
    assert jobs.client.zscore(lo.delayed, "a") == first
    assert q.add_after("a", 5) == AddResult.DELAYED
    assert jobs.client.zscore(lo.delayed, "a") < first
    assert queued_keys(jobs) == []
    assert q.add("a") == AddResult.ENQUEUED  # an immediate add supersedes the delayed one
    assert jobs.client.zscore(lo.delayed, "a") is None
    assert q.add_after("a", 5) == AddResult.DEDUPLICATED  # waiting already: runs sooner
    assert jobs.client.zscore(lo.delayed, "a") is None
    assert q.add_after("b", 0) == AddResult.ENQUEUED


def test_promote_due_keys(jobs: Jobs) -> None:
    jobs.queue.add_after("a", 60)
    jobs.queue.add_after("b", 60)
    maintenance = Maintenance(jobs)
    assert maintenance.promote_due() == 0
    make_due(jobs, "b")
    assert maintenance.promote_due() == 1
    assert queued_keys(jobs) == ["b"]
    assert jobs.client.zscore(jobs.queue.layout.delayed, "a") is not None


def test_defer_while_running(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    assert ctx.defer(30) == AddResult.DELAYED
    assert jobs.finish(ctx).rerun is False
    make_due(jobs, "a")
    Maintenance(jobs).promote_due()
    assert run_all(jobs) == {"a": 1}


def test_promoted_key_that_is_running_reruns_after(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    jobs.queue.add_after("a", 60)
    make_due(jobs, "a")
    Maintenance(jobs).promote_due()
    assert queued_keys(jobs) == []
    assert jobs.finish(ctx).rerun
    assert run_all(jobs) == {"a": 1}


# --- parking on a busy lease (issue #28) ------------------------------------------------


def _park_while_held(jobs: Jobs) -> JobContext:
    """`i` running; `s` ran, found `i` busy and parked on it (fallback 60 s). Returns i's."""
    jobs.queue.add("i")
    holder = deliver(jobs)
    assert isinstance(holder, JobContext) and holder.key == "i"
    jobs.queue.add("s")
    claim = deliver(jobs)
    assert isinstance(claim, JobContext) and claim.key == "s"
    assert claim.try_lease("i") is None
    assert claim.park("i", 60) == AddResult.PARKED
    jobs.finish(claim)
    return holder


def test_parked_key_runs_when_the_lease_is_released_not_before(jobs: Jobs) -> None:
    holder = _park_while_held(jobs)
    maintenance = Maintenance(jobs)
    assert maintenance.promote_due() == 0  # the fallback is a minute away: no polling
    assert queued_keys(jobs) == []
    jobs.finish(holder)
    assert maintenance.promote_due() == 1  # released: due at once
    assert run_all(jobs) == {"s": 1}
    assert not jobs.client.exists(jobs.queue.layout.waiters("i"))


def test_parked_key_runs_when_a_secondary_lease_is_released(jobs: Jobs) -> None:
    jobs.queue.add("other")
    other = deliver(jobs)
    assert isinstance(other, JobContext)
    lease = other.try_lease("i")
    assert lease is not None
    jobs.queue.add("s")
    claim = deliver(jobs)
    assert isinstance(claim, JobContext)
    assert claim.park("i", 60) == AddResult.PARKED
    jobs.finish(claim)
    other.release(lease)
    assert Maintenance(jobs).promote_due() == 1
    jobs.finish(other)
    assert run_all(jobs) == {"s": 1}


def test_park_on_a_free_lease_is_due_at_once(jobs: Jobs) -> None:
    jobs.queue.add("s")
    claim = deliver(jobs)
    assert isinstance(claim, JobContext)
    assert claim.park("i", 60) == AddResult.DELAYED  # released between its try and the park
    jobs.finish(claim)
    assert Maintenance(jobs).promote_due() == 1
    assert run_all(jobs) == {"s": 1}


def test_parked_key_falls_back_to_its_own_timer_when_the_holder_dies(jobs: Jobs) -> None:
    _park_while_held(jobs)
    expire_lease(jobs, "i")  # the holder died: nothing releases the lease
    make_due(jobs, "s")  # the fallback's time has come
    Maintenance(jobs).promote_due()
    assert "s" in queued_keys(jobs)


def test_parking_keeps_the_triggers_and_a_foreign_waiters_key_fails_nothing(
    jobs: Jobs,
) -> None:
    jobs.client.set(jobs.queue.layout.waiters("i"), "someone else's string")
    holder = _park_while_held(jobs)  # SADD on a string would fail every park and done
    assert jobs.client.type(jobs.queue.layout.waiters("i")) == b"set"
    jobs.client.set(jobs.queue.layout.waiters("i"), "again")
    assert jobs.finish(holder).outcome == "success"  # and done still releases
    make_due(jobs, "s")
    Maintenance(jobs).promote_due()
    assert run_all(jobs) == {"s": 1}


# --- crash recovery and audit ------------------------------------------------------------


def test_recover_key_of_dead_holder(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    maintenance = Maintenance(jobs)
    assert maintenance.recover_crashed() == 0  # lease alive: nothing to do
    jobs.client.zadd(jobs.queue.layout.inflight, {"a": 0}, xx=True)
    assert maintenance.recover_crashed() == 0  # deadline passed but lease still there
    expire_lease(jobs, "a")
    assert maintenance.recover_crashed() == 1
    assert ("recovered", ("a", "recovered")) in observer.calls
    lo = jobs.queue.layout
    assert jobs.client.zscore(lo.inflight, "a") is None
    assert jobs.client.hget(lo.errors, "a").decode() == CRASH_ERROR
    assert queued_keys(jobs) == ["a"]
    again = deliver(jobs)
    assert isinstance(again, JobContext) and again.attempt == 2 and again.fence > ctx.fence
    assert jobs.finish(ctx).outcome == "lost"  # the presumed-dead holder comes back: refused
    assert jobs.finish(again).outcome == "success"


def test_recover_does_not_duplicate_a_queued_message(jobs: Jobs) -> None:
    jobs.queue.add("a")
    holder = jobs.acquire("a")  # secondary holder; "a" keeps its queued message
    assert holder is not None
    expire_lease(jobs, "a")
    assert Maintenance(jobs).recover_crashed() == 1
    assert queued_keys(jobs) == ["a"]


def test_recover_secondary_lease_reruns_key(jobs: Jobs) -> None:
    assert jobs.acquire("i") is not None
    expire_lease(jobs, "i")
    Maintenance(jobs).recover_crashed()
    assert run_all(jobs) == {"i": 1}


def test_crash_looping_key_is_dead_lettered(jobs: Jobs) -> None:
    jobs.queue.add("a")
    m = Maintenance(jobs)
    for _ in range(4):
        ctx = deliver(jobs)
        assert isinstance(ctx, JobContext)
        expire_lease(jobs, "a")
        m.recover_crashed()
    assert queued_keys(jobs) == []
    (dead,) = jobs.queue.list_dead()
    assert dead.key == "a" and dead.error == CRASH_ERROR


def test_audit_repairs_waiting_key_without_message(jobs: Jobs) -> None:
    jobs.queue.add("a")
    jobs.queue.add("b")
    lo = jobs.queue.layout
    jobs.client.delete(lo.messages_list, lo.messages)  # e.g. someone flushed the queue
    held = jobs.acquire("b")  # held keys are the holder's to re-enqueue
    assert held is not None
    assert Maintenance(jobs).audit() == 1
    assert queued_keys(jobs) == ["a"]
    assert Maintenance(jobs).audit() == 0


# --- skip after start, observer ----------------------------------------------------------


def test_abandon_gives_key_back(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    done = jobs.abandon(ctx)
    assert (done.outcome, done.rerun) == ("released", True)
    assert jobs.client.hget(jobs.queue.layout.failures, "a") is None
    assert run_all(jobs) == {"a": 1}


def test_observer_sees_lifecycle(jobs: Jobs, observer: Recorder) -> None:
    jobs.queue.add("a")
    jobs.queue.add("a")
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    jobs.finish(ctx, ValueError("x"))
    assert observer.names() == ["add", "add", "start", "done", "retry"]
    assert observer.calls[1] == ("add", ("a", "deduplicated"))
    assert observer.calls[3] == ("done", ("a", "retry"))


def test_interleaved_keys_converge(jobs: Jobs) -> None:
    """An interleaving of adds, starts and finishes over few keys: never two runs of a key
    at once, and every key's last add is followed by a run that started after it."""
    keys = [f"k{i}" for i in range(5)]
    running: dict[str, JobContext] = {}
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    clock = 0
    for step in range(400):
        clock += 1
        key = keys[(step * 7) % 5]
        if step % 3 != 1:
            jobs.queue.add(key)
            last_add[key] = clock
        clock += 1
        ctx = deliver(jobs)
        if isinstance(ctx, JobContext):
            assert ctx.key not in running  # never concurrent
            running[ctx.key] = ctx
            last_start[ctx.key] = clock
        if step % 2 == 0 and running:
            jobs.finish(running.pop(sorted(running)[step % len(running)]))
    for ctx in running.values():
        jobs.finish(ctx)
    while (ctx := deliver(jobs)) is not None:
        if isinstance(ctx, JobContext):
            clock += 1
            last_start[ctx.key] = clock
            jobs.finish(ctx)
    assert jobs.client.scard(jobs.queue.layout.dirty) == 0
    for key, added in last_add.items():
        assert last_start[key] > added, key


# --- a lost holder's run is owed whoever takes its key next -------------------------------


def test_secondary_taker_of_a_lost_holders_key_keeps_the_rerun_owed(jobs: Jobs) -> None:
    """A holder stalls (SIGSTOP, CPU starvation) past its lease TTL; before the recovery pass
    gets to the key, another job takes it as a secondary lease (a claim holding a rival
    Session, an instance) and releases it. The stalled run never completed, so the key still
    owes a run: the taker's release must queue it, not drop the crashed run's deadline."""
    jobs.queue.add("a")
    stalled = deliver(jobs)
    assert isinstance(stalled, JobContext)
    expire_lease(jobs, "a")  # the lease lapsed; recovery has not run yet
    taker = jobs.acquire("a")
    assert taker is not None
    jobs.release(taker)
    Maintenance(jobs).recover_crashed()
    assert jobs.finish(stalled).outcome == "lost"  # the stalled holder comes back late
    assert run_all(jobs) == {"a": 1}


def test_start_that_takes_a_lost_holders_key_runs_untriggered(jobs: Jobs) -> None:
    """A delivery takes a key whose holder was lost before the recovery pass did: this run is
    the one the lost run owed, so it reconciles fully (what the lost run wrote is unknown)."""
    jobs.queue.add("a", {"Session/a": "5"})
    stalled = deliver(jobs)
    assert isinstance(stalled, JobContext) and not stalled.untriggered
    expire_lease(jobs, "a")
    jobs.queue.add("a", {"Session/a": "6"})
    again = deliver(jobs)
    assert isinstance(again, JobContext) and again.untriggered
    assert Maintenance(jobs).recover_crashed() == 0  # nothing left to recover: `again` owns it
    assert jobs.finish(stalled).outcome == "lost"
    assert jobs.finish(again).outcome == "success"
    assert run_all(jobs) == {}


def test_defer_of_a_readded_key_is_not_skipped_as_own(jobs: Jobs) -> None:
    """A run writes (its own write's watch event re-adds the key while it runs, with that
    version as the trigger), then defers (a lease it needs is busy). The defer finds the key
    waiting already and folds into that run: which must then run, as the delayed run would
    have (`*`), not be skipped because every trigger is the key's own last write."""
    jobs.queue.add("a", {"Session/a": "5"})
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    ctx.note_write("Session/a", "6")
    assert jobs.queue.add("a", {"Session/a": "6"}) == AddResult.RERUN  # the write's event
    assert ctx.defer(0.05) == AddResult.DEDUPLICATED
    assert jobs.finish(ctx).rerun
    again = deliver(jobs)
    assert isinstance(again, JobContext) and again.untriggered
