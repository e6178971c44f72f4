"""The keyed queue on a real Redis with real dramatiq workers: in this process, and as 3
worker processes that get SIGKILLed and SIGTERMed.

Runs are observed through `workers.probe`, which logs [key, worker, start, end, fence] for
every completed run; wall-clock times are comparable because every process is on this host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Iterator

import pytest
import redis

from tests.cli_run import ROOT
from tests.redis_server import delete_prefix, isolated_settings
from tests.waiting import wait_for
from warmpool.queue import AddResult, Inspector, KeyedQueue, Layout, QueueSettings
from warmpool.queue.broker import keyed_middleware
from warmpool.queue.epoch import Epoch
from warmpool.queue.observer import NullObserver
from workers import probe, runtime
from workers.process import WorkerPool
from workers.runtime import RunningWorker, start_worker

pytestmark = pytest.mark.redis

Record = tuple[str, str, float, float, int]


def key(i: int) -> str:
    return f"instance/qt/app/{i}"


def read_log(client: redis.Redis, settings: QueueSettings) -> list[Record]:
    raw = client.lrange(probe.probe_key(settings, "log"), 0, -1)
    return [tuple(json.loads(r)) for r in raw]  # type: ignore[misc]


def runs_per_key(records: list[Record]) -> Counter[str]:
    return Counter(r[0] for r in records)


def quiescent(client: redis.Redis, settings: QueueSettings) -> bool:
    """Nothing waiting, running, delayed or queued: no further run can happen."""
    s = Inspector(client, settings).stats()
    return s.idle and s.messages == 0


def wait_quiescent(client: redis.Redis, settings: QueueSettings, timeout: float = 60) -> None:
    wait_for(
        lambda: quiescent(client, settings),
        timeout=timeout,
        interval=0.05,
        message=lambda: f"queue to drain: {Inspector(client, settings).stats()}",
    )


def assert_never_concurrent(records: list[Record]) -> None:
    """Per key, every run ends before the next one starts, and fences grow in run order."""
    by_key: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_key[r[0]].append(r)
    for k, runs in by_key.items():
        runs.sort(key=lambda r: r[2])
        for prev, nxt in itertools.pairwise(runs):
            assert nxt[2] >= prev[3], f"{k}: run {nxt} started before {prev} ended"
            assert nxt[4] > prev[4], f"{k}: fence went backwards {prev} -> {nxt}"


def hold(client: redis.Redis, settings: QueueSettings, k: str, seconds: float = 120) -> None:
    client.hset(probe.probe_key(settings, "hold"), k, seconds)


def wait_holding(client: redis.Redis, settings: QueueSettings) -> tuple[str, int]:
    raw = wait_for(
        lambda: client.lpop(probe.probe_key(settings, "holding")),
        timeout=30,
        interval=0.02,
        message="a probe job to start holding its key",
    )
    k, pid = json.loads(raw)
    return k, pid


def release(client: redis.Redis, settings: QueueSettings, k: str) -> None:
    client.sadd(probe.probe_key(settings, "release"), k)


# --- in-process worker -------------------------------------------------------------------


@pytest.fixture(autouse=True)
def probe_handlers() -> Iterator[None]:
    """In-process workers run the probe, whatever else this test process registered."""
    with runtime.using(probe.HANDLERS):
        yield


@pytest.fixture
def worker(queue_settings: QueueSettings) -> Iterator[RunningWorker]:
    running = start_worker(queue_settings, threads=4)
    yield running
    running.stop(timeout=10)


def test_added_while_running_runs_exactly_once_more(
    worker: RunningWorker, queue_settings: QueueSettings, redis_client: redis.Redis
) -> None:
    q = KeyedQueue(redis_client, queue_settings)
    k = key(1)
    hold(redis_client, queue_settings, k)
    assert q.add(k) == AddResult.ENQUEUED
    assert wait_holding(redis_client, queue_settings)[0] == k
    assert [q.add(k) for _ in range(5)] == [AddResult.RERUN] + [AddResult.DEDUPLICATED] * 4
    release(redis_client, queue_settings, k)
    wait_quiescent(redis_client, queue_settings)
    assert runs_per_key(read_log(redis_client, queue_settings)) == {k: 2}


def test_failures_retry_with_backoff_then_succeed(
    worker: RunningWorker, queue_settings: QueueSettings, redis_client: redis.Redis
) -> None:
    q = KeyedQueue(redis_client, queue_settings)
    k = key(2)
    redis_client.hset(probe.probe_key(queue_settings, "fail"), k, 3)
    q.add(k)
    wait_quiescent(redis_client, queue_settings)
    assert runs_per_key(read_log(redis_client, queue_settings)) == {k: 1}
    state = Inspector(redis_client, queue_settings).key(k)
    assert (state.state, state.failures, state.last_error) == ("idle", 0, None)


def test_dead_letter_and_redrive_through_worker(redis_client: redis.Redis, redis_url: str) -> None:
    settings = isolated_settings(redis_url, max_failures=3)
    running = start_worker(settings, threads=2)
    try:
        q = KeyedQueue(redis_client, settings)
        k = key(3)
        redis_client.hset(probe.probe_key(settings, "fail"), k, 3)
        q.add(k)
        wait_for(lambda: q.list_dead(), timeout=30, interval=0.05, message="a dead letter")
        (dead,) = q.list_dead()
        assert dead.key == k and "ProbeFailure" in dead.error
        assert dead.actor == "reconcile_instance"
        assert q.retry_dead(k) == AddResult.ENQUEUED
        wait_quiescent(redis_client, settings)
        assert runs_per_key(read_log(redis_client, settings)) == {k: 1}
        assert q.list_dead() == []
    finally:
        running.stop(timeout=10)
        delete_prefix(redis_client, settings.prefix.split(":", 1)[0] + ":")


def test_stop_drains_and_gives_back_prefetched_messages(
    queue_settings: QueueSettings, redis_client: redis.Redis
) -> None:
    q = KeyedQueue(redis_client, queue_settings)
    redis_client.set(probe.probe_key(queue_settings, "sleep"), 0.05)
    keys = [key(i) for i in range(1, 21)]
    q.add_many(keys)
    running = start_worker(queue_settings, threads=2)
    wait_for(lambda: read_log(redis_client, queue_settings), timeout=30, interval=0.02)
    running.stop(timeout=30)
    inspector = Inspector(redis_client, queue_settings)
    assert list(redis_client.scan_iter(match=f"{queue_settings.namespace}:__acks__.*")) == []
    done = set(runs_per_key(read_log(redis_client, queue_settings)))
    census = inspector.census()
    assert done | census.waiting == set(keys) and not done & census.waiting
    assert not census.running
    # every waiting key has its message back on the list
    assert redis_client.llen(inspector.layout.messages_list) == len(census.waiting)
    again = start_worker(queue_settings, threads=2)
    try:
        wait_quiescent(redis_client, queue_settings)
    finally:
        again.stop(timeout=10)
    assert runs_per_key(read_log(redis_client, queue_settings)) == {k: 1 for k in keys}


# --- worker processes --------------------------------------------------------------------


@pytest.fixture
def pools(redis_client: redis.Redis) -> Iterator[list[WorkerPool]]:
    """Worker pools made by the test; stopped, and their keys deleted, at the end."""
    started: list[WorkerPool] = []
    yield started
    for pool in started:
        pool.stop(timeout=15)
        delete_prefix(redis_client, pool.settings.prefix.split(":", 1)[0] + ":")


def make_pool(
    pools: list[WorkerPool], settings: QueueSettings, processes: int = 3, threads: int = 4
) -> WorkerPool:
    pool = WorkerPool(
        settings,
        processes=processes,
        threads=threads,
        modules=("workers.probe",),
        env={"WARMPOOL_PROBE": "log"},
    )
    pools.append(pool)
    return pool


def fast_recovery(url: str) -> QueueSettings:
    """Short lease and heartbeat so SIGKILLed workers' keys come back within seconds."""
    return isolated_settings(
        url, lease_ttl=2.0, heartbeat_timeout=2.0, recovery_period=0.25, drain_timeout=5
    )


