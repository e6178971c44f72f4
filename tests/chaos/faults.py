"""The faults a chaos run injects: their kinds, the seeded plan, and the injector."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.chaos.config import ChaosConfig
from tests.chaos.history import History
from tests.chaos.system import lagging_client
from warmpool.harness import SentinelRedis, System
from warmpool.testing.apiproxy import ApiProxy
from warmpool.testing.apiproxy import Faults as ProxyFaults

if TYPE_CHECKING:
    from tests.chaos.hostile import HostileEdits
    from tests.chaos.operations import Operations


# kind -> (weight, group). One fault per group at a time; kinds of different groups overlap.
FAULT_KINDS: dict[str, tuple[float, str]] = {
    "worker_kill": (3.0, "worker"),
    # SIGSTOP a lease holder past its lease TTL, then SIGCONT: it wakes and goes on writing
    "worker_stop": (2.0, "worker"),
    "leader_kill": (2.0, "scheduler"),
    "redis_restart": (1.0, "redis"),
    "redis_flush": (1.5, "redis"),  # restart with persistence off: emptied
    # FLUSHALL or an empty restart between a race's claims and its scale-down (an operation)
    "redis_flush_race": (1.5, "redis"),
    # Sentinel runs only: the primary SIGKILLed or SIGSTOPped, a replica promoted, the old
    # primary back as a replica (its unreplicated writes lost)
    "redis_failover": (3.0, "redis"),
    "api_errors": (3.0, "api"),  # 409 / 500 / 429 for a while
    "api_lost_writes": (1.5, "api"),  # writes applied but unanswered, dropped connections
    "api_latency": (2.0, "api"),
    "watch_drops": (2.0, "watch"),
    "api_outage": (1.0, "outage"),
    "api_outage_long": (0.0, "outage"),  # only as `long_outages` (30 s)
    "watch_lag": (2.0, "lag"),  # one worker's watch events seconds late (its cache behind)
    # foreign values written by hand into the labels, annotations and owner references the
    # controller reads on pool objects and Sessions (tests/chaos/hostile.py)
    "hostile_edits": (2.0, "hostile"),
    # The many-host topology only (`ChaosConfig.hosts`), on the hosts' own links: a worker
    # host partitioned (silently: connections open, nothing passes, one way or both) from
    # Redis, the API server or both, struck while it holds leases in a race of claims and a
    # scale-down, and healed while that runs on elsewhere; the leader's link to the API
    # server stalled past its Lease; one link slowed for seconds.
    "host_partition": (3.0, "network"),
    "leader_api_stall": (1.5, "network"),
    "link_slow": (1.5, "network"),
}


@dataclass
class Fault:
    kind: str
    params: dict[str, Any]
    start: float = 0.0
    end: float | None = None
    tail: float = 0.0  # after its end, repair may still lag this long (backoffs, resyncs)
    blocking: bool = True
    # While in effect (tail included), a repair may take this much longer than the grace:
    # the delay of a lagging worker's watches (slower, not impossible, so not `blocking`).
    slack: float = 0.0
    # `redis_flush_race`: the flush handed to the next operation, and its "done" event
    handoff: tuple[Callable[[], None], threading.Event] | None = None

    def window(self, now: float) -> tuple[float, float]:
        return self.start, (self.end if self.end is not None else now) + self.tail


#: The Redis faults of a run with one server, and of a run with Sentinels.
SINGLE_REDIS_KINDS = frozenset({"redis_restart", "redis_flush", "redis_flush_race"})
SENTINEL_KINDS = frozenset({"redis_failover"})
#: The faults on the hosts' links: only in a run with hosts.
NETWORK_KINDS = frozenset({"host_partition", "leader_api_stall", "link_slow"})

#: A write reaches the API server this long after the worker checked its lease at most, when
#: the worker's link to the API server is healthy (loopback and a veth): the slack of the
#: "no write after the lease lapsed" check.
WRITE_TRANSIT = 1.0


def fault_kinds(cfg: ChaosConfig) -> list[str]:
    """The kinds a run may plan: the chosen ones (all by default) that fit its Redis."""
    unfit = SINGLE_REDIS_KINDS if cfg.sentinels else SENTINEL_KINDS
    if not cfg.hosts:
        unfit = unfit | NETWORK_KINDS
    if cfg.kinds is not None:
        unknown = set(cfg.kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        wrong = set(cfg.kinds) & unfit
        if wrong:
            need = ("hosts (--hosts)" if wrong <= NETWORK_KINDS else
                    "one Redis server" if cfg.sentinels else "Sentinels")
            raise ValueError(f"fault kinds {sorted(wrong)} need {need}")
    return [k for k in FAULT_KINDS if (cfg.kinds is None or k in cfg.kinds)
            and FAULT_KINDS[k][0] > 0 and k not in unfit]


def plan_faults(rng: random.Random, cfg: ChaosConfig) -> dict[int, list[tuple[str, dict]]]:
    """op index -> faults to start before that operation (seeded)."""
    count = cfg.faults if cfg.faults is not None else max(1, cfg.ops // cfg.ops_per_fault)
    kinds = fault_kinds(cfg)
    weights = [FAULT_KINDS[k][0] for k in kinds]
    plan: dict[int, list[tuple[str, dict]]] = {}
    # Every kind at least once when there is room for it, the rest by weight.
    chosen = rng.sample(kinds, len(kinds)) if count >= len(kinds) else []
    chosen += rng.choices(kinds, weights, k=count - len(chosen))
    for kind in chosen:
        at = rng.randrange(cfg.ops)
        plan.setdefault(at, []).append((kind, fault_params(rng, kind, cfg)))
    for _ in range(cfg.long_outages if cfg.kinds is None or "api_outage_long" in cfg.kinds
                   else 0):
        at = rng.randrange(cfg.ops)
        plan.setdefault(at, []).append(("api_outage_long", {
            "seconds": cfg.long_outage_seconds, "mode": rng.choice(["refuse", "503"])}))
    return plan


# Complex by count only: a flat dispatch, one `match` case per fault kind and its draws.
def fault_params(rng: random.Random, kind: str, cfg: ChaosConfig) -> dict[str, Any]:  # noqa: C901
    match kind:
        case "worker_kill":
            return {"worker": rng.randrange(cfg.workers), "down": rng.uniform(0.2, 3.0)}
        case "worker_stop":
            # Past the lease TTL by 1-2 TTLs, so its leases lapse and others take its keys.
            return {"worker": rng.randrange(cfg.workers),
                    "stopped": rng.uniform(cfg.lease_ttl + 1.0, 3 * cfg.lease_ttl + 1.0)}
        case "redis_flush_race":
            return {"mode": rng.choice(["flushall", "restart"]),
                    "after": rng.uniform(0.0, 0.3), "down": rng.uniform(0.1, 1.0)}
        case "leader_kill":
            return {"down": rng.uniform(0.5, 3.0)}
        case "redis_restart" | "redis_flush":
            return {"down": rng.uniform(0.1, 2.0)}
        case "redis_failover":
            # "stop": the old primary frozen with its connections open (commands sent to it
            # wait, then may land on it after the promotion), resumed `down` s later
            return {"mode": rng.choice(["kill", "stop"]), "down": rng.uniform(0.2, 3.0)}
        case "api_errors":
            return {"seconds": rng.uniform(2, 8), "scope": rng.choice(["mutating", "all"]),
                    "p_409": rng.choice([0, 0.1, 0.3]), "p_500": rng.choice([0.05, 0.1, 0.3]),
                    "p_429": rng.choice([0, 0.05, 0.2]), "retry_after": 1}
        case "api_lost_writes":
            return {"seconds": rng.uniform(2, 8), "p_lost_response": rng.choice([0.1, 0.3]),
                    "p_drop": rng.choice([0, 0.05, 0.1]), "scope": "all"}
        case "api_latency":
            return {"seconds": rng.uniform(3, 10), "latency": rng.choice([0.01, 0.03, 0.05]),
                    "jitter": rng.choice([0, 0.02, 0.05])}
        case "watch_drops":
            return {"seconds": rng.uniform(3, 10), "p_drop_watch": rng.choice([0.3, 1.0]),
                    "drop_watch_after": rng.uniform(0.5, 3)}
        case "api_outage":
            return {"seconds": rng.uniform(*cfg.outage_seconds),
                    "mode": rng.choice(["refuse", "503"])}
        case "watch_lag":
            return {"seconds": rng.uniform(*cfg.lag_seconds),
                    "delay": rng.uniform(*cfg.lag_delay)}
        case "host_partition":
            return {"worker": rng.randrange(cfg.workers),
                    "service": rng.choice(["redis", "api", "both"]),
                    "direction": rng.choice(["both", "both", "up", "down"]),
                    "seconds": rng.uniform(*cfg.partition_seconds)}
        case "leader_api_stall":
            # Past the Lease duration: the other scheduler takes the Lease meanwhile.
            return {"seconds": rng.uniform(cfg.scheduler_lease + 2.0,
                                           2 * cfg.scheduler_lease + 2.0)}
        case "link_slow":
            return {"worker": rng.randrange(cfg.workers),
                    "service": rng.choice(["redis", "api"]),
                    "delay": rng.uniform(*cfg.slow_delay), "seconds": rng.uniform(3, 10)}
        case "hostile_edits":
            return {"edits": rng.randint(*cfg.hostile_edits), "gap": rng.uniform(*cfg.hostile_gap),
                    "hold": rng.uniform(*cfg.hostile_hold), "seed": rng.randrange(2**31)}
    raise ValueError(kind)


class FaultInjector:
    """Starts planned faults, each in its own thread; knows when repair was impossible."""

    def __init__(self, system: System, cfg: ChaosConfig, history: History,
                 ops: Operations | None = None, hostile: HostileEdits | None = None) -> None:
        self.system, self.cfg, self.history = system, cfg, history
        self.hostile = hostile  # `hostile_edits` makes its edits through it
        assert system.proxy is not None, "a chaos system runs behind the fault proxy"
        self.proxy: ApiProxy = system.proxy
        self.ops = ops  # `redis_flush_race` hands its flush to the next race operation
        self.started: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.all: list[Fault] = []
        self._busy: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.errors: list[str] = []
        self.violations: list[str] = []  # what a network fault saw break (the run reports it)
        self.notes: list[str] = []  # what a fault found when it struck (shown in the report)

    def start(self, kind: str, params: dict[str, Any]) -> bool:
        group = FAULT_KINDS[kind][1]
        with self._lock:
            if group in self._busy:
                return False
            self._busy.add(group)
            fault = Fault(kind, params, start=self.history.now())
            self.all.append(fault)
            self.started[kind] += 1
        if kind == "redis_flush_race" and self.ops is not None:
            # Handed over here, in the runner's thread, so the very next operation is the
            # race (the operations' sequence stays the seed's, not the fault thread's timing).
            fault.handoff = (lambda: self._flush(**params), threading.Event())
            self.ops.flush_race = fault.handoff
        elif kind in ("worker_stop", "host_partition") and self.ops is not None:
            self.ops.race_next = True  # the burst of claims and scale-downs it freezes in
        self.history.add("fault", f"{kind} {params}")
        t = threading.Thread(target=self._run, args=(fault, group), daemon=True,
                             name=f"fault-{kind}")
        self._threads.append(t)
        t.start()
        return True

    def _run(self, fault: Fault, group: str) -> None:
        try:
            getattr(self, "_" + fault.kind)(fault, **fault.params)
        except Exception as exc:  # a fault that cannot be applied is a harness problem
            self.errors.append(f"{fault.kind}: {exc!r}")
            self.history.add("fault", f"{fault.kind} failed: {exc!r}")
        finally:
            if fault.end is None:
                fault.end = self.history.now()
            with self._lock:
                self._busy.discard(group)
            self.history.add("fault", f"{fault.kind} over")

    def wait(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def blocked(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which some blocking fault (or its tail) was in effect."""
        now = self.history.now()
        spans = sorted(f.window(now) for f in list(self.all) if f.blocking)
        total, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            s, e = max(s, t0), min(e, t1)
            if e <= s:
                continue
            if cur_e is None or s > cur_e:
                if cur_e is not None and cur_s is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None and cur_s is not None:
            total += cur_e - cur_s
        return total

    def slack(self, t0: float, t1: float) -> float:
        """The largest `Fault.slack` of the faults in effect at some moment of [t0, t1]."""
        now = self.history.now()
        return max((f.slack for f in list(self.all)
                    if f.slack and f.window(now)[0] <= t1 and f.window(now)[1] >= t0),
                   default=0.0)

    # --- the kinds ----------------------------------------------------------------------------

    def _worker_kill(self, f: Fault, worker: int, down: float) -> None:
        self.system.kill_worker(worker)
        time.sleep(down)  # the stimulus: how long the worker stays dead
        self.system.restart_worker(worker)
        f.end = self.history.now()
        f.tail = self.cfg.lease_ttl + 2.0  # its leases lapse, then recovery re-queues its keys

    def _worker_stop(self, f: Fault, worker: int, stopped: float) -> None:
        """Freeze a lease holder past its TTL, then let it go on: after it wakes, what it
        was doing (a claim, a scale-down, a release) continues under leases others have taken
        since, and each write must be refused (fence, preconditions), never applied.

        The process is chosen when it holds leases: the next operation is a race of claims
        and a scale-down (`Operations.race_next`), and the fault waits (up to 5 s) for a
        worker holding leases, taking the one with the most; if none holds any by then, the
        seeded one."""
        deadline = time.monotonic() + 5.0
        holders = self.system.lease_holders()
        while not holders and time.monotonic() < deadline:
            time.sleep(0.005)  # polling Redis for lease holders, not a wait for an effect
            holders = self.system.lease_holders()
        if holders:
            worker = holders.most_common(1)[0][0]
        text = (f"stopping worker {worker} holding {holders.get(worker, 0)} leases (of "
                f"{self.system.leases_seen}; by worker {dict(holders)}), for "
                f"{stopped:.1f}s (lease TTL {self.cfg.lease_ttl:g}s)")
        self.history.add("fault", text)
        self.notes.append(f"worker_stop: {text}")
        self.system.stop_worker(worker)
        try:
            time.sleep(stopped)  # the stimulus: frozen longer than its leases live
        finally:
            self.system.resume_worker(worker)
        f.end = self.history.now()
        # Its keys were re-queued by recovery while it slept; what it held waits for that.
        f.tail = self.cfg.lease_ttl + 2.0

    def _redis_flush_race(self, f: Fault, mode: str, after: float, down: float) -> None:
        """Redis emptied while claims race a scale-down: the next operation becomes a
        `race_claim_scale` whose flush (FLUSHALL, or a restart without persistence) lands
        `after` s after its claims and before its scale-down, so the claims' jobs hold
        leases Redis no longer knows about while the scale-down's jobs take fresh ones."""
        assert f.handoff is not None and self.ops is not None
        flush, done = f.handoff
        if not done.wait(60.0):  # no race operation came (no AppDefinition): flush anyway
            if self.ops.flush_race is f.handoff:
                self.ops.flush_race = None
                flush()
            else:  # taken just now: it is running
                done.wait(60.0)
        f.end = self.history.now()
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _flush(self, mode: str, after: float, down: float) -> None:
        time.sleep(after)  # the stimulus: the claims' jobs are under way by now
        if mode == "flushall":
            self.system.redis.client().flushall()
        else:
            self.system.redis.restart(keep=False, down_for=down)
        text = f"redis emptied ({mode}) between claims and scale-down"
        self.history.add("fault", text)
        self.notes.append(f"redis_flush_race: {text}")

    def _leader_kill(self, f: Fault, down: float) -> None:
        leader = self.system.leader()
        i = leader if leader is not None else 0
        self.history.add("fault", f"killing scheduler {i} "
                         f"({'the leader' if leader is not None else 'no leader found'})")
        self.system.kill_scheduler(i)
        time.sleep(down)  # the stimulus: how long the scheduler stays dead
        self.system.restart_scheduler(i)
        f.end = self.history.now()
        f.tail = self.cfg.scheduler_lease + 3.0  # the standby's lease wait, then its resync

    def _redis_restart(self, f: Fault, down: float) -> None:
        self.system.redis.restart(keep=True, down_for=down)
        f.end = self.history.now()
        # Restored leases of dead jobs lapse; keys queued after the snapshot are lost and
        # wait for the next event or resync (as after `redis_flush`).
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _redis_flush(self, f: Fault, down: float) -> None:
        self.system.redis.restart(keep=False, down_for=down)
        f.end = self.history.now()
        # Queued keys are gone: what they were for waits for the next event or resync.
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _redis_failover(self, f: Fault, mode: str, down: float) -> None:
        """The Sentinels' primary SIGKILLed (or SIGSTOPped) now; a replica is promoted
        (`down-after-milliseconds` 1 s, then the election); `down` s after the promotion the
        old primary comes back (restarted empty, or resumed) and the Sentinels make it a
        replica of the new one, so the next failover has a replica to promote. Writes the old
        primary acknowledged but had not replicated are lost (the epoch tells the
        processes); every client carries on against the new primary, no process restarts."""
        redis_ = self.system.redis
        assert isinstance(redis_, SentinelRedis) and redis_.cluster is not None
        cluster = redis_.cluster
        old = cluster.kill_primary(pause=mode == "stop")
        try:
            new = cluster.wait_promoted(old, timeout=60)
            text = (f"primary {old.port} {'stopped' if mode == 'stop' else 'killed'}, "
                    f"replica {new.port} promoted after {self.history.now() - f.start:.1f}s")
            self.history.add("fault", text)
            self.notes.append(f"redis_failover: {text}")
            time.sleep(down)  # the stimulus: how long the old primary stays away
        finally:
            cluster.rejoin(old)
        f.end = self.history.now()
        # Keys and leases written just before the failover may be lost with the old primary
        # (asynchronous replication): what they were for waits for the epoch's resync.
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _window(self, f: Fault, seconds: float, tail: float, **settings: Any) -> None:
        proxy = self.proxy
        keys = list(settings)
        proxy.set(**settings)
        try:
            time.sleep(seconds)  # the stimulus: how long the API misbehaves
        finally:
            proxy.set(**{k: getattr(ProxyFaults(), k) for k in keys})
        f.end = self.history.now()
        f.tail = tail

    def _api_errors(self, f: Fault, seconds: float, **settings: Any) -> None:
        # Many failures in a row grow a key's backoff (5 ms doubling): a few seconds at most.
        self._window(f, seconds, tail=5.0, **settings)

    def _api_lost_writes(self, f: Fault, seconds: float, **settings: Any) -> None:
        self._window(f, seconds, tail=5.0, **settings)

    def _api_latency(self, f: Fault, seconds: float, **settings: Any) -> None:
        f.blocking = False  # slower, not stopped: the grace must cover it
        self._window(f, seconds, tail=0.0, **settings)

    def _watch_drops(self, f: Fault, seconds: float, **settings: Any) -> None:
        self.proxy.cut_watches()
        # A cut watch resumes after the reflector's backoff (0.8 s doubling, jittered).
        self._window(f, seconds, tail=8.0, **settings)

    def _watch_lag(self, f: Fault, seconds: float, delay: float) -> None:
        """The lagging worker's watch events arrive `delay` s late for `seconds`; the
        events held when the window closes still arrive at their time (the tail)."""
        f.blocking = False  # its reads are behind, its writes are refused if stale: slower
        f.slack = delay
        self._window(f, seconds, tail=delay, watch_delay=delay,
                     watch_delay_client=lagging_client(self.cfg))

    def _holder(self, seeded: int) -> int:
        """The worker holding the most leases (waiting up to 5 s for one: the next operation
        is a race of claims and a scale-down), else the seeded one."""
        deadline = time.monotonic() + 5.0
        holders = self.system.lease_holders()
        while not holders and time.monotonic() < deadline:
            time.sleep(0.005)  # polling Redis for lease holders, not a wait for an effect
            holders = self.system.lease_holders()
        return holders.most_common(1)[0][0] if holders else seeded

    def _host_partition(self, f: Fault, worker: int, service: str, direction: str,
                        seconds: float) -> None:
        """Cut a worker's host off (silently) from `service` while it holds leases, heal it
        `seconds` later while the race it was in runs on. Whatever it was doing goes on by
        its own clock: with Redis cut its leases lapse locally and it must stop writing, and
        the API server must see no write of it applied from a lease TTL (plus transit) after
        the cut until the heal; with the API server cut its calls time out within a lease
        TTL and its keys move to other hosts. Healed, it carries on as the same process."""
        worker = self._holder(worker)
        host = self.system.hosts[worker]  # worker i runs on host i (tests/chaos/system.py)
        pid = self.system.workers.pids[worker]
        text = (f"host {host.name} (worker {worker}) cut from {service} ({direction}) for "
                f"{seconds:.1f}s")
        self.history.add("fault", text)
        self.notes.append(f"host_partition: {text}")
        cut_at = time.time()
        host.partition(service, direction)
        try:
            time.sleep(seconds)  # the stimulus: how long the host is cut off
        finally:
            healed_at = time.time()
            host.heal(service)
        paused = any(g.kind in ("worker_stop", "worker_kill") and g.window(self.history.now())
                     [1] >= f.start for g in list(self.all) if g is not f)
        # A paused process's write checked before the pause lands after it (fences refuse it
        # when stale): that is the worker faults' to judge, not this one's.
        if service != "api" and not paused:  # no Redis renewal it could hear of
            lapsed = cut_at + self.cfg.lease_ttl + WRITE_TRANSIT
            applied = [w for w in self.proxy.writes(host.name)
                       if lapsed < w.at < healed_at and not w.refused
                       and "/events" not in w.path]
            if applied:
                self.violations.append(
                    f"host_partition: {host.name} cut from Redis at {cut_at:.2f} wrote after "
                    f"its lease lapsed (applied): {applied[:5]}")
        if self.system.workers.pids[worker] != pid:
            self.notes.append(f"host_partition: worker {worker} was restarted ({pid} -> "
                              f"{self.system.workers.pids[worker]})")
        f.end = self.history.now()
        # Its leases lapse (TTL), its stalled calls end (a lease TTL each), its keys back off.
        f.tail = 2 * self.cfg.lease_ttl + 5.0

    def _leader_api_stall(self, f: Fault, seconds: float) -> None:
        """The leader's link to the API server goes silent for longer than its Lease: it
        must stop leading (by its own clock, at the renew deadline) before the other
        scheduler takes the Lease (at the Lease duration), and lead again or stand by once
        healed. Both report whether they lead (/status, over their hosts' own addresses,
        not through the stalled link); two leaders at one poll is a violation."""
        leader = self.system.leader()
        if leader is None:
            self.notes.append("leader_api_stall: no leader found; nothing stalled")
            f.end = self.history.now()
            return
        h = self.system.scheduler_host(leader)
        assert h is not None, "a run with hosts puts every scheduler on a host"
        host = self.system.hosts[h]
        host.partition("api")
        start = time.monotonic()
        stepped_down = taken = None
        try:
            while time.monotonic() - start < seconds:
                leading = self._leading()
                if len(leading) > 1:
                    self.violations.append(f"leader_api_stall: schedulers {sorted(leading)} "
                                           "both lead while the old leader's link stalls")
                    break
                now = time.monotonic() - start
                if stepped_down is None and leader not in leading:
                    stepped_down = now
                if taken is None and leading and leader not in leading:
                    taken = now
                time.sleep(0.1)  # polling the schedulers' /status
        finally:
            host.heal("api")
        self.notes.append(
            f"leader_api_stall: scheduler {leader} stalled {seconds:.1f}s; stopped leading "
            f"after {_secs(stepped_down)}, the other led after {_secs(taken)}")
        f.end = self.history.now()
        f.tail = self.cfg.scheduler_lease + 3.0  # a leader again, then its resync

    def _leading(self) -> set[int]:
        out = set()
        for i, s in enumerate(self.system.schedulers):
            with contextlib.suppress(Exception):
                if s.alive() and s.status().get("leader"):
                    out.add(i)
        return out

    def _link_slow(self, f: Fault, worker: int, service: str, delay: float,
                   seconds: float) -> None:
        """One host's link to `service` slowed by `delay` s each way for `seconds`: slower,
        not stopped (every chunk arrives, late, in order)."""
        f.blocking = False
        f.slack = 20 * delay  # a job makes a few dozen round trips at most
        host = self.system.hosts[worker]
        host.slow(delay, service)
        try:
            time.sleep(seconds)  # the stimulus: how long the link is slow
        finally:
            host.heal(service)
        f.end = self.history.now()
        f.tail = delay

    def _api_outage_long(self, f: Fault, seconds: float, mode: str) -> None:
        self._api_outage(f, seconds, mode)

    def _api_outage(self, f: Fault, seconds: float, mode: str) -> None:
        proxy = self.proxy
        proxy.outage(None, mode=mode)
        try:
            time.sleep(seconds)  # the stimulus: how long the API is unreachable
        finally:
            proxy.end_outage()
        f.end = self.history.now()
        # Keys that failed all along sit in backoff (5 ms doubling, capped at 60 s) and watches
        # in the reflector's (0.8 s doubling, capped at 30 s): both bounded by about a minute.
        f.tail = min(60.0, 0.005 * 2 ** min(20, seconds / 2)) + 30.0

    def _hostile_edits(self, f: Fault, edits: int, gap: float, hold: float, seed: int) -> None:
        """Foreign values by hand (tests/chaos/hostile.py). Not blocking: a hostile value may
        stop at most its own object, instance or Session, and the checks excuse only reports
        about those (`HostileEdits.touching`) while the edit is in effect; everything else
        must go on as if the fault were not there."""
        assert self.hostile is not None, "a run with hostile edits passes HostileEdits"
        f.blocking = False
        self.hostile.run(edits, gap, hold, seed)
        f.end = self.history.now()


def _secs(t: float | None) -> str:
    return "never" if t is None else f"{t:.1f}s"
