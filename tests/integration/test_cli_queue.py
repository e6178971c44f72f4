"""`warmpool queue list | queue show | locks | workers | dead-letters`, run as a person runs them.

Each command is a subprocess (`python -m warmpool.cli ...`) that finds the test's queue only
through the environment (WARMPOOL_REDIS_URL and the key layout WARMPOOL_QUEUE_PREFIX /
WARMPOOL_QUEUE_NAMESPACE), against a real Redis and real worker processes running
`workers.probe`, whose runs are steered through Redis (hold a key, fail a key).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.cli_run import assert_one_line_error, clean_env, first_column, run, run_json
from tests.redis_server import isolated
from tests.waiting import wait_for
from warmpool.cluster.local import free_port
from warmpool.queue.embedded import LOCAL_URL
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.settings import QueueSettings
from workers import probe
from workers.process import WorkerPool

pytestmark = pytest.mark.redis

UNREACHABLE = "redis://127.0.0.1:1/0"


def cli_env(settings: QueueSettings | None, **extra: str) -> dict[str, str]:
    if settings is not None:
        assert settings.redis_url
        extra = {"WARMPOOL_REDIS_URL": settings.redis_url,
                 "WARMPOOL_QUEUE_PREFIX": settings.prefix,
                 "WARMPOOL_QUEUE_NAMESPACE": settings.namespace, **extra}
    return clean_env(**extra)


@pytest.fixture
def settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    # Two failures in a row make a dead letter, so the test sees one in milliseconds.
    with isolated(redis_url, redis_client, max_failures=2, drain_timeout=5) as s:
        yield s


@pytest.fixture
def queue(settings: QueueSettings, redis_client: redis.Redis) -> KeyedQueue:
    return KeyedQueue(redis_client, settings)


@pytest.fixture
def workers(settings: QueueSettings) -> Iterator[WorkerPool]:
    pool = WorkerPool(settings, processes=2, threads=2, modules=("workers.probe",))
    pool.start()
    yield pool
    pool.stop(timeout=15)


def test_queue_lists_pending_keys_oldest_first_and_delayed_ones(settings, queue) -> None:
    env = cli_env(settings)
    for k in ("pool/ns/a", "pool/ns/b", "session/ns/s1"):
        queue.add(k)
    queue.add_after("instance/ns/a/1", 300)

    doc = run_json(env, "queue", "list")
    assert doc["redis"] == settings.redis_url and doc["prefix"] == settings.prefix
    (row,) = doc["queues"]
    assert row["name"] == "warmpool"
    assert (row["ready"], row["rerun"], row["delayed"], row["in_flight"], row["dead"]) == (
        3, 0, 1, 0, 0)
    assert row["oldest_age_seconds"] is not None and row["oldest_age_seconds"] >= 0
    assert doc["workers_alive"] == 0
    # in the order they run: the claim first (its own queue, ahead of bulk work)
    assert [p["key"] for p in doc["pending"]] == ["session/ns/s1", "pool/ns/a", "pool/ns/b"]
    assert (row["messages"], row["claim_messages"]) == (3, 1)
    assert [d["key"] for d in doc["delayed"]] == ["instance/ns/a/1"]
    assert 0 < doc["delayed"][0]["due_in_seconds"] <= 300

    text = run(env, "queue", "list").stdout
    assert "pool/ns/a" in text and "instance/ns/a/1" in text and "warmpool" in text
    assert run_json(env, "queue", "show", "pool/ns/b")["state"] == "waiting"
    assert run_json(env, "queue", "show", "instance/ns/a/1")["state"] == "delayed"
    idle = run_json(env, "queue", "show", "pool/ns/never")
    assert idle["state"] == "idle" and idle["failures"] == 0 and idle["holder"] is None


def test_a_running_key_its_lease_and_its_worker_seen_from_another_process(
    settings, queue, workers, redis_client
) -> None:
    env = cli_env(settings)
    wait_for(lambda: sum(w["alive"] for w in run_json(env, "workers")["workers"]) == 2,
             timeout=30, message="two live workers in `warmpool workers`")
    key = "instance/ns/java/1"
    redis_client.hset(probe.probe_key(settings, "hold"), key, 60)
    queue.add(key)
    wait_for(lambda: redis_client.llen(probe.probe_key(settings, "holding")) == 1, timeout=30)
    holding_pid = json.loads(redis_client.lindex(probe.probe_key(settings, "holding"), 0))[1]
    assert queue.add(key) == "rerun"  # runs once more after the held run

    (lock,) = [lk for lk in run_json(env, "locks")["locks"] if lk["kind"] == "lease"]
    assert lock["key"] == key
    assert f":{holding_pid}:" in lock["holder"]
    assert isinstance(lock["fence"], int) and lock["fence"] > 0
    assert 0 < lock["ttl_seconds"] <= settings.lease_ttl

    shown = run_json(env, "queue", "show", key)
    assert shown["state"] == "running" and shown["running"] and shown["rerun"]
    assert (shown["holder"], shown["fence"]) == (lock["holder"], lock["fence"])
    assert shown["lease_ttl_seconds"] > 0

    doc = run_json(env, "queue", "list")
    assert (doc["queues"][0]["in_flight"], doc["queues"][0]["rerun"]) == (1, 1)
    assert doc["rerun"] == [{"key": key, "holder": lock["holder"]}]
    assert doc["workers_alive"] == 2

    w = run_json(env, "workers")
    assert len(w["workers"]) == 2 and all(x["alive"] for x in w["workers"])
    assert all(x["heartbeat_age_seconds"] < settings.heartbeat_timeout for x in w["workers"])
    assert sum(x["in_flight"] for x in w["workers"]) >= 1
    (holder,) = w["lease_holders"]
    # Each worker names its process, which is how a lease holder is named.
    assert holder["process"] in {x["process"] for x in w["workers"]}
    assert holder["process"].endswith(f":{holding_pid}") and holder["keys"] == [key]

    for args in (("locks",), ("workers",), ("queue", "list"), ("queue", "show", key)):
        out = run(env, *args).stdout
        assert key in out or "IN-FLIGHT" in out

    redis_client.sadd(probe.probe_key(settings, "release"), key)
    wait_for(lambda: run_json(env, "queue", "show", key)["state"] == "idle", timeout=30)
    assert run_json(env, "locks")["locks"] == [] or all(
        lk["kind"] == "maintenance" for lk in run_json(env, "locks")["locks"])


def test_dead_letters_list_show_retry_and_purge(settings, queue, workers, redis_client) -> None:
    env = cli_env(settings)
    fail = probe.probe_key(settings, "fail")
    keys = ["instance/ns/java/7", "pool/ns/java", "session/ns/s9"]
    for k in keys:
        redis_client.hset(fail, k, 100)
        queue.add(k)

    def dead_keys() -> set[str]:
        return {d["key"] for d in run_json(env, "dead-letters", "list")["dead_letters"]}

    wait_for(lambda: dead_keys() == set(keys), timeout=30, message="three dead letters")
    letters = run_json(env, "dead-letters", "list")["dead_letters"]
    assert all("ProbeFailure" in d["error"] for d in letters)
    assert all(d["age_seconds"] >= 0 and d["id"] for d in letters)

    shown = run_json(env, "queue", "show", keys[0])
    assert shown["state"] == "dead" and shown["dead"] and shown["dead_letter_id"]
    assert shown["failures"] == settings.max_failures
    assert "ProbeFailure" in shown["last_error"]
    assert run_json(env, "queue", "list")["queues"][0]["dead"] == 3
    table = run(env, "dead-letters", "list").stdout
    assert keys[0] in table and "ProbeFailure" in table
    assert "ProbeFailure" in run(env, "queue", "show", keys[0]).stdout

    # A key with no dead letter: exit 3, one line.
    assert_one_line_error(run(env, "dead-letters", "retry", "pool/ns/none", code=3),
                          "pool/ns/none")
    # Neither KEY nor --all, or both: a usage error.
    run(env, "dead-letters", "retry", code=2)
    run(env, "dead-letters", "retry", keys[0], "--all", code=2)

    # Fixed: retry one by key; it runs and its dead letter is gone.
    redis_client.hdel(fail, keys[0])
    assert run_json(env, "dead-letters", "retry", keys[0])["retried"] == [
        {"key": keys[0], "id": None, "result": "enqueued"}]
    wait_for(lambda: dead_keys() == set(keys[1:]), timeout=30)
    wait_for(lambda: run_json(env, "queue", "show", keys[0])["state"] == "idle", timeout=30)
    ran = [json.loads(r)[0] for r in redis_client.lrange(probe.probe_key(settings, "log"), 0, -1)]
    assert keys[0] in ran

    # Still failing: --all retries both, and they die again.
    retried = run_json(env, "dead-letters", "retry", "--all")["retried"]
    assert sorted(r["key"] for r in retried) == sorted(keys[1:])
    assert {r["result"] for r in retried} == {"enqueued"}
    redis_client.hset(fail, keys[1], 100)
    redis_client.hset(fail, keys[2], 100)
    wait_for(lambda: dead_keys() == set(keys[1:]), timeout=30)

    # Purge: refused off a terminal without --yes (exit 2, nothing dropped), done with it.
    assert_one_line_error(run(env, "dead-letters", "purge", code=2), "--yes")
    assert dead_keys() == set(keys[1:])
    assert run_json(env, "dead-letters", "purge", "--yes") == {"purged": 2}
    assert dead_keys() == set()
    assert "no dead letters" in run(env, "dead-letters", "list").stdout


@pytest.mark.parametrize("args", [
    ("queue", "list"), ("queue", "show", "pool/ns/a"), ("locks",), ("workers",),
    ("dead-letters", "list"), ("dead-letters", "retry", "--all"),
    ("dead-letters", "purge", "--yes"),
])
def test_unreachable_redis_is_one_line_and_exit_4(args: tuple[str, ...]) -> None:
    proc = run(cli_env(None, WARMPOOL_REDIS_URL=UNREACHABLE), *args, code=4)
    assert_one_line_error(proc, "127.0.0.1:1", "WARMPOOL_REDIS_URL")
    assert proc.stdout == ""


def test_flag_beats_environment_and_debug_shows_the_traceback() -> None:
    env = cli_env(None, WARMPOOL_REDIS_URL=LOCAL_URL)
    proc = run(env, "locks", "--redis-url", "redis://:s3cret@127.0.0.1:1/0", code=4)
    assert_one_line_error(proc, "from --redis-url", "127.0.0.1:1")
    assert "s3cret" not in proc.stderr  # the password is never shown
    proc = run(env, "queue", "--redis-url", UNREACHABLE, "show", "pool/ns/a", code=4)
    assert_one_line_error(proc, "from --redis-url")  # the group's flag reaches `show`
    debug = run(cli_env(None, WARMPOOL_REDIS_URL=UNREACHABLE), "--debug", "queue", "list",
                code=4)
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("error: nothing answers at")


def test_bad_values_exit_2(settings) -> None:
    env = cli_env(settings)
    assert_one_line_error(run(env, "queue", "show", "not-a-key", code=2), "not-a-key")
    assert_one_line_error(run(cli_env(None, WARMPOOL_REDIS_URL="http://x"), "locks", code=2),
                          "bad Redis URL")
    assert_one_line_error(
        run(cli_env(settings, WARMPOOL_QUEUE_LEASE_TTL="soon"), "queue", "list", code=2),
        "WARMPOOL_QUEUE_")


def test_without_configuration_the_default_local_redis_is_read(redis_url: str) -> None:
    if redis_url != LOCAL_URL:
        pytest.skip(f"the test Redis is {redis_url}, not the default {LOCAL_URL}")
    doc = run_json(cli_env(None), "queue", "list")
    assert doc["redis"] == LOCAL_URL and doc["prefix"] == "warmpool:"


def test_help_names_each_option_and_its_environment_variable() -> None:
    env = cli_env(None)
    for args in (("queue", "list"), ("queue", "show"), ("locks",), ("workers",),
                 ("dead-letters", "list"), ("dead-letters", "retry"),
                 ("dead-letters", "purge")):
        text = run(env, *args, "--help").stdout
        assert "--redis-url" in text and "WARMPOOL_REDIS_URL" in text, args
        assert "-o, --output [json|yaml|wide]" in text and "-o json | -o yaml:" in text, args
        assert "--json" in text and "Same as -o json" in text, args
        assert "WARMPOOL_QUEUE_PREFIX" in text, args


def test_bare_groups_print_their_help() -> None:
    """`warmpool dead-letters` printed its help as a cut-short `error: Usage: ...` line."""
    for group in ("queue", "dead-letters"):
        proc = run(cli_env(None), group)
        assert proc.stdout.startswith(f"Usage: warmpool {group} [OPTIONS] COMMAND")
        assert "Commands:" in proc.stdout and proc.stderr == ""


#: A key longer than any terminal's line here: folded at 80 columns it could not be pasted.
LONG_NS = "theia-cloud-" + "a" * 51  # 63 characters, the longest namespace name
LONG_KEY = f"instance/{LONG_NS}/java-application-definition/12"
DELAYED_KEY = f"pool/{LONG_NS}/java-application-definition"


def test_a_printed_key_pastes_into_queue_show_at_any_width(
    settings, queue, workers, redis_client
) -> None:
    """The first cell of a row of `warmpool locks` and of `warmpool queue list` is the key,
    whole, on a 30-column terminal as on a 300-column one: pasted into `warmpool queue show`
    it shows that key. `-o yaml` is the `-o json` document; `-o wide` adds the holder."""
    env = cli_env(settings)
    # held until released below: the many commands run here outlast a short hold when loaded
    redis_client.hset(probe.probe_key(settings, "hold"), LONG_KEY, 600)
    queue.add(LONG_KEY)
    queue.add_after(DELAYED_KEY, 300)
    wait_for(lambda: redis_client.llen(probe.probe_key(settings, "holding")) == 1, timeout=30)

    for columns in (30, 300):
        (held,) = first_column(run(env, "locks", columns=columns).stdout, "instance/")
        assert held == LONG_KEY, columns
        shown = run_json(env, "queue", "show", held)
        assert (shown["key"], shown["state"]) == (LONG_KEY, "running")
        text = run(env, "queue", "show", held, columns=columns).stdout
        assert text.splitlines()[0] == f"{LONG_KEY}: running"

        (delayed,) = first_column(run(env, "queue", "list", columns=columns).stdout, "pool/")
        assert delayed == DELAYED_KEY
        assert run_json(env, "queue", "show", delayed)["state"] == "delayed"

    as_yaml = yaml.safe_load(run(env, "locks", "-o", "yaml").stdout)
    as_json = run_json(env, "locks")

    def leases(doc: dict[str, Any]) -> list[dict[str, Any]]:
        # Two commands, two moments: the held lease is the same in both, a maintenance lock
        # (a worker's recovery pass, a fraction of a second) may be in one and not the other.
        return [{k: v for k, v in lk.items() if k != "ttl_seconds"}
                for lk in doc["locks"] if lk["kind"] == "lease"]

    assert leases(as_yaml) == leases(as_json) != []
    (lease,) = [lk for lk in as_json["locks"] if lk["kind"] == "lease"]
    wide = run(env, "locks", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["KEY", "KIND", "PROCESS", "TTL", "FENCE", "HOLDER"]
    (row,) = [line for line in wide if line.startswith(LONG_KEY)]
    assert row.split()[-1] == lease["holder"]
    assert yaml.safe_load(run(env, "queue", "list", "-o", "yaml").stdout)["delayed"][0][
        "key"] == DELAYED_KEY

    redis_client.sadd(probe.probe_key(settings, "release"), LONG_KEY)
    wait_for(lambda: run_json(env, "queue", "show", LONG_KEY)["state"] == "idle", timeout=30)


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own that wants a password: the URL of it, password and all."""
    server = shutil.which("redis-server")
    assert server, "redis-server is needed (.ci/run installs it)"
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", "right",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"redis://:right@127.0.0.1:{port}/0"
        wait_for(lambda: redis.Redis.from_url(url).ping(), timeout=20,
                 ignore=(redis.RedisError,), message="the password redis-server")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_refused_redis_credentials_are_one_line_and_exit_5(password_redis: str) -> None:
    wrong = password_redis.replace(":right@", ":wrong@")
    none = password_redis.replace(":right@", "")
    for url in (wrong, none):
        for args in (("queue", "list"), ("locks",), ("dead-letters", "list")):
            proc = run(cli_env(None, WARMPOOL_REDIS_URL=url), *args, code=5)
            assert_one_line_error(proc, "refused the credentials", "from $WARMPOOL_REDIS_URL")
            assert "wrong" not in proc.stderr and proc.stdout == ""
    assert run_json(cli_env(None, WARMPOOL_REDIS_URL=password_redis), "locks") == {"locks": []}