@pytest.fixture
def recovery_settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    settings = fast_recovery(redis_url)
    yield settings
    delete_prefix(redis_client, settings.prefix.split(":", 1)[0] + ":")


def holder_of_a_key(pool: WorkerPool, client: redis.Redis, settings: QueueSettings,
                    among: Collection[str] | None = None) -> int | None:
    """The index of a worker process that holds a key (of `among`, if given) right now."""
    for state in Inspector(client, settings).running():
        if among is not None and state.key not in among:
            continue
        pid = int(state.holder.split(":")[1]) if state.holder else None
        if pid in pool.pids:
            return pool.index_of(pid)
    return None


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "sigkill-restart"])
def test_load_over_few_keys_never_overlaps_and_converges(
    kill: bool,
    pools: list[WorkerPool],
    recovery_settings: QueueSettings,
    redis_client: redis.Redis,
) -> None:
    settings = recovery_settings
    redis_client.set(probe.probe_key(settings, "sleep"), 0.002)
    pool = make_pool(pools, settings).start()
    q = KeyedQueue(redis_client, settings)
    rng = random.Random(7)
    last_add: dict[str, float] = {}
    results: Counter[str] = Counter()
    kills = 0
    log = probe.probe_key(settings, "log")
    for n in range(3000):
        k = key(rng.randint(1, 10))
        last_add[k] = time.time()
        results[q.add(k)] += 1
        if n % 100 == 99:  # interleave adds with runs: wait for workers to make progress
            seen = redis_client.llen(log)
            wait_for(lambda s=seen: redis_client.llen(log) > s, timeout=30, interval=0.005)
        if kill and n % 500 == 250:
            victim = holder_of_a_key(pool, redis_client, settings)
            victim = rng.randrange(3) if victim is None else victim
            pool.kill(victim)
            pool.restart(victim, wait=False)
            kills += 1
    if kill:
        wait_for(lambda: not pool.dead(), timeout=30, message="restarted workers")
    wait_quiescent(redis_client, settings, timeout=90)
    records = read_log(redis_client, settings)
    assert_never_concurrent(records)
    starts: dict[str, float] = {}
    for k, _, start, _, _ in records:
        starts[k] = max(starts.get(k, 0.0), start)
    for k, added in last_add.items():
        assert starts.get(k, 0.0) > added, f"{k}: no completed run after its last add"
    assert len(records) <= 3000
    # the killed workers' unacked messages were requeued by dramatiq's maintenance
    assert list(redis_client.scan_iter(match=f"{settings.namespace}:__acks__.*")) == []
    assert results[AddResult.DEDUPLICATED] > 0
    print(
        f"\n{'sigkill' if kill else 'steady'}: 3000 adds over 10 keys -> {len(records)} runs "
        f"({dict(results)}), {kills} SIGKILLs, {len({r[1] for r in records})} worker threads"
    )


