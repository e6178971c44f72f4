"""`warmpool demo`: the seed's defect, replayed against the real system, with a verdict.

It starts everything on this machine (control plane, then `warmpool.harness`: a Redis of its
own, a scheduler, the `warmpool worker` command), then
acts as a person and Theia Cloud would: an AppDefinition, Sessions claiming instances, the admin
lowering minInstances below claimed ids (what made the Java operator delete live allow-lists),
Sessions ending. The controller is never called directly; the demo only writes to the API server
and watches the pool converge, then checks the invariants I1-I6 (and the routes', R1-R2).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import click
import urllib3
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from warmpool import invariants
from warmpool.cluster import local
from warmpool.errors import Unreachable
from warmpool.harness import System, SystemOptions
from warmpool.kube.api import Kube, KubeError, connect
from warmpool.kube.observe import group_pool, list_pool_objects, list_session_routes
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.instances import holders
from warmpool.pool.meta import name_of, owner_refs
from warmpool.pool.model import parse_session
from warmpool.pool.parts import Part
from warmpool.pool.routes import route_name
from warmpool.queue.embedded import EmbeddedRedisMissing, valkey_server_class
from warmpool.testing.gateway import ensure_shared_route
from warmpool.testing.waiting import WaitTimeout, wait_for

NAMESPACE = "warmpool-demo"
APPDEF = "java-17"
USERS = ["ada@example.com", "grace@example.com", "linus@example.com", "barbara@example.com"]


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.rows: list[tuple[str, str]] = []

    def add(self, text: str) -> None:
        self.rows.append((f"{time.monotonic() - self.start:6.1f}s", text))

    def table(self) -> Table:
        t = Table(title="timeline", show_header=False, box=None, pad_edge=False)
        for when, text in self.rows[-10:]:
            t.add_row(when, text)
        return t


def pool_table(kube: Kube) -> Table:
    objects = list_pool_objects(kube, NAMESPACE)
    items, _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, NAMESPACE)
    sessions = [parse_session(s) for s in items]
    ad = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, NAMESPACE, APPDEF)
    spec = (ad or {}).get("spec") or {}
    t = Table(title=f"pool {APPDEF}  minInstances={spec.get('minInstances', '-')}", width=78)
    for col in ("id", "state", "objects", "session", "allow-list", "owners", "route"):
        t.add_column(col)
    routes_by_name = {name_of(r) for r in list_session_routes(kube, NAMESPACE)}
    pool = group_pool(objects, APPDEF, None, sessions)
    for k, inst in sorted(pool.items()):
        held = holders(inst, APPDEF, sessions)
        email = inst.get(Part.EMAIL_CONFIGMAP)
        allow = (email.get("data") or {}).get(v.EMAILS_KEY, "") if email else "MISSING"
        owners = sorted({r["kind"][:7] for _, o in inst.existing() for r in owner_refs(o)})
        # A holder's route, then its URL (HANDLED -> URL ready; the local stack has no
        # gateway, so the URL comes with HANDLED: the probe is off).
        route = ""
        if held:
            routed = route_name(held[0].uid) in routes_by_name
            route = ("url ready" if held[0].url else "routed") if routed else "none"
        t.add_row(str(k), "claimed" if held else "free", f"{len(inst.existing())}/5",
                  held[0].name if held else "", allow or "(empty)", "+".join(owners), route)
    waiting = [s.name for s in sessions if s.live and s.status == v.STATUS_HANDLING]
    if waiting:
        t.caption = f"waiting: {', '.join(waiting)}"
    return t


@click.command()
@click.option("--keep", is_flag=True, help="Leave the system running and print how to reach it.")
@click.option("--workers", default=2, show_default=True, help="Worker processes.")
@click.option("--threads", default=4, show_default=True, help="Threads per worker process.")
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait per step.")
def demo(keep: bool, workers: int, threads: int, timeout: float) -> None:
    """Replay Theia Cloud's pool defect against warmpool and check the invariants."""
    # The demo talks only to its own loopback control plane, whose self-signed certificate is
    # skipped on purpose; the warning per request would bury the table.
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    console = Console(width=min(Console().width, 80))
    state = Path(os.environ.get("WARMPOOL_STATE", Path.home() / ".local/state/warmpool")) / "demo"
    redis_url = os.environ.get("WARMPOOL_REDIS_URL")
    if not redis_url:  # before the control plane: its first start takes minutes
        try:
            valkey_server_class()
        except EmbeddedRedisMissing as exc:
            raise Unreachable(str(exc)) from None
    timeline = Timeline()
    ok = False
    cluster: local.ClusterInfo | None = None
    system: System | None = None
    running = False
    try:
        console.print("[bold]warmpool demo[/]: starting the local control plane …")
        cluster = local.up(state / "cluster")  # builds the binaries first if missing
        timeline.add("control plane up")
        kube = Kube(connect(str(cluster.kubeconfig)))
        _fresh_namespace(kube)
        system = System(cluster, SystemOptions(
            namespaces=[NAMESPACE], workers=workers, threads=threads,
            # One `warmpool worker` supervisor, as deployed: it serves the workers' metrics
            # and, with --keep, outlives the demo.
            worker_command=True,
            # WARMPOOL_REDIS_URL's server, else one of our own; the queue's default keys
            # either way, so `warmpool queue` and friends read it as they are.
            redis=redis_url or "private", tag=None,
            workdir=state, log_dir=state / "logs",
            # No gateway in the local stack routes to an instance: the URL comes with
            # HANDLED (session-lifecycle §2, the probe switched off).
            env={"WARMPOOL_URL_PROBE": os.environ.get("WARMPOOL_URL_PROBE", "off")}))
        system.start()
        running = True
        timeline.add("Redis " + ("from WARMPOOL_REDIS_URL" if redis_url else "embedded"))
        timeline.add(f"scheduler + {workers} worker processes x {threads} threads")
        ok = _scenario(kube, system, timeline, console, timeout)
    finally:
        if keep and cluster is not None and system is not None and running:
            metrics = "".join(f"\n  {name} metrics: {url}"
                              for name, url in system.metrics_urls().items())
            pids = " ".join(map(str, system.detach()))
            console.print(f"left running.\n  export KUBECONFIG={cluster.kubeconfig}\n"
                          f"  export WARMPOOL_REDIS_URL={system.redis.url}{metrics}\n"
                          f"  logs: {system.log_dir}\n"
                          f"to stop: kill {pids}; warmpool cluster down --state-dir "
                          f"{state / 'cluster'}")
        else:
            if system is not None:
                system.stop()
            if cluster is not None:
                local.down(state / "cluster")
    raise SystemExit(0 if ok else 1)


