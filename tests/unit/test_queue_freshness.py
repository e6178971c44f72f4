"""Triggers (the versions a run must see), own-write skips, the body-less `done` and the
claims queue, script by script on fakeredis (real Lua via lupa)."""

from __future__ import annotations

import fakeredis
import pytest
import redis
from dramatiq.message import Message

from tests.unit.test_queue_protocol import (
    Recorder,
    deliver,
    expire_lease,
    make_due,
    queued_keys,
    route,
    run_all,
)
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.keyed import AddResult
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.messages import MessageFactory
from warmpool.queue.settings import QueueSettings

SVC = "Service/ws-java-3-ext"
POD = "Pod/ws-java-3"


@pytest.fixture
def client() -> redis.Redis:
    return fakeredis.FakeRedis()


@pytest.fixture
def observer() -> Recorder:
    return Recorder()


@pytest.fixture
def jobs(client: redis.Redis, observer: Recorder) -> Jobs:
    settings = QueueSettings(redis_url="redis://unused", max_failures=4, backoff_cap=0.02)
    return Jobs(client, settings, router=route, observer=observer)


def trig(jobs: Jobs, key: str) -> dict[str, str]:
    raw = jobs.client.hgetall(jobs.queue.layout.triggers(key))
    return {k.decode(): v.decode() for k, v in raw.items()}


def own(jobs: Jobs, key: str) -> dict[str, str]:
    raw = jobs.client.hgetall(jobs.queue.layout.own(key))
    return {k.decode(): v.decode() for k, v in raw.items()}


def start(jobs: Jobs) -> JobContext:
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext), ctx
    return ctx


def run_writing(jobs: Jobs, key: str, writes: dict[str, str]) -> None:
    """One run of `key` (added untriggered) that made these guarded writes."""
    jobs.queue.add(key)
    ctx = start(jobs)
    for field, value in writes.items():
        ctx.note_write(field, value)
    assert jobs.finish(ctx).outcome == "success"


# --- recording and merging -----------------------------------------------------------------


def test_triggers_merge_max_version_last_uid_and_star(jobs: Jobs) -> None:
    q = jobs.queue
    assert q.add("a", {SVC: "10"}) == AddResult.ENQUEUED
    assert q.add("a", {SVC: "9"}) == AddResult.DEDUPLICATED
    assert trig(jobs, "a") == {SVC: "10"}
    q.add("a", {SVC: "100", POD + "#gone": "uid-1"})  # 100 > 10 as numbers, not as text
    q.add("a", {SVC: "99", POD + "#gone": "uid-2"})
    assert trig(jobs, "a") == {SVC: "100", POD + "#gone": "uid-2"}
    q.add_many(["a", ("a", {SVC: "101"}), ("b", None)])
    assert trig(jobs, "a") == {SVC: "101", POD + "#gone": "uid-2", "*": "1"}
    assert trig(jobs, "b") == {"*": "1"}


def test_start_hands_over_and_clears_triggers(jobs: Jobs) -> None:
    jobs.queue.add("a", {SVC: "7"})
    ctx = start(jobs)
    assert ctx.triggers == {SVC: "7"} and not ctx.untriggered
    assert trig(jobs, "a") == {}
    assert jobs.queue.add("a", {SVC: "8"}) == AddResult.RERUN  # recorded for the next run
    assert jobs.queue.add("a", {POD: "3"}) == AddResult.DEDUPLICATED
    assert jobs.finish(ctx).rerun
    again = start(jobs)
    assert again.triggers == {SVC: "8", POD: "3"} and not again.untriggered
    jobs.finish(again)
    jobs.queue.add("a")
    plain = start(jobs)
    assert plain.triggers == {} and plain.untriggered


def test_add_after_records_triggers_and_a_promoted_run_always_runs(jobs: Jobs) -> None:
    run_writing(jobs, "a", {SVC: "5"})
    assert jobs.queue.add_after("a", 60, {SVC: "5"}) == AddResult.DELAYED
    assert trig(jobs, "a") == {SVC: "5"}
    make_due(jobs, "a")
    assert Maintenance(jobs).promote_due() == 1
    ctx = start(jobs)  # own write, but a delayed run is owed whatever the versions
    assert ctx.triggers == {SVC: "5"} and ctx.untriggered


# --- own-write skips -----------------------------------------------------------------------


