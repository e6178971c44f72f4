"""`warmpool.harness.quiet`: what `wait_quiet(since=mark)` counts as "the work caused by the
change made after the mark has run", on the run log's lists as `workers.runlog` writes them."""

from __future__ import annotations

import pytest
import redis

from warmpool.harness.quiet import NotQuiet, mark, quiet, wait_quiet
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings

SETTINGS = QueueSettings(redis_url="redis://unused", prefix="q:warmpool:", namespace="q:dramatiq")
LAYOUT = Layout.of(SETTINGS)


def started(client: redis.Redis, key: str) -> None:
    """What a worker's run does to these keys when it starts: its lease (a fence from the
    counter, the key in flight), then the run log's start, as `workers.runlog` writes it."""
    fence = client.incr(LAYOUT.fence)
    client.zadd(LAYOUT.inflight, {key: fence})
    client.rpush(LAYOUT.runs_started, f"1.0 {key}")


def ended(client: redis.Redis, key: str) -> None:
    client.rpush(LAYOUT.runs_ended, f"2.0 {key}")
    client.zrem(LAYOUT.inflight, key)


def test_a_run_under_way_at_the_mark_does_not_count(client: redis.Redis) -> None:
    started(client, "session/ns/a")
    since = mark(client, SETTINGS)
    ended(client, "session/ns/a")  # the old run's end
    assert quiet(client, SETTINGS, since, ["session/ns/a"]).keys_not_run == ("session/ns/a",)
    started(client, "session/ns/a")
    assert quiet(client, SETTINGS, since, ["session/ns/a"]).keys_not_run == ("session/ns/a",)
    ended(client, "session/ns/a")  # a run started after the mark, ended
    assert not quiet(client, SETTINGS, since, ["session/ns/a"])


def test_every_named_key_must_have_run(client: redis.Redis) -> None:
    since = mark(client, SETTINGS)
    started(client, "instance/ns/java/1")
    ended(client, "instance/ns/java/1")
    pending = quiet(client, SETTINGS, since, ["instance/ns/java/1", "instance/ns/java/2"])
    assert pending.keys_not_run == ("instance/ns/java/2",)


def test_without_keys_one_run_must_have_ended(client: redis.Redis) -> None:
    since = mark(client, SETTINGS)
    assert quiet(client, SETTINGS, since).no_run_yet
    started(client, "pool/ns/java")
    assert quiet(client, SETTINGS, since).queue is not None  # it runs
    ended(client, "pool/ns/java")
    assert not quiet(client, SETTINGS, since)


def test_without_keys_workers_need_no_run_log(client: redis.Redis) -> None:
    """Workers deployed as in production log no runs: a lease taken since the mark (the
    fence counter moved on) and an idle queue are the proof a run began and ended."""
    client.incr(LAYOUT.fence)  # earlier work
    since = mark(client, SETTINGS)
    assert quiet(client, SETTINGS, since).no_run_yet
    client.incr(LAYOUT.fence)  # a worker takes a lease
    client.zadd(LAYOUT.inflight, {"pool/ns/java": 2})
    assert quiet(client, SETTINGS, since).queue is not None
    client.zrem(LAYOUT.inflight, "pool/ns/java")
    assert not quiet(client, SETTINGS, since)


@pytest.mark.parametrize("busy", ["dirty", "inflight", "delayed"])
def test_the_queue_must_be_idle(client: redis.Redis, busy: str) -> None:
    since = mark(client, SETTINGS)
    started(client, "pool/ns/java")
    ended(client, "pool/ns/java")
    if busy == "dirty":
        client.sadd(LAYOUT.dirty, "instance/ns/java/1")
    else:
        client.zadd(getattr(LAYOUT, busy), {"instance/ns/java/1": 1})
    pending = quiet(client, SETTINGS, since, ["pool/ns/java"])
    assert not pending.keys_not_run and pending.queue is not None
    with pytest.raises(NotQuiet, match="queue not idle") as failure:
        wait_quiet(client, SETTINGS, since, ["pool/ns/java"], timeout=0.0)
    assert isinstance(failure.value, AssertionError)


def test_a_run_log_lost_with_redis_is_said(client: redis.Redis) -> None:
    started(client, "pool/ns/java")
    ended(client, "pool/ns/java")
    since = mark(client, SETTINGS)
    client.flushall()
    pending = quiet(client, SETTINGS, since)
    assert pending.log_lost
    assert "lost its data" in str(pending)


def test_the_timeout_says_what_was_pending(client: redis.Redis) -> None:
    since = mark(client, SETTINGS)
    with pytest.raises(NotQuiet, match=r"keys with no run .*\['session/ns/s1'\]"):
        wait_quiet(client, SETTINGS, since, ["session/ns/s1"], timeout=0.0)


def test_a_timer_far_ahead_is_not_pending_work_a_retry_soon_is(client: redis.Redis) -> None:
    """Issue #29: a schedule's next edge, a Session's deadline, a probe's next attempt are
    delayed keys due later; the queue is quiet with them. A retry due within the horizon is
    work still owed."""
    since = mark(client, SETTINGS)
    started(client, "pool/ns/java")
    ended(client, "pool/ns/java")
    now_ms = int(client.time()[0]) * 1000
    client.zadd(LAYOUT.delayed, {"pool/ns/java": now_ms + 3_600_000})
    assert not quiet(client, SETTINGS, since)
    client.zadd(LAYOUT.delayed, {"instance/ns/java/1": now_ms + 500})
    assert quiet(client, SETTINGS, since).queue is not None


def test_a_timer_kinds_key_due_soon_is_not_pending_work(client: redis.Redis) -> None:
    """A URL probe of an instance that never answers re-delays its key every few seconds
    for minutes, and a Session's deadline job looks again when due: keys of those kinds do
    not keep the queue from quiet however soon they are due; any other soon-due key does."""
    since = mark(client, SETTINGS)
    started(client, "pool/ns/java")
    ended(client, "pool/ns/java")
    now_ms = int(client.time()[0]) * 1000
    client.zadd(LAYOUT.delayed, {"probe/ns/s1": now_ms + 500, "timeout/ns/s1": now_ms + 800})
    assert not quiet(client, SETTINGS, since)
    client.zadd(LAYOUT.delayed, {"session/ns/s1": now_ms + 900})
    assert quiet(client, SETTINGS, since).queue is not None


def test_timer_kinds_keys_waiting_or_running_are_not_pending_work(client: redis.Redis) -> None:
    """A namespace with a few dozen Sessions whose URL never answers always has probes
    waiting and running, each attempt up to its timeout: not work a change caused. A key of
    any other kind beside them is."""
    since = mark(client, SETTINGS)
    started(client, "pool/ns/java")
    ended(client, "pool/ns/java")
    client.sadd(LAYOUT.dirty, "probe/ns/s1", "timeout/ns/s2")
    started(client, "probe/ns/s3")
    assert not quiet(client, SETTINGS, since, ["pool/ns/java"])
    client.sadd(LAYOUT.dirty, "session/ns/s4")
    assert quiet(client, SETTINGS, since, ["pool/ns/java"]).queue is not None
    client.srem(LAYOUT.dirty, "session/ns/s4")
    started(client, "instance/ns/java/1")
    with pytest.raises(NotQuiet, match=r"running \[.*'instance/ns/java/1'"):
        wait_quiet(client, SETTINGS, since, ["pool/ns/java"], timeout=0.0)