def _fresh_namespace(kube: Kube) -> None:
    if kube.get("v1", "Namespace", "", NAMESPACE) is not None:
        kube.delete("v1", "Namespace", "", NAMESPACE)
        _wait(lambda: kube.get("v1", "Namespace", "", NAMESPACE) is None, 120)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})


def _wait(predicate: Callable[[], bool], timeout: float, tick: Callable[[], None] | None = None,
          ) -> bool:
    """Whether `predicate` held within `timeout` (a busy API server answering an error counts
    as "not yet"); `tick` runs before each look (the live table)."""
    def look() -> bool:
        if tick:
            tick()
        return predicate()

    try:
        wait_for(look, timeout=timeout, interval=0.25, ignore=(KubeError,))
    except WaitTimeout:
        return False
    return True


def _scenario(kube: Kube, system: System, timeline: Timeline, console: Console,
              timeout: float) -> bool:
    def quiet() -> bool:
        return not invariants.check(kube, NAMESPACE, quiet=True)

    with Live(console=console, refresh_per_second=4) as live:
        def tick() -> None:
            live.update(Group(pool_table(kube), timeline.table()))
            if dead := system.dead():
                raise click.ClickException(f"{', '.join(dead)} exited; see "
                                           f"{system.log_path(dead[0])}")

        def step(text: str, action: Callable[[], object]) -> bool:
            timeline.add(text)
            since = system.mark()
            action()
            # Converged: the invariants hold, and the work the action caused has run (a run
            # since the mark, the queue idle: `System.wait_quiet`'s condition, polled here so
            # the table stays live).
            converged = _wait(lambda: quiet() and not system.quiet(since), timeout, tick)
            timeline.add("  converged" if converged else "  NOT converged in time")
            tick()
            return converged

        ensure_shared_route(kube, NAMESPACE, "demo", hostnames=(PoolSettings().instances_host,))
        ok = step("AppDefinition java-17 with minInstances=4", lambda: kube.create({
            "apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND,
            "metadata": {"name": APPDEF, "namespace": NAMESPACE},
            "spec": {"name": APPDEF, "image": "theiacloud/theia-cloud-demo:1.0", "uid": 101,
                     "port": 3000, "minInstances": 4, "maxInstances": 8,
                     "ingressname": "demo", "requestsCpu": "100m", "requestsMemory": "64Mi",
                     "limitsCpu": "1", "limitsMemory": "512Mi"}}))
        ok &= step("4 Sessions claim instances", lambda: [kube.create({
            "apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
            "metadata": {"name": f"session-{i}", "namespace": NAMESPACE},
            "spec": {"name": f"session-{i}", "appDefinition": APPDEF, "user": user}})
            for i, user in enumerate(USERS, 1)])
        ok &= step("admin lowers minInstances to 1 (the defect)", lambda: kube.merge_patch(
            v.APPDEF_API_VERSION, v.APPDEF_KIND, NAMESPACE, APPDEF, {"spec": {"minInstances": 1}}))
        # The pool as the defect left it in the Java operator: here 2-4 keep all five objects.
        live.console.print(pool_table(kube))
        ok &= step("Sessions 2-4 end", lambda: [kube.delete(
            v.SESSION_API_VERSION, v.SESSION_KIND, NAMESPACE, f"session-{i}") for i in (2, 3, 4)])
    console.print()
    violations = invariants.check(kube, NAMESPACE, quiet=True)
    for violation in violations:
        console.print(f"[red]✗ {violation}[/]")
    if ok and not violations:
        console.print("[green]✓ invariants I1-I6 and R1-R2 hold: no claimed instance lost an "
                      "object, each holder has its route, nothing orphaned[/]")
        return True
    console.print("[red]✗ the pool did not converge to a correct state[/]")
    return False
