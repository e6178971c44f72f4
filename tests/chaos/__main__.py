"""The long chaos tier: `python -m tests.chaos --seeds 1,2,3 --ops 10000`.

Starts a local control plane of its own (or uses WARMPOOL_TEST_KUBECONFIG's cluster), runs
each seed, prints each result, and writes the figures into docs/reliability.md (--report).
With --results FILE each finished seed is appended there (JSON lines) and seeds already in it
for the same settings are not run again: an interrupted run is resumed by running the same
command. Exit status 1 if any seed found a violation, 3 if the control plane itself died
(nothing recorded for that seed: run the same command again).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.config import ROOT, ChaosConfig
from tests.chaos.faults import fault_kinds
from tests.chaos.report import figures, write_figures
from tests.chaos.run import ChaosResult, run_chaos
from warmpool.cluster import local

EXIT_ENVIRONMENT = 3  # the control plane died under the run: run the same command again


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    p.add_argument("--ops", type=int, default=10000, help="operations per seed")
    p.add_argument("--ops-per-fault", type=int, default=25,
                   help="one injected fault per this many operations")
    p.add_argument("--round-ops", type=int, default=250,
                   help="operations between two quiescence checks")
    p.add_argument("--long-outages", type=int, default=None,
                   help="30 s API outages per seed [default: one per 2500 operations]")
    p.add_argument("--outage-seconds", default="3,10",
                   help="MIN,MAX seconds of the short API outages [default: 3,10]")
    p.add_argument("--sentinels", type=int, default=0,
                   help="run Redis as a primary, a replica and this many Sentinels, every "
                   "process on the redis+sentinel:// URL; the Redis fault is then "
                   "redis_failover [default: 0, one Redis server]")
    p.add_argument("--hosts", action="store_true",
                   help="each worker and scheduler on a host (network namespace) of its own, "
                   "with the network faults (needs root) [default: one network]")
    p.add_argument("--kinds", default=None,
                   help="comma-separated fault kinds to inject [default: every kind that "
                   "fits the Redis: see FAULT_KINDS in tests/chaos/faults.py]")
    p.add_argument("--hostile-skip", default="",
                   help="comma-separated label/annotation keys hostile_edits leaves alone "
                   "(e.g. warmpool.io/fence) [default: none]")
    p.add_argument("--report", type=Path, default=ROOT / "docs" / "reliability.md",
                   help="where to write the figures ('-': nowhere)")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--results", type=Path, default=None,
                   help="append each seed's result here (JSON lines); resume from it")
    return p.parse_args(argv)


def _terminate(signum: int, frame: object) -> None:
    print(f"chaos: got signal {signum}; stopping what was started", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)  # unwind, so every seed stops its system and the cluster


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    kinds = (tuple(k.strip() for k in args.kinds.split(",") if k.strip())
             if args.kinds else None)
    try:  # an unknown kind, or one that does not fit the Redis: say so before starting
        fault_kinds(ChaosConfig(seed=0, sentinels=args.sentinels, kinds=kinds,
                                hosts=args.hosts))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="warmpool-chaos-"))
    if os.environ.get("WARMPOOL_TEST_KUBECONFIG"):
        from tests.conftest import _external_cluster

        cluster = _external_cluster(Path(os.environ["WARMPOOL_TEST_KUBECONFIG"]))
        owned = None
    else:
        owned = workdir / "cluster"
        cluster = local.up(owned, watch_cache=False, die_with_parent=True)
    print(f"chaos: cluster {cluster.server}, workdir {workdir}", flush=True)
    results: list[ChaosResult] = []
    done = _done(args.results)
    try:
        for seed in seeds:
            long_outages = (args.long_outages if args.long_outages is not None
                            else max(1, args.ops // 2500))
            lo, hi = (float(x) for x in args.outage_seconds.split(","))
            cfg = ChaosConfig(seed=seed, ops=args.ops, ops_per_fault=args.ops_per_fault,
                              round_ops=args.round_ops, long_outages=long_outages,
                              outage_seconds=(lo, hi), sentinels=args.sentinels,
                              kinds=kinds, hosts=args.hosts, hostile_skip=tuple(
                                  k for k in args.hostile_skip.split(",") if k))
            if cfg.command() in done:
                print(f"chaos: seed {seed} already in {args.results}", flush=True)
                results.append(done[cfg.command()])
                continue
            print(f"chaos: seed {seed}: {dataclasses.asdict(cfg)}", flush=True)
            t0 = time.monotonic()
            result = run_chaos(cluster, cfg, workdir / f"seed-{seed}",
                               progress=lambda m: print(f"  {m}", flush=True))
            print(result.report(), flush=True)
            if not local.apiserver_ready(cluster):
                # The control plane itself died (not the system under test): this seed says
                # nothing. Not recorded; the same command with --results runs it again.
                print(f"chaos: the control plane is gone; seed {seed} not recorded",
                      flush=True)
                return EXIT_ENVIRONMENT
            print(f"chaos: seed {seed} took {time.monotonic() - t0:.0f}s", flush=True)
            results.append(result)
            if args.results is not None:
                with args.results.open("a") as f:
                    f.write(json.dumps(result.to_json()) + "\n")
    finally:
        if owned is not None:
            local.down(owned)
    if str(args.report) != "-" and results:
        command = "python -m tests.chaos " + shlex.join(sys.argv[1:] if argv is None else argv)
        write_figures(args.report, figures(results, command, ROOT))
        print(f"chaos: figures written to {args.report}", flush=True)
    return 1 if any(r.violations for r in results) else 0


def _done(path: Path | None) -> dict[str, ChaosResult]:
    """Results already recorded, by the command line that replays each."""
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            result = ChaosResult.from_json(json.loads(line))
            out[result.rerun] = result
    return out


if __name__ == "__main__":
    sys.exit(main())
