"""Settings, routing, inspection, the handler registry and the worker CLI."""

from __future__ import annotations

import fakeredis
import pytest
import redis
from click.testing import CliRunner

from tests.unit.test_queue_protocol import deliver
from warmpool.queue.inspect import Inspector
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.layout import Layout
from warmpool.queue.routing import actor_for_key
from warmpool.queue.settings import QueueSettings


def test_settings_from_env_and_overrides() -> None:
    env = {
        "WARMPOOL_REDIS_URL": "redis://h:1/2",
        "WARMPOOL_QUEUE_LEASE_TTL": "12.5",
        "WARMPOOL_QUEUE_MAX_FAILURES": "20",
        "WARMPOOL_QUEUE_QUEUE_NAME": "q",
    }
    s = QueueSettings.from_env(env, max_failures=None, prefix="p:")
    assert (s.redis_url, s.lease_ttl, s.max_failures, s.queue_name, s.prefix) == (
        "redis://h:1/2",
        12.5,
        20,
        "q",
        "p:",
    )
    assert QueueSettings.from_env({}).redis_url is None
    assert s.lease_ttl_ms == 12500
    assert QueueSettings().renew_period == pytest.approx(5 / 3)


@pytest.mark.parametrize(
    "bad", [{"lease_ttl": 0}, {"max_failures": 0}, {"queue_name": "x.DQ"}, {"batch": 0}]
)
def test_settings_reject_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        QueueSettings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [
    {"prefix": "wp\n:"}, {"namespace": "dramatiq\0"}, {"queue_name": "q\r"},
    {"prefix": "p" * 201},
])
def test_settings_refuse_names_the_scripts_could_not_hold(bad: dict[str, str]) -> None:
    """The names become string constants in the Lua scripts: a line break or a control
    character is refused by name, with the setting named, before any script is built."""
    (name,) = bad
    with pytest.raises(ValueError, match=f"queue setting {name} must be printable"):
        QueueSettings(**bad)  # type: ignore[arg-type]
    assert QueueSettings(prefix='odd "quoted\\" prefix:').prefix  # escaped, not refused


def test_layout_keeps_dramatiq_names() -> None:
    lo = Layout.of(QueueSettings())
    assert lo.messages_list == "dramatiq:warmpool"
    assert lo.xq_messages == "dramatiq:warmpool.XQ.msgs"
    assert lo.acks("w1") == "dramatiq:__acks__.w1.warmpool"
    assert lo.heartbeats == "dramatiq:__heartbeats__"
    assert lo.lease("instance/ns/app/3") == "warmpool:lease:instance/ns/app/3"
    assert lo.claims_queue == "warmpool-claims" == QueueSettings().claims_queue_name
    assert lo.claims_messages_list == "dramatiq:warmpool-claims"
    assert lo.queue_of("session/ns/s") == "warmpool-claims"
    assert lo.queue_of("instance/ns/app/3") == lo.queue_of("pool/ns/app") == "warmpool"
    assert lo.triggers("instance/ns/app/3") == "warmpool:trig:instance/ns/app/3"
    assert lo.own("instance/ns/app/3") == "warmpool:own:instance/ns/app/3"


def test_routing_by_key_kind() -> None:
    assert actor_for_key("instance/ns/app/3") == "reconcile_instance"
    assert actor_for_key("session/ns/s1") == "claim_session"
    assert actor_for_key("pool/ns/app") == "resync_pool"
    with pytest.raises(ValueError):
        actor_for_key("nonsense")


@pytest.fixture
def jobs() -> Jobs:
    return Jobs(fakeredis.FakeRedis(), QueueSettings(), router=lambda k: "job")


def _deliver(jobs: Jobs) -> JobContext:
    """The next message delivered and started (not skipped)."""
    ctx = deliver(jobs)
    assert isinstance(ctx, JobContext)
    return ctx


def test_inspector_key_states(jobs: Jobs) -> None:
    insp = Inspector(jobs.client, jobs.settings)
    assert insp.key("a").state == "idle"
    jobs.queue.add("a")
    st = insp.key("a")
    assert (st.state, st.waiting, st.running) == ("waiting", True, False)
    assert st.waiting_seconds is not None and st.waiting_seconds >= 0
    ctx = _deliver(jobs)
    jobs.queue.add("a")
    st = insp.key("a")
    assert (st.state, st.waiting, st.running, st.fence) == ("running", True, True, ctx.fence)
    assert st.holder is not None and st.holder in ctx.token
    assert st.lease_ttl_seconds is not None and 0 < st.lease_ttl_seconds <= 10
    jobs.finish(ctx, RuntimeError("nope"))  # re-added: reruns at once
    ctx = _deliver(jobs)
    jobs.finish(ctx, RuntimeError("nope again"))
    st = insp.key("a")
    assert (st.state, st.failures) == ("delayed", 2)
    assert st.delayed_seconds is not None and "nope again" in (st.last_error or "")
    stats = insp.stats()
    assert (stats.waiting, stats.running, stats.delayed, stats.failing) == (0, 0, 1, 1)
    assert [d[0] for d in insp.delayed()] == ["a"]