def test_dedup_10000_adds_over_100_keys_run_100_times(
    pools: list[WorkerPool], queue_settings: QueueSettings, redis_client: redis.Redis
) -> None:
    q = KeyedQueue(redis_client, queue_settings)
    keys = [key(i) for i in range(1, 101)]
    results = Counter(q.add_many(keys[i % 100] for i in range(10_000)))
    assert results == {AddResult.ENQUEUED: 100, AddResult.DEDUPLICATED: 9_900}
    make_pool(pools, queue_settings).start()
    wait_quiescent(redis_client, queue_settings)
    assert runs_per_key(read_log(redis_client, queue_settings)) == {k: 1 for k in keys}


def test_claim_overtakes_a_backlog_of_instance_keys(
    pools: list[WorkerPool], queue_settings: QueueSettings, redis_client: redis.Redis
) -> None:
    """A scale-down's hundreds of instance keys are queued and being worked off; a claim
    added behind them starts while most of them have yet to: it has its own dramatiq queue,
    and its actor's priority puts it ahead of instance messages a worker already fetched."""
    settings = queue_settings
    redis_client.set(probe.probe_key(settings, "sleep"), 0.02)
    make_pool(pools, settings, processes=2, threads=2).start()
    q = KeyedQueue(redis_client, settings)
    backlog = [key(i) for i in range(1, 301)]
    assert set(q.add_many(backlog)) == {AddResult.ENQUEUED}
    log = probe.probe_key(settings, "log")
    wait_for(lambda: redis_client.llen(log) > 0, timeout=30, interval=0.01,
             message="the workers to start on the backlog")
    claim = "session/qt/s1"
    assert q.add(claim) == AddResult.ENQUEUED
    wait_quiescent(redis_client, settings, timeout=120)
    records = read_log(redis_client, settings)
    assert runs_per_key(records) == {k: 1 for k in [*backlog, claim]}
    started = {r[0]: r[2] for r in records}
    behind = [k for k in backlog if started[k] > started[claim]]
    print(f"\nclaim added behind {len(backlog)} instance keys started before {len(behind)} "
          "of them")
    assert len(behind) >= len(backlog) // 2