def test_an_add_at_rest_whose_triggers_are_all_own_writes_is_refused(
    jobs: Jobs, observer: Recorder,
) -> None:
    """Issue #28: the watch events of a run's own writes do not queue its key again."""
    run_writing(jobs, "a", {SVC: "100", POD: "40"})
    assert jobs.client.pttl(jobs.queue.layout.own("a")) > 0
    assert jobs.queue.add("a", {SVC: "100"}) == AddResult.OWN
    assert jobs.queue.add_many([("a", {POD: "39"})]) == [AddResult.OWN]  # older: seen too
    assert ("add", ("a", "own")) in observer.calls
    lo = jobs.queue.layout
    assert jobs.client.llen(lo.messages_list) == 0 and jobs.client.hlen(lo.messages) == 0
    assert not jobs.client.sismember(lo.dirty, "a")
    assert jobs.client.hget(lo.added_at, "a") is None
    assert trig(jobs, "a") == {}
    assert run_all(jobs) == {}


@pytest.mark.parametrize("state", ["delayed", "lost-holder"])
def test_an_own_write_add_is_not_refused_where_a_run_is_owed(jobs: Jobs, state: str) -> None:
    """A delayed run, or the rerun a lost holder owes, runs whatever the versions: the add
    takes the usual path (and the run is not skipped)."""
    run_writing(jobs, "a", {SVC: "100"})
    lo = jobs.queue.layout
    if state == "delayed":
        jobs.queue.add_after("a", 60)
    else:
        jobs.client.zadd(lo.inflight, {"a": 0})  # its holder died; recovery not there yet
    assert jobs.queue.add("a", {SVC: "100"}) == AddResult.ENQUEUED
    assert isinstance(deliver(jobs), JobContext)


def test_all_triggers_own_writes_skips_the_run(jobs: Jobs, observer: Recorder) -> None:
    """Added while its run wrote (so not refused at the add): the rerun's start skips it."""
    jobs.queue.add("a")
    ctx = start(jobs)
    ctx.note_write(SVC, "100")
    ctx.note_write(POD, "40")
    assert jobs.queue.add("a", {SVC: "100"}) == AddResult.RERUN
    assert jobs.queue.add("a", {POD: "39"}) == AddResult.DEDUPLICATED  # older than ours
    assert jobs.finish(ctx).rerun
    lo = jobs.queue.layout
    (rid,) = jobs.client.lrange(lo.messages_list, 0, -1)
    acks = "test-acks"
    jobs.client.sadd(acks, rid)
    jobs.client.lpop(lo.messages_list)
    assert jobs.begin("a", rid.decode(), (acks, rid.decode())) == "own"
    assert ("skip", ("a", "own")) in observer.calls
    assert not jobs.client.sismember(lo.dirty, "a")
    assert jobs.client.hget(lo.pending, "a") is None
    assert jobs.client.hget(lo.added_at, "a") is None
    assert trig(jobs, "a") == {}
    assert jobs.client.scard(acks) == 0 and jobs.client.hlen(lo.messages) == 0  # acked
    assert jobs.client.get(lo.lease("a")) is None
    assert run_all(jobs) == {}


@pytest.mark.parametrize(
    "triggers",
    [{SVC: "101"}, {SVC: "100", POD: "1"}, {SVC: "100", "*": "1"}],
    ids=["newer-version", "field-not-written", "untriggered"],
)
def test_a_trigger_not_covered_by_own_writes_runs(jobs: Jobs, triggers: dict[str, str]) -> None:
    run_writing(jobs, "a", {SVC: "100"})
    jobs.queue.add("a", triggers)
    ctx = start(jobs)
    assert ctx.triggers == {k: v for k, v in triggers.items() if k != "*"}


def test_plain_add_after_an_own_write_runs(jobs: Jobs) -> None:
    run_writing(jobs, "a", {SVC: "100"})
    jobs.queue.add("a", {SVC: "100"})
    jobs.queue.add("a")  # a resync meanwhile
    assert start(jobs).untriggered


def test_dirty_key_with_lost_triggers_runs(jobs: Jobs) -> None:
    run_writing(jobs, "a", {SVC: "100"})
    jobs.queue.add("a", {SVC: "101"})
    jobs.client.delete(jobs.queue.layout.triggers("a"))  # e.g. Redis lost the hash
    ctx = start(jobs)
    assert ctx.triggers == {} and ctx.untriggered


def test_gone_trigger_skips_on_the_same_uid_only(jobs: Jobs) -> None:
    run_writing(jobs, "a", {POD + "#gone": "uid-1"})
    assert jobs.queue.add("a", {POD + "#gone": "uid-1"}) == AddResult.OWN
    jobs.queue.add("a", {POD + "#gone": "uid-2"})  # another object of that name went
    assert start(jobs).triggers == {POD + "#gone": "uid-2"}