def test_inspector_stats_and_workers(jobs: Jobs) -> None:
    insp = Inspector(jobs.client, jobs.settings)
    for k in ("a", "b", "c"):
        jobs.queue.add(k)
    ctx = _deliver(jobs)
    jobs.client.zadd(jobs.queue.layout.heartbeats, {"w1": 0})
    s = insp.stats()
    assert (s.waiting, s.messages, s.running, s.dead, s.workers_alive) == (2, 2, 1, 0, 0)
    assert s.oldest_wait_seconds is not None
    assert [r.key for r in insp.running()] == [ctx.key]
    (w,) = insp.workers()
    assert w.worker_id == "w1" and not w.alive


def test_census_lists_what_stats_counts(jobs: Jobs) -> None:
    """One definition of each state: the census (the metrics' breakdown by kind) holds the
    keys the stats (the CLI's counts) count, a rerun key waiting and running at once."""
    insp = Inspector(jobs.client, jobs.settings)
    for k in ("a", "b", "c"):
        jobs.queue.add(k)
    ctx = _deliver(jobs)
    jobs.queue.add(ctx.key)  # re-added while it runs: a rerun
    jobs.queue.add_after("d", 60)
    stats, census = insp.stats(), insp.census()
    assert census.rerun == {ctx.key} and census.ready == {"a", "b", "c"} - {ctx.key}
    assert (stats.waiting, stats.rerun, stats.ready) == (
        len(census.waiting), len(census.rerun), len(census.ready)) == (3, 1, 2)
    assert (stats.running, stats.delayed) == (len(census.running), len(census.delayed)) == (1, 1)
    assert set(census.waited) == census.waiting  # a rerun key waits too
    assert stats.oldest_wait_seconds is not None
    assert abs(max(census.waited.values()) - stats.oldest_wait_seconds) < 1
    assert insp.reruns() == [(ctx.key, ctx.lease.holder)]
    assert [k for k, _ in insp.pending()] == sorted(census.ready)


def test_a_dead_key_shows_its_letter(jobs: Jobs) -> None:
    s = jobs.settings.replace(max_failures=1)
    jobs = Jobs(jobs.client, s, router=lambda k: "job")
    insp = Inspector(jobs.client, s)
    jobs.queue.add("a")
    jobs.finish(_deliver(jobs), RuntimeError("for good"))
    st = insp.key("a")
    (letter,) = jobs.queue.list_dead()
    assert (st.state, st.dead, st.dead_letter_id) == ("dead", True, letter.message_id)
    # dead-lettering moves the count and the error into the letter: shown from there
    assert st.failures == 1 and "for good" in (st.last_error or "")
    assert insp.stats().dead == len(insp.census().dead) == 1
    jobs.queue.purge_dead()
    assert insp.key("a").dead_letter_id is None


def test_handler_registry() -> None:
    from workers import runtime

    def handler(ctx: JobContext) -> None:
        pass

    before = runtime.registered()
    with runtime.using({}):
        with pytest.raises(runtime.NoHandler):
            runtime.handler_for("pool")
        assert runtime.register("pool", handler) is handler
        assert runtime.handler_for("pool") is handler
        with pytest.raises(ValueError):
            runtime.register("bogus", handler)
    assert runtime.registered() == before


def test_worker_broker_declares_keyed_actors() -> None:
    from dramatiq.middleware import Retries

    from warmpool.queue.broker import keyed_middleware
    from workers import runtime
    from workers.runtime import build_worker_broker

    client: redis.Redis = fakeredis.FakeRedis()
    with runtime.using({}):  # no handler's hook (the worker cache) when another test loaded one
        broker = build_worker_broker(QueueSettings(redis_url="redis://x"), client=client)
    for name in ("reconcile_instance", "claim_session", "resync_pool"):
        actor = broker.get_actor(name)
        assert actor.options["keyed"] is True
    claim = broker.get_actor("claim_session")
    assert claim.queue_name == "warmpool-claims"
    for name in ("reconcile_instance", "resync_pool"):
        bulk = broker.get_actor(name)
        assert bulk.queue_name == "warmpool" and bulk.priority > claim.priority
    assert not any(isinstance(m, Retries) for m in broker.middleware)
    assert broker.middleware[0] is keyed_middleware(broker)
    assert broker.heartbeat_timeout == 5000


def test_worker_cli_help() -> None:
    from workers.cli import worker

    result = CliRunner().invoke(worker, ["--help"])
    assert result.exit_code == 0
    assert "--processes" in result.output and "--threads" in result.output