def test_sigkilled_holder_key_reruns_within_lease_ttl(
    pools: list[WorkerPool],
    queue_settings: QueueSettings,
    redis_client: redis.Redis,
    record_property: pytest.RecordProperty,
) -> None:
    """Default settings (10 s lease): the key of a SIGKILLed holder runs again and completes."""
    pool = make_pool(pools, queue_settings).start()
    q = KeyedQueue(redis_client, queue_settings)
    k = key(7)
    hold(redis_client, queue_settings, k)
    q.add(k)
    held, pid = wait_holding(redis_client, queue_settings)
    assert held == k
    killed_at = time.monotonic()
    pool.kill(pool.index_of(pid))
    s = queue_settings
    wait_for(
        lambda: runs_per_key(read_log(redis_client, s))[k] == 1,
        timeout=s.lease_ttl + s.recovery_period + 10,
        interval=0.02,
        message=lambda: f"{k} to rerun: {Inspector(redis_client, s).key(k)}",
    )
    elapsed = time.monotonic() - killed_at
    record_property("sigkill_rerun_seconds", round(elapsed, 2))
    print(
        f"\nSIGKILLed holder: {k} completed again {elapsed:.2f}s later (lease TTL {s.lease_ttl}s)"
    )
    wait_quiescent(redis_client, s)
    state = Inspector(redis_client, s).key(k)
    assert state.state == "idle" and state.failures == 0


def test_sigterm_drains_running_job_and_requeues_the_rest(
    pools: list[WorkerPool], recovery_settings: QueueSettings, redis_client: redis.Redis
) -> None:
    settings = recovery_settings
    first = make_pool(pools, settings, processes=1, threads=2).start()
    q = KeyedQueue(redis_client, settings)
    k = key(1)
    hold(redis_client, settings, k, seconds=1.0)
    q.add(k)
    wait_holding(redis_client, settings)
    redis_client.set(probe.probe_key(settings, "sleep"), 0.05)
    q.add_many(key(i) for i in range(2, 31))
    first.stop(timeout=20)  # SIGTERM: the held job finishes, prefetched messages go back
    assert runs_per_key(read_log(redis_client, settings))[k] == 1
    assert list(redis_client.scan_iter(match=f"{settings.namespace}:__acks__.*")) == []
    assert Inspector(redis_client, settings).stats().running == 0
    make_pool(pools, settings, processes=1, threads=4).start()
    wait_quiescent(redis_client, settings)
    assert runs_per_key(read_log(redis_client, settings)) == {key(i): 1 for i in range(1, 31)}


