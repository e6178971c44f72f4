"""The Redis-reading side of the metrics, on fakeredis (real Lua via lupa): the pool-state
records the jobs leave (fenced, pruned) and the cluster-wide collector that exports them with
the queue's own keys."""

from __future__ import annotations

import fakeredis
import pytest
import redis
from dramatiq.message import Message
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics.collectors import ClusterCollector, read_queue
from metrics.poolstate import PoolState, Stale
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings

I1 = "instance/ns1/java/1"
I2 = "instance/ns1/java/2"
I3 = "instance/ns1/python/1"
S1 = "session/ns1/s1"
S2 = "session/ns1/s2"
S3 = "session/ns2/s1"


@pytest.fixture
def settings() -> QueueSettings:
    return QueueSettings(redis_url="redis://unused", prefix="p1:warmpool:",
                         namespace="p1:dramatiq", max_failures=2, backoff_cap=0.01)


@pytest.fixture
def state(client: redis.Redis, settings: QueueSettings) -> PoolState:
    return PoolState(client, settings)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(got: dict, name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


# --- pool:state ---------------------------------------------------------------------------------


def test_instance_records_are_fenced_and_retired_ones_deleted(state: PoolState) -> None:
    assert state.record_instance(I1, "java", "free", fence=5) is None
    assert state.record_instance(I1, "java", "claimed", fence=7) == "free"
    # A holder that lost its lease (older fence) cannot overwrite the newer record.
    with pytest.raises(Stale):
        state.record_instance(I1, "java", "free", fence=6)
    assert state.client.hget(state.state_key, I1) == b"java|claimed|7"
    assert state.record_instance(I1, "java", "retired", fence=9) == "claimed"
    assert state.client.hget(state.state_key, I1) is None
    assert state.record_instance(I1, "java", "free", fence=3) is None  # a new life


def test_instance_records_compare_fences_exactly_past_2_to_the_53(state: PoolState) -> None:
    """Issue #27: a lift may take the fence counter to 10^18; as doubles, 10^18 + 1 and
    10^18 + 2 are equal, and the stale record would have been written."""
    high = 10**18
    state.record_instance(I1, "java", "claimed", fence=high + 2)
    with pytest.raises(Stale):
        state.record_instance(I1, "java", "free", fence=high + 1)
    assert state.record_instance(I1, "java", "free", fence=high + 3) == "claimed"
    assert state.client.hget(state.state_key, I1) == f"java|free|{high + 3}".encode()


def test_the_keys_live_under_the_queue_prefix(state: PoolState, settings: QueueSettings) -> None:
    state.record_instance(I1, "java", "free", fence=1)
    state.waiting(S1, "java")
    state.contended(S1)
    keys = {k.decode() for k in state.client.keys("*")}
    assert keys == {"p1:warmpool:pool:state", "p1:warmpool:pool:waiting",
                    f"p1:warmpool:metrics:contended:{S1}"}
    assert state.client.pttl(f"p1:warmpool:metrics:contended:{S1}") > 0


def test_waiting_keeps_the_first_time_and_clears(state: PoolState) -> None:
    state.waiting(S1, "java")
    first = state.client.hget(state.waiting_key, S1)
    state.waiting(S1, "java")
    assert state.client.hget(state.waiting_key, S1) == first
    state.not_waiting(S1)
    assert state.client.hget(state.waiting_key, S1) is None


def test_prune_forgets_only_this_pools_sessions_gone_before_the_resync(
    state: PoolState, client: redis.Redis
) -> None:
    client.hset(state.waiting_key, mapping={
        S1: "java|1000",    # this pool, listed by the resync: kept
        S2: "java|1000",    # this pool, not listed, waiting before the resync: deleted
        S3: "java|1000",    # another namespace: kept
        "session/ns1/s9": "python|1000",  # another pool: kept
        "session/ns1/s7": "java|5000",    # started waiting after the resync listed: kept
        "garbage": "x|1",                 # not a key: dropped
    })
    gone = state.prune_waiting("ns1", "java", keep={S1}, before_ms=2000)
    assert sorted(gone) == ["garbage", S2]
    left = {k.decode() for k in client.hkeys(state.waiting_key)}
    assert left == {S1, S3, "session/ns1/s9", "session/ns1/s7"}


class SetClock:
    """The server's clock as a test sets it (ms)."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


def test_contention_wait_is_measured_once(client: redis.Redis, settings: QueueSettings) -> None:
    clock = SetClock(1_000_000)
    state = PoolState(client, settings, clock)
    assert state.acquired(S1) is None  # no contention: nothing observed
    state.contended(S1)  # found busy now
    clock.now += 700
    state.contended(S1)  # a second busy try keeps the first time
    clock.now += 800
    assert state.acquired(S1) == 1.5
    assert state.acquired(S1) is None


def test_snapshot_counts_by_appdefinition_and_state(state: PoolState, client: redis.Redis) -> None:
    state.record_instance(I1, "java", "claimed", fence=1)
    state.record_instance(I2, "java", "free", fence=2)
    state.record_instance(I3, "python", "outdated", fence=3)
    now = state.now_ms()
    client.hset(state.waiting_key, mapping={S1: f"java|{now - 90_000}", S2: f"java|{now}"})
    snap = state.snapshot()
    assert snap.instances == {("java", "claimed"): 1, ("java", "free"): 1,
                              ("python", "outdated"): 1}
    assert snap.waiting == {"java": 2}
    assert 89 <= snap.oldest_waiting["java"] <= 95
    assert snap.appdefs == {"java", "python"}


# --- the cluster collector ------------------------------------------------------------------------


def route(key: str) -> str:
    return "job"


def deliver(jobs: Jobs) -> JobContext | str:
    """Fetch the next message as dramatiq's consumer does, and begin it."""
    lo = jobs.queue.layout
    rid = jobs.client.lpop(lo.messages_list)
    assert rid is not None
    msg = Message.decode(jobs.client.hget(lo.messages, rid))
    return jobs.begin(msg.args[0], msg.message_id, ("", rid.decode()))


def test_cluster_collector_exports_queue_and_pool(
    client: redis.Redis, settings: QueueSettings, state: PoolState
) -> None:
    jobs = Jobs(client, settings, router=route)
    bad = "instance/ns1/java/5"
    for _ in range(settings.max_failures):  # fails until it is dead-lettered
        jobs.queue.add(bad)
        ctx = deliver(jobs)
        assert isinstance(ctx, JobContext)
        jobs.finish(ctx, RuntimeError("boom"))
    jobs.queue.add_many([I1, I2, S1, "pool/ns1/java"])
    jobs.queue.add_after("instance/ns1/java/9", 60)
    ctx = deliver(jobs)  # I1 runs (its lease is held): running, not waiting
    assert isinstance(ctx, JobContext) and ctx.key == I1
    state.record_instance(I1, "java", "claimed", fence=1)
    state.record_instance(I2, "java", "free", fence=1)
    state.waiting(S1, "java")

    registry = CollectorRegistry()
    registry.register(ClusterCollector(client, settings))
    got = samples(registry)
    assert value(got, "warmpool_metrics_redis_up") == 1
    assert value(got, "warmpool_workqueue_depth", kind="instance") == 1  # I2 (I1 runs)
    assert value(got, "warmpool_workqueue_depth", kind="session") == 1
    assert value(got, "warmpool_workqueue_depth", kind="pool") == 1
    assert value(got, "warmpool_workqueue_running", kind="instance") == 1
    assert value(got, "warmpool_workqueue_delayed", kind="instance") == 1
    assert value(got, "warmpool_workqueue_dead_letters", kind="instance") == 1
    assert value(got, "warmpool_workqueue_dead_letters", kind="session") == 0
    assert value(got, "warmpool_workqueue_oldest_waiting_seconds", kind="session") >= 0
    assert value(got, "warmpool_pool_instances", appdefinition="java", state="claimed") == 1
    assert value(got, "warmpool_pool_instances", appdefinition="java", state="free") == 1
    assert value(got, "warmpool_pool_instances", appdefinition="java", state="outdated") == 0
    assert value(got, "warmpool_sessions_waiting", appdefinition="java") == 1
    # No label carries an instance id, a Session name or a key.
    for (_, labels) in got:
        for _, v in labels:
            assert "/" not in v and "s1" not in v

    jobs.queue.purge_dead()
    assert value(samples(registry), "warmpool_workqueue_dead_letters", kind="instance") == 0


def test_read_queue_agrees_with_the_inspector(client: redis.Redis, settings: QueueSettings) -> None:
    """The exported depth is the CLI's "ready" (waiting, not running), and the oldest wait
    counts a key re-added while it runs, as the CLI's does: one definition, the Inspector's."""
    from warmpool.queue.inspect import Inspector

    jobs = Jobs(client, settings, router=route)
    jobs.queue.add_many([I1, I2, S1])
    snap = read_queue(client, settings)
    stats = Inspector(client, settings).stats()
    assert sum(snap.depth.values()) == stats.waiting == stats.ready == 3
    assert sum(snap.dead.values()) == stats.dead == 0

    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext) and ctx.key == I1
    client.hset(Layout.of(settings).added_at, I2, Inspector(client, settings).now_ms() - 60_000)
    jobs.queue.add(I1)  # a rerun: waiting, but not ready
    snap = read_queue(client, settings)
    stats = Inspector(client, settings).stats()
    assert (stats.waiting, stats.rerun, stats.ready, stats.running) == (3, 1, 2, 1)
    assert sum(snap.depth.values()) == stats.ready
    assert sum(snap.running.values()) == stats.running
    assert stats.oldest_wait_seconds is not None
    assert max(snap.oldest_waiting.values()) == pytest.approx(stats.oldest_wait_seconds, abs=1)
    assert snap.oldest_waiting["instance"] >= 59


class Broken(fakeredis.FakeRedis):
    def pipeline(self, *a, **kw):  # type: ignore[no-untyped-def,override]
        raise redis.ConnectionError("down")


def test_redis_down_is_a_gauge_not_a_failed_scrape(settings: QueueSettings) -> None:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(Broken(), settings))
    got = samples(registry)
    assert value(got, "warmpool_metrics_redis_up") == 0
    assert not any(name == "warmpool_workqueue_depth" for name, _ in got)
