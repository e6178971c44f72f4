"""Finding 10: a fetch whose reply was lost leaves its ids in a live worker's ack set. The
`reclaim` script and the consumer's check that puts them back, on fakeredis (real Lua)."""

from __future__ import annotations

import fakeredis
import pytest
import redis
from dramatiq.message import Message

from warmpool.queue.broker import HeldDeliveries, build_broker, keyed_middleware
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.settings import QueueSettings

WORKER = "w1"


@pytest.fixture
def jobs(client: redis.Redis) -> Jobs:
    return Jobs(client, QueueSettings(redis_url="redis://unused"), router=lambda key: "job")


def lost_fetch(jobs: Jobs, n: int = 1) -> list[str]:
    """What dispatch.lua's fetch writes (LPOP, SADD to the ack set), its reply never read."""
    lo = jobs.queue.layout
    rids = []
    for _ in range(n):
        rid = jobs.client.lpop(lo.messages_list)
        assert rid is not None
        jobs.client.sadd(lo.acks(WORKER), rid)
        rids.append(rid.decode())
    return rids


def deliver(jobs: Jobs) -> tuple[JobContext | str, str]:
    """A fetch that arrives: LPOP into the ack set, then begin (acking there if skipped)."""
    lo = jobs.queue.layout
    rid = jobs.client.lpop(lo.messages_list)
    assert rid is not None
    jobs.client.sadd(lo.acks(WORKER), rid)
    msg = Message.decode(jobs.client.hget(lo.messages, rid))
    return jobs.begin(msg.args[0], msg.message_id, (lo.acks(WORKER), rid.decode())), rid.decode()


def test_a_lost_fetch_is_not_repaired_by_the_audit_but_reclaimed(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    for k in ("a", "b", "c"):
        jobs.queue.add(k)
    rids = lost_fetch(jobs, 2)
    # the audit sees a message on its way (body kept, id in an ack set): nothing to repair
    assert jobs.scripts.orphans(["a", "b", "c"]) == []
    assert jobs.scripts.reclaim(lo.acks(WORKER), lo.queue, rids) == 2
    assert jobs.client.scard(lo.acks(WORKER)) == 0
    # back at the head, in their order: they have waited longest
    assert [r.decode() for r in jobs.client.lrange(lo.messages_list, 0, -1)][:2] == rids
    seen = []
    while jobs.client.llen(lo.messages_list):
        ctx, rid = deliver(jobs)
        assert isinstance(ctx, JobContext)
        seen.append(ctx.key)
        jobs.finish(ctx, ack=(lo.acks(WORKER), rid))
    assert seen == ["a", "b", "c"]


def test_reclaim_leaves_acked_ids_and_forgets_bodiless_ones(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    for k in ("a", "b"):
        jobs.queue.add(k)
    ra, rb = lost_fetch(jobs, 2)
    jobs.client.srem(lo.acks(WORKER), ra)  # its ack got there first
    jobs.client.hdel(lo.messages, ra)
    jobs.client.hdel(lo.messages, rb)  # acked elsewhere (a duplicate's skip): body gone
    assert jobs.scripts.reclaim(lo.acks(WORKER), lo.queue, [ra, rb]) == 0
    assert jobs.client.llen(lo.messages_list) == 0
    assert jobs.client.scard(lo.acks(WORKER)) == 0
    assert jobs.scripts.reclaim(lo.acks(WORKER), lo.queue, []) == 0


def test_a_duplicate_from_a_wrong_reclaim_is_skipped(jobs: Jobs) -> None:
    """Were a held delivery ever reclaimed, the keyed layer runs its key once anyway."""
    lo = jobs.queue.layout
    jobs.queue.add("a")
    ctx, rid = deliver(jobs)  # running
    assert isinstance(ctx, JobContext)
    assert jobs.scripts.reclaim(lo.acks(WORKER), lo.queue, [rid]) == 1
    dup, _ = deliver(jobs)
    assert dup == "busy"  # and acked: its body is gone, the run goes on
    jobs.finish(ctx, ack=(lo.acks(WORKER), rid))
    assert jobs.client.llen(lo.messages_list) == 0
    assert jobs.client.scard(lo.dirty) == 0

    jobs.queue.add("b")  # a delivery not started yet, reclaimed: the first to start runs
    _, rid = deliver_later(jobs)
    assert jobs.scripts.reclaim(lo.acks(WORKER), lo.queue, [rid]) == 1
    ctx, _ = deliver(jobs)
    assert isinstance(ctx, JobContext)
    jobs.finish(ctx, ack=(lo.acks(WORKER), rid))
    msg_id = "original"
    assert jobs.begin("b", msg_id, (lo.acks(WORKER), rid)) == "stale"


def deliver_later(jobs: Jobs) -> tuple[None, str]:
    """A fetch that arrives and waits in the worker's work queue (not begun)."""
    lo = jobs.queue.layout
    rid = jobs.client.lpop(lo.messages_list)
    assert rid is not None
    jobs.client.sadd(lo.acks(WORKER), rid)
    return None, rid.decode()


def test_only_ids_missing_twice_in_a_row_are_reclaimed() -> None:
    held = HeldDeliveries(period=1.0)
    held.add("q", "x")
    assert held.check("q", {"x", "lost"}, held.held("q")) == []
    assert held.check("q", {"x", "lost", "new"}, held.held("q")) == ["lost"]
    assert held.check("q", {"x", "new"}, held.held("q")) == ["new"]
    held.discard("q", ["x"])
    assert held.check("q", {"late"}, held.held("q")) == []  # "x" acked and gone
    assert held.check("q", set(), held.held("q")) == []  # "late" acked meanwhile
    assert held.due("q", 10.0) and not held.due("q", 10.5) and held.due("q", 11.0)


def test_the_consumer_reclaims_what_it_never_received_and_keeps_what_it_holds() -> None:
    client = fakeredis.FakeRedis()
    broker = build_broker(QueueSettings(redis_url="redis://unused"), client=client,
                          router=lambda key: "job")
    broker.held.period = 0.0  # every call checks
    jobs = keyed_middleware(broker).jobs
    lo = jobs.queue.layout
    for k in ("a", "b"):
        jobs.queue.add(k)
    consumer = broker.consume(lo.queue, prefetch=1, timeout=10)
    message = next(consumer)  # "a", held (in the work queue, say)
    assert message is not None and message.args[0] == "a"
    acks = lo.acks(broker.broker_id, lo.queue)
    broker.do_fetch(lo.queue, 1)  # "b": a fetch whose reply was lost
    assert client.scard(acks) == 2 and client.llen(lo.messages_list) == 0
    consumer._check_acks()  # first sighting
    assert client.llen(lo.messages_list) == 0
    consumer._check_acks()  # second: reclaimed; "a" is held, kept
    assert [Message.decode(client.hget(lo.messages, r)).args[0]
            for r in client.lrange(lo.messages_list, 0, -1)] == ["b"]
    assert client.smembers(acks) == {message.options["redis_message_id"].encode()}
    consumer.ack(message)
    assert client.scard(acks) == 0
    assert broker.held.held(lo.queue) == set()