def test_worker_processes_exit_when_their_supervisor_is_killed(
    recovery_settings: QueueSettings,
) -> None:
    """A WorkerPool's parent SIGKILLed (nothing stops its children): each child notices it was
    orphaned, drains and exits, instead of running on unsupervised."""
    script = (
        "import json, sys, time\n"
        "from warmpool.queue import QueueSettings\n"
        "from workers.process import WorkerPool\n"
        "pool = WorkerPool(QueueSettings(**json.loads(sys.argv[1])), processes=2, threads=1,\n"
        "                  modules=('workers.probe',)).start()\n"
        "print(json.dumps(pool.pids), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(dataclasses.asdict(recovery_settings))],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    children: list[int] = []
    try:
        assert parent.stdout is not None
        children = json.loads(parent.stdout.readline())
        assert len(children) == 2 and all(pid_alive(pid) for pid in children)
        parent.kill()
        parent.wait(10)
        wait_for(lambda: not any(pid_alive(pid) for pid in children), timeout=30,
                 message=lambda: f"orphaned workers still running: {children}")
    finally:
        parent.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Running (a zombie reaped by init would not be: /proc says Z until then)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- Redis that forgets: the epoch and the fence counter (issue #15) -----------------------


class LossRecorder(NullObserver):
    def __init__(self) -> None:
        self.losses: list[tuple[str | None, str | None]] = []

    def on_redis_lost(self, previous: str | None, current: str | None) -> None:
        self.losses.append((previous, current))


def forget_everything(client: redis.Redis, settings: QueueSettings) -> None:
    """What a restart without persistence does to this test's keys (and only to them: the
    server is shared, so never FLUSHALL here)."""
    delete_prefix(client, settings.prefix.split(":", 1)[0] + ":")


def test_a_running_worker_notices_a_redis_that_lost_its_data(
    redis_client: redis.Redis, redis_url: str,
) -> None:
    settings = isolated_settings(redis_url, epoch_period=0.05)
    observer = LossRecorder()
    scheduler_side = Epoch(redis_client, Layout.of(settings), create=True)
    created = scheduler_side.check().current
    running = start_worker(settings, threads=2, observer=observer)
    try:
        maintenance = wait_for(lambda: keyed_middleware(running.broker).maintenance,
                               timeout=10, message="the worker's maintenance thread")
        wait_for(lambda: maintenance.epoch.known == created, timeout=10,
                 message="the worker's first look at the epoch")
        # Work goes on as usual before the loss ...
        q = KeyedQueue(redis_client, settings)
        q.add(key(1))
        wait_quiescent(redis_client, settings)
        forget_everything(redis_client, settings)
        wait_for(lambda: observer.losses, timeout=10, message="the loss, noticed by the worker")
        assert observer.losses == [(created, None)]
        # ... and the scheduler's new epoch is adopted without counting a second loss.
        again = scheduler_side.check()
        assert again.lost and again.current != created
        wait_for(lambda: maintenance.epoch.known == again.current, timeout=10)
        assert observer.losses == [(created, None)]
        q.add(key(2))  # the queue still works on the emptied Redis
        wait_quiescent(redis_client, settings)
        assert runs_per_key(read_log(redis_client, settings))[key(2)] == 1
    finally:
        running.stop(timeout=10)
        forget_everything(redis_client, settings)


def test_after_redis_lost_the_fence_counter_a_lift_puts_the_next_lease_above_what_was_seen(
    queue_settings: QueueSettings, redis_client: redis.Redis,
) -> None:
    """The lift script on the real server: it raises a reset counter, never lowers one."""
    q = KeyedQueue(redis_client, queue_settings)
    layout = Layout.of(queue_settings)
    redis_client.set(layout.fence, 40)
    forget_everything(redis_client, queue_settings)  # the counter is gone with the rest
    assert q.scripts.lift_fence(500) == 500
    assert q.scripts.lift_fence(7) == 500
    taken = q.scripts.acquire(key(1), "me", 10_000)
    assert isinstance(taken, tuple) and taken[1] == 501



def last_defers(client: redis.Redis, settings: QueueSettings) -> dict[str, float]:
    """Per key, the time its last `ctx.defer` was called (the probe's `deferred` list)."""
    last: dict[str, float] = {}
    for raw in client.lrange(probe.probe_key(settings, "deferred"), 0, -1):
        k, at = json.loads(raw)
        last[k] = max(last.get(k, 0.0), at)
    return last


def owed_runs(client: redis.Redis, settings: QueueSettings, last_add: dict[str, float],
              keys: list[str]) -> list[str]:
    """The keys with no completed run that started after their last add and last defer."""
    starts: dict[str, float] = {}
    for k, _, start, _, _ in read_log(client, settings):
        starts[k] = max(starts.get(k, 0.0), start)
    defers = last_defers(client, settings)
    return [k for k in keys
            if starts.get(k, 0.0) <= max(last_add.get(k, 0.0), defers.get(k, 0.0))]


@pytest.mark.slow
def test_stalled_holders_lose_no_added_or_deferred_key(
    pools: list[WorkerPool], redis_url: str, redis_client: redis.Redis
) -> None:
    """Worker processes are SIGSTOPped, preferably while running an "instance" key, for 0.5 to
    2.5 lease TTLs and resumed (seeded choices), while keys are added and defer themselves,
    and each "claim" key holds an instance key's lease as a secondary lease while it runs.
    Claims are added all the time, instances seldom, so a stalled instance run is often the
    last one owed for its key. The stalled holders' leases lapse mid-run; their keys are
    recovered, or taken by a claim first (the recovery pass runs every 2 s here, to widen
    that window); the holders come back to defer and finish late. Every key must end with a
    completed run that started after its last add and after its last defer: the README's
    contract. That is waited for, not
    sampled at one quiet moment: a resumed holder can still defer after the queue looked
    idle, and its deferred run is owed too."""
    settings = fast_recovery(redis_url).replace(recovery_period=2.0)
    redis_client.set(probe.probe_key(settings, "sleep"), 0.05)
    claims = [f"session/qt/s{i}" for i in range(1, 7)]
    instances = [key(i) for i in range(1, 7)]
    keys = claims + instances
    redis_client.hset(probe.probe_key(settings, "secondary"), mapping=dict(zip(claims, instances,
                                                                               strict=True)))
    pool = make_pool(pools, settings, processes=3, threads=3).start()
    q = KeyedQueue(redis_client, settings)
    rng = random.Random(26)
    log = probe.probe_key(settings, "log")
    last_add: dict[str, float] = {}
    stopped: set[int] = set()
    resumes: list[threading.Timer] = []

    def resume(i: int) -> None:
        pool.kill(i, signal.SIGCONT)
        stopped.discard(i)

    try:
        for n in range(150):
            batch = rng.sample(claims, 2) + ([rng.choice(instances)] if n % 6 == 0 else [])
            for k in batch:
                if rng.random() < 0.3:
                    redis_client.hincrby(probe.probe_key(settings, "defer"), k, rng.randint(1, 3))
                last_add[k] = time.time()
                q.add(k)
            if n % 8 == 5 and len(stopped) < 2:
                victim = holder_of_a_key(pool, redis_client, settings, instances)
                if victim is None or victim in stopped:
                    victim = rng.choice([i for i in range(3) if i not in stopped])
                pool.kill(victim, signal.SIGSTOP)
                stopped.add(victim)
                timer = threading.Timer(rng.uniform(0.5, 2.5) * settings.lease_ttl,
                                        resume, (victim,))
                timer.start()
                resumes.append(timer)
            seen = redis_client.llen(log)  # a run completes before the next batch: progress
            wait_for(lambda s=seen: redis_client.llen(log) > s, timeout=60, interval=0.01)
        for timer in resumes:
            timer.join()
        wait_for(lambda: not owed_runs(redis_client, settings, last_add, keys), timeout=120,
                 interval=0.1, message=lambda: "a run after the last add or defer of " + ", ".join(
                     str(Inspector(redis_client, settings).key(k))
                     for k in owed_runs(redis_client, settings, last_add, keys)))
        wait_quiescent(redis_client, settings, timeout=120)
    finally:
        for timer in resumes:
            timer.cancel()
        for i in range(3):
            pool.kill(i, signal.SIGCONT)
    assert len(resumes) >= 3 and last_defers(redis_client, settings), \
        "the stalls and defers this test is about happened"