def test_own_write_seen_during_the_run_skips_the_rerun(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = start(jobs)
    ctx.note_write(SVC, "200")
    ctx.note_write(SVC, "199")  # max is kept
    assert jobs.queue.add("a", {SVC: "200"}) == AddResult.RERUN  # its own watch event
    done = jobs.finish(ctx)
    assert done.rerun and own(jobs, "a") == {SVC: "200"}
    assert deliver(jobs) == "own"
    assert jobs.client.scard(jobs.queue.layout.dirty) == 0


def test_a_run_replaces_the_own_record(jobs: Jobs) -> None:
    run_writing(jobs, "a", {SVC: "1"})
    run_writing(jobs, "a", {})
    assert own(jobs, "a") == {}
    jobs.queue.add("a", {SVC: "1"})
    assert isinstance(deliver(jobs), JobContext)


def test_failed_run_is_retried_even_if_its_triggers_are_own_writes(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = start(jobs)
    ctx.note_write(SVC, "5")
    jobs.queue.add("a", {SVC: "5"})
    done = jobs.finish(ctx, RuntimeError("after the write"))
    assert (done.outcome, done.rerun) == ("retry", True)
    assert own(jobs, "a") == {SVC: "5"}
    assert start(jobs).attempt == 2


def test_retry_superseded_by_an_own_write_trigger_still_runs(jobs: Jobs) -> None:
    jobs.queue.add("a")
    ctx = start(jobs)
    ctx.note_write(SVC, "5")
    assert jobs.finish(ctx, RuntimeError("x")).delay_ms is not None  # delayed retry
    jobs.queue.add("a", {SVC: "5"})  # supersedes the delayed retry
    assert start(jobs).untriggered


def test_writes_under_a_secondary_lease_go_to_that_key(jobs: Jobs) -> None:
    jobs.queue.add("s")
    ctx = start(jobs)
    with pytest.raises(ValueError):
        ctx.note_write(POD, "9", key="i")  # not leased
    assert ctx.try_lease("i") is not None
    ctx.note_write(POD, "9", key="i")
    ctx.note_write(SVC, "3")
    jobs.queue.add("i", {POD: "9"})  # the claim's write, seen by the instance's watch
    jobs.finish(ctx)
    assert own(jobs, "i") == {POD: "9"} and own(jobs, "s") == {SVC: "3"}
    assert deliver(jobs) == "own"


def test_writes_noted_after_a_secondary_release_are_stored_at_finish(jobs: Jobs) -> None:
    jobs.queue.add("s")
    ctx = start(jobs)
    lease = ctx.try_lease("i")
    assert lease is not None
    ctx.note_write(SVC, "1", key="i")
    ctx.release(lease)  # stores what was noted so far
    assert own(jobs, "i") == {SVC: "1"}
    ctx.note_write(POD, "7", key="i")  # noted after the release (the lease's block ended)
    jobs.finish(ctx)
    assert own(jobs, "i") == {SVC: "1", POD: "7"} and own(jobs, "s") == {}


def test_release_of_a_secondary_lease_keeps_that_keys_own_record(jobs: Jobs) -> None:
    run_writing(jobs, "i", {SVC: "4"})
    jobs.queue.add("s")
    ctx = start(jobs)
    lease = ctx.try_lease("i")
    assert lease is not None
    ctx.release(lease)
    jobs.finish(ctx)
    assert own(jobs, "i") == {SVC: "4"}


def test_defer_keeps_the_runs_triggers(jobs: Jobs) -> None:
    jobs.queue.add("a", {SVC: "50"})
    ctx = start(jobs)
    assert ctx.defer(30) == AddResult.DELAYED
    assert trig(jobs, "a") == {SVC: "50"}
    jobs.queue.add_after("a", 30, {POD: "2"})
    jobs.finish(ctx)
    make_due(jobs, "a")
    Maintenance(jobs).promote_due()
    again = start(jobs)
    assert again.triggers == {SVC: "50", POD: "2"}


def test_abandon_gives_the_triggers_back(jobs: Jobs) -> None:
    jobs.queue.add("a", {SVC: "50"})
    ctx = start(jobs)
    jobs.abandon(ctx)
    assert start(jobs).triggers == {SVC: "50"}


# --- done without a body ---------------------------------------------------------------------


@pytest.fixture
def bodies(jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Keys a message body was built for, from now on."""
    built: list[str] = []
    real = MessageFactory.body

    def counting(self: MessageFactory, key: str, **options: object) -> tuple[str, bytes]:
        built.append(key)
        return real(self, key, **options)

    monkeypatch.setattr(MessageFactory, "body", counting)
    return built


def test_done_builds_no_body_unless_a_message_is_needed(jobs: Jobs, bodies: list[str]) -> None:
    jobs.queue.add("a")
    ctx = start(jobs)
    bodies.clear()
    done = jobs.finish(ctx)
    assert (done.outcome, done.rerun, done.message_needed) == ("success", False, False)
    assert bodies == []
    holder = jobs.acquire("b")
    assert holder is not None
    bodies.clear()
    jobs.release(holder)
    assert bodies == []


def test_rerun_after_done_enqueues_exactly_one_message(jobs: Jobs, bodies: list[str]) -> None:
    jobs.queue.add("a")
    ctx = start(jobs)
    for _ in range(3):
        jobs.queue.add("a")
    bodies.clear()
    done = jobs.finish(ctx)
    assert done.rerun and done.message_needed
    assert bodies == ["a"] and queued_keys(jobs) == ["a"]
    assert jobs.scripts.requeue([("a", *jobs.messages.body("a"))]) == ["ok"]  # re-checked
    assert queued_keys(jobs) == ["a"]
    assert run_all(jobs) == {"a": 1}


def test_rerun_with_a_message_on_its_way_builds_none(jobs: Jobs, bodies: list[str]) -> None:
    jobs.queue.add("a")
    holder = jobs.acquire("a")  # "a" keeps its queued message
    assert holder is not None
    bodies.clear()
    done = jobs.release(holder)
    assert done.rerun and not done.message_needed and bodies == []
    assert queued_keys(jobs) == ["a"]


# --- the claims queue ------------------------------------------------------------------------


S1, I1 = "session/ns/s1", "instance/ns/java/1"


def claims_keys(jobs: Jobs) -> list[str]:
    lo = jobs.queue.layout
    rids = jobs.client.lrange(lo.claims_messages_list, 0, -1)
    return [Message.decode(jobs.client.hget(lo.claims_messages, r)).args[0] for r in rids]


def test_session_keys_go_to_the_claims_queue(jobs: Jobs) -> None:
    q = jobs.queue
    q.add_many([I1, S1, "pool/ns/java", S1])
    assert queued_keys(jobs) == [I1, "pool/ns/java"]
    assert claims_keys(jobs) == [S1]
    lo = jobs.queue.layout
    (rid,) = jobs.client.lrange(lo.claims_messages_list, 0, -1)
    assert Message.decode(jobs.client.hget(lo.claims_messages, rid)).queue_name == (
        "warmpool-claims"
    )
    ctx = start(jobs)  # claims first
    assert ctx.key == S1
    assert q.add(S1) == AddResult.RERUN and claims_keys(jobs) == []
    assert jobs.finish(ctx).rerun and claims_keys(jobs) == [S1]
    assert run_all(jobs) == {S1: 1, I1: 1, "pool/ns/java": 1}


def test_claim_keys_are_repaired_and_recovered_on_their_queue(jobs: Jobs) -> None:
    jobs.queue.add(S1)
    m = Maintenance(jobs)
    assert m.audit() == 0  # its message is in the claims queue
    lo = jobs.queue.layout
    jobs.client.delete(lo.claims_messages_list, lo.claims_messages)
    assert m.audit() == 1 and claims_keys(jobs) == [S1] and queued_keys(jobs) == []
    ctx = start(jobs)
    expire_lease(jobs, S1)
    assert m.recover_crashed() == 1
    assert claims_keys(jobs) == [S1] and queued_keys(jobs) == []
    assert start(jobs).fence > ctx.fence


def test_claim_dead_letters_go_to_the_main_queue(jobs: Jobs) -> None:
    jobs.queue.add(S1)
    for _ in range(jobs.settings.max_failures):
        ctx = start(jobs)
        jobs.finish(ctx, RuntimeError("no"))
        make_due(jobs, S1)
        Maintenance(jobs).promote_due()
    (dead,) = jobs.queue.list_dead()
    assert dead.key == S1 and jobs.client.zcard(jobs.queue.layout.xq) == 1
    assert jobs.queue.retry_dead(S1) == AddResult.ENQUEUED
    assert claims_keys(jobs) == [S1]


def test_inspector_counts_both_queues(jobs: Jobs, client: redis.Redis) -> None:
    from warmpool.queue.inspect import Inspector

    jobs.queue.add_many([I1, S1])
    stats = Inspector(client, jobs.settings).stats()
    assert (stats.waiting, stats.messages, stats.claim_messages) == (2, 2, 1)
