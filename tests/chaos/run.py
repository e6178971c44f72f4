"""Seeded chaos runs of the whole system: operations and faults interleaved, invariants watched.

One run (`run_chaos(cluster, ChaosConfig(seed=...))`) starts its own system on the given
control plane: a private Redis (valkey, so restarting and emptying it affects nobody else), a
fault-injecting API proxy (`warmpool.testing.apiproxy`), worker processes and two schedulers,
started by `warmpool.harness` (`system.py`). Workers and schedulers reach the API server
through the proxy; this runner and its checks talk to the real server directly, so they see
the truth while the controller sees faults.

The modules, one job each: `config` (ChaosConfig), `system` (the system under test),
`operations` (what people do), `faults` (the kinds, the seeded plan, the injector), `world`
(consistent snapshots), `watchdog` (what holds at every moment: Watchdog, DeletionAudit,
Excusals), `checks` (what holds once quiet), `history`, and this one, the run.

The seed fixes the sequence of operations and faults and all their parameters. (The system's
own timing is real concurrency, so two runs of one seed interleave differently; a failure
prints the seed and the history that led to it.)

Operations (what people and Theia Cloud do): AppDefinitions created (several, in two
namespaces) and deleted with live Sessions; Sessions created (valid, invalid, for unknown
AppDefinitions) and deleted, some before their claim can complete; minInstances raised and
lowered (to 0, below claimed ids); spec changes (generation bumps); pool objects deleted by
hand.

Faults (see `FAULT_KINDS`): worker processes SIGKILLed and restarted, the scheduler leader
SIGKILLed, Redis restarted with its data or emptied (or, on a run with Sentinels,
`ChaosConfig.sentinels`, its primary SIGKILLed or SIGSTOPped and a replica promoted:
`redis_failover`), the API answering 409/500/429, losing
responses to writes, dropping connections and watch streams, slow, or unreachable (outages),
and one worker process's watch events delivered seconds late (`watch_lag`: that worker alone
reaches the API through the proxy's second port, so its watch-fed reads fall behind the
others' and the truth while its writes stay prompt), and hostile edits: foreign values written
by hand into the labels, annotations and owner references the controller reads on pool objects
and Sessions (`hostile_edits`, tests/chaos/hostile.py, which also says how the checks tell a
refused hostile value from a violation).

Checks:

- at every moment (a watchdog polling a consistent snapshot: every list at one etcd revision):
  I3 and I4 (`warmpool.invariants.check(quiet=False)`); no object of an instance held by a
  Session is deleted or replaced unless the runner deleted it by hand (uid tracking); and a
  held instance's I1/I2 damage (a missing object, a missing owner, a wrong allow-list) is
  repaired within `missing_grace` seconds, not counting the time a fault made repair
  impossible (an outage, a dead leader, an emptied Redis: see `Fault.tail`), plus the delay
  of a lagging worker's watches while that fault lasts (`Fault.slack`).
- liveness (tests/chaos/liveness.py), at every poll: every valid Session with room served,
  every instance no live Session holds with an empty allow-list, no route of a Session that
  holds nothing, each within `liveness_bound` seconds of fault-free time.
- at quiescence (after every round of operations, faults stopped): all of I1-I6, zero lost or
  doubled claims (every live valid Session HANDLED on its own instance, or waiting while no
  instance is free), invalid Sessions in ERROR, no orphaned pool object.

I1 reports about held instances of a deleted AppDefinition are sorted out by `Excusals` (the
checker cannot see such instances; nothing can rebuild their objects): see its docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import traceback
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.checks import quiet_problems, summary
from tests.chaos.config import ChaosConfig
from tests.chaos.faults import FaultInjector, plan_faults
from tests.chaos.history import History
from tests.chaos.hostile import HostileEdits
from tests.chaos.operations import Operations
from tests.chaos.system import chaos_system
from tests.chaos.watchdog import DeletionAudit, Watchdog
from tests.chaos.world import PinnedKube
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.kube.api import Kube, connect
from warmpool.testing.world import create_namespace


@dataclass
class ChaosResult:
    seed: int
    ops: Counter[str]
    failed_ops: Counter[str]
    faults: Counter[str]
    skipped_faults: Counter[str]
    api: dict[str, int]
    violations: list[str]
    rounds: int
    settle_seconds: list[float]
    duration: float
    polls: int
    history: list[str]
    notes: list[str]
    workdir: Path
    rerun: str = ""
    deletions_audited: int = 0
    audit_gaps: int = 0
    gc_races: int = 0
    double_claims: int = 0  # held-looking objects deleted in settling a double claim
    unrebuildable: list[str] = field(default_factory=list)
    hostile_edits: int = 0  # hostile edits made (refused by the API server included)
    hostile: str = ""  # their categories and outcomes
    hostile_log: list[str] = field(default_factory=list)  # every edit, as the history wrote it
    liveness: str = ""  # the liveness check's obligations met and longest waits
    liveness_met: int = 0  # obligations (serve, revoke, route) seen unmet, then met in time
    liveness_bound: float = 30.0  # L of the run

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("ops", "failed_ops", "faults", "skipped_faults", "api"):
            out[name] = dict(out[name])
        out["workdir"] = str(self.workdir)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChaosResult:
        data = dict(data)
        for name in ("ops", "failed_ops", "faults", "skipped_faults"):
            data[name] = Counter(data[name])
        data["workdir"] = Path(data["workdir"])
        return cls(**data)

    @property
    def operations(self) -> int:
        return sum(self.ops.values()) + sum(self.failed_ops.values())

    @property
    def fault_count(self) -> int:
        return sum(self.faults.values())

    def report(self) -> str:
        lines = [f"chaos seed={self.seed}: {self.operations} operations, {self.fault_count} "
                 f"faults, {len(self.violations)} violations, {self.rounds} rounds, "
                 f"{self.duration:.0f}s (workdir {self.workdir})",
                 f"  operations: {dict(self.ops)} failed: {dict(self.failed_ops)}",
                 f"  faults: {dict(self.faults)} (skipped, overlapping: "
                 f"{dict(self.skipped_faults)})",
                 f"  API faults injected by the proxy: {self.api}",
                 f"  settle times (s): {[round(s, 1) for s in self.settle_seconds]}",
                 f"  watchdog polls: {self.polls}; deletions audited: {self.deletions_audited}"
                 f" (watch gaps: {self.audit_gaps}; held objects the garbage collector took "
                 f"from claims racing their AppDefinition's deletion: {self.gc_races}; "
                 f"double claims settled: {self.double_claims})"]
        if self.hostile_edits:
            lines.append(f"  hostile edits: {self.hostile}")
            if not self.violations:  # with violations, all of them follow the history
                lines += [f"    {h}" for h in self.hostile_log[-40:]]
        if self.liveness:
            lines.append(f"  liveness: {self.liveness}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  excused, not rebuildable (AppDefinition gone, damaged by hand or by the "
                  f"garbage collector racing a claim): {x}"
                  for x in self.unrebuildable]
        if self.violations:
            lines.append(f"VIOLATIONS (seed {self.seed}; replay: {self.rerun}):")
            lines += [f"  {x}" for x in self.violations]
            lines.append("history (operations and faults up to the first violation):")
            lines += [f"  {h}" for h in self.history]
            if self.hostile_log:
                lines.append("hostile edits (all):")
                lines += [f"  {h}" for h in self.hostile_log]
        return "\n".join(lines)


def make_namespaces(kube: Kube, seed: int) -> list[str]:
    tag = uuid.uuid4().hex[:5]
    names = [f"chaos-{seed}-{tag}-a", f"chaos-{seed}-{tag}-b"]
    for ns in names:
        create_namespace(kube, ns, labels={"warmpool-test": "chaos"})
    return names


def run_chaos(cluster: ClusterInfo, cfg: ChaosConfig, workdir: Path,
              progress: Callable[[str], None] | None = None) -> ChaosResult:
    """One seeded run; returns its result (violations included), never raises on them."""
    say = progress or (lambda _: None)
    # The runner's own clients reach the loopback test cluster without verifying its cert.
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    history = History(cfg.history)
    direct = Kube(connect(str(cluster.kubeconfig)))
    pinned = PinnedKube(connect(str(cluster.kubeconfig)))
    namespaces = make_namespaces(direct, cfg.seed)
    system = chaos_system(cluster, cfg, workdir, namespaces)
    proxy = system.proxy
    assert proxy is not None
    ops = Operations(direct, namespaces, rng, cfg, history)
    hostile = HostileEdits(Kube(connect(str(cluster.kubeconfig))), namespaces, cfg, history,
                           hidden=ops.hidden)
    faults = FaultInjector(system, cfg, history, ops, hostile)
    dog = Watchdog(pinned, namespaces, cfg, history, faults, ops, hostile)
    audit = DeletionAudit(Kube(connect(str(cluster.kubeconfig))),
                          PinnedKube(connect(str(cluster.kubeconfig))), namespaces,
                          ops, history, dog.violate, proxy.deleted)
    plan = plan_faults(random.Random(cfg.seed * 7919 + 1), cfg)
    settle: list[float] = []
    notes: list[str] = []
    started = time.monotonic()
    rounds = 0
    try:
        system.start()
        history.add("setup", f"namespaces {namespaces}, redis {system.redis.url}, "
                    f"proxy {proxy.url}")
        ops.setup()
        settle.append(_settle(pinned, namespaces, cfg, history, dog, system))
        dog.start()
        audit.start()
        pending: list[tuple[str, dict]] = []
        for i in range(cfg.ops):
            pending += plan.get(i, [])
            pending = [f for f in pending if not faults.start(*f)]
            if len(pending) > 3:  # its group stays busy: drop the oldest
                faults.skipped[pending.pop(0)[0]] += 1
            ops.step()
            time.sleep(rng.uniform(0, cfg.pace))  # stimulus: the seeded pace of operations
            last = i == cfg.ops - 1
            if (i + 1) % cfg.round_ops == 0 or last:
                rounds += 1
                faults.wait()
                proxy.reset()
                proxy.end_outage()
                system.ensure_running()
                took = _settle(pinned, namespaces, cfg, history, dog, system)
                settle.append(took)
                say(f"seed {cfg.seed}: {i + 1}/{cfg.ops} ops, {faults.started.total()} faults, "
                    f"{len(dog.violations)} violations, settled in {took:.1f}s")
                if dog.violations:
                    break
        dog.stop()
        audit.stop()
    except Exception as exc:
        dog.stop()
        audit.stop()
        dog.violations.append(f"the run failed: {exc!r}")
        history.add("error", traceback.format_exc())
    finally:
        faults.wait(30)
        if faults.errors:
            notes += [f"fault could not be applied: {e}" for e in faults.errors]
        notes += faults.notes
        dog.violations += faults.violations
        api = proxy.stats()
        system.stop()
        for ns in namespaces:
            with contextlib.suppress(Exception):
                direct.delete("v1", "Namespace", ns, ns)
    return ChaosResult(
        seed=cfg.seed, ops=ops.done, failed_ops=ops.failed, faults=faults.started,
        skipped_faults=faults.skipped, api=api, violations=dog.violations, rounds=rounds,
        settle_seconds=settle, duration=time.monotonic() - started, polls=dog.polls,
        history=dog.first_history or history.tail(), notes=notes, workdir=workdir,
        rerun=cfg.command(), deletions_audited=audit.audited, audit_gaps=audit.gaps,
        gc_races=audit.gc_races, double_claims=audit.double_claims,
        unrebuildable=sorted(dog.excusals.unrebuildable),
        hostile_edits=len(hostile.edits), hostile=hostile.summary(),
        hostile_log=[e.describe() for e in hostile.snapshot()],
        liveness=dog.liveness.summary(), liveness_met=dog.liveness.met.total(),
        liveness_bound=cfg.liveness_bound)


def _settle(kube: PinnedKube, namespaces: list[str], cfg: ChaosConfig, history: History,
            dog: Watchdog, system: System) -> float:
    """Wait until the quiet checks pass twice in a row; a timeout is a violation."""
    t0 = time.monotonic()
    history.add("settle", "waiting for quiescence")
    problems: list[str] = []
    passes = 0
    last_note = t0
    while time.monotonic() - t0 < cfg.settle_timeout:
        try:
            problems = quiet_problems(kube, namespaces, dog.excusals, dog.hostile)
        except Exception as exc:
            problems = [f"check failed: {exc!r}"]
        passes = passes + 1 if not problems else 0
        if problems and dog.violations and time.monotonic() - t0 > 30:
            break  # already failed: the history matters more than waiting out the timeout
        if problems and time.monotonic() - last_note > 10:
            last_note = time.monotonic()
            history.add("settle", f"{len(problems)} problems: " + "; ".join(problems[:6]))
            history.add("settle", queue_notes(system))
        if passes >= 2:
            took = time.monotonic() - t0
            history.add("settle", f"quiet after {took:.1f}s: {summary(kube, namespaces)}")
            return took
        time.sleep(0.5)  # the poll interval of the settle loop (it has a deadline)
    last = ""
    if dog.hostile is not None and dog.hostile.edits:
        last = " [last hostile edits: " + "; ".join(
            e.describe() for e in dog.hostile.recent(history.now())) + "]"
    dog.violate(f"did not settle in {time.monotonic() - t0:.0f}s: " + "; ".join(problems[:12]),
                f" ({queue_notes(system)}){last}")
    return time.monotonic() - t0


def queue_notes(system: System) -> str:
    """The queue's state, for a history line: what waits, runs, backs off or died."""
    try:
        insp = system.inspector
        stats = insp.stats()
        delayed = [f"{k} in {s:.1f}s" for k, s in insp.delayed(8)]
        running = [f"{r.key} ({r.holder})" for r in insp.running(8)]
        waiting = sorted(insp.census().waiting)[:8]
        leader = system.leader()
        return (f"queue: {stats}; waiting {waiting}; delayed {delayed}; running {running}; "
                f"scheduler leader {leader}")
    except Exception as exc:
        return f"queue: unavailable ({exc!r})"
