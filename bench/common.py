"""What the cluster benchmarks share: a private control plane, the latency proxy, a private
queue with real worker processes and a real scheduler, a watch-fed object counter, RSS, and
the result rows.

Everything a benchmark starts is its own: a control plane in a temporary state directory, a
Redis key prefix and dramatiq namespace unique to the run, its own namespace, its own processes.
Nothing here is a test: it measures and reports; it asserts no time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from scheduler.process import SchedulerProcess
from warmpool.cluster import local
from warmpool.kube.api import Kube, connect
from warmpool.kube.observe import POOL_SELECTOR
from warmpool.kube.reflector import Reflector, Watched
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import MAX_INSTANCES_CEILING
from warmpool.queue.inspect import Inspector
from warmpool.queue.redis_conn import connect as redis_connect
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings
from warmpool.testing import apiproxy
from warmpool.testing.gateway import ensure_shared_route
from workers.process import WorkerPool

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("bench")

POOL_KINDS = (("v1", "Service"), ("apps/v1", "Deployment"), ("v1", "ConfigMap"))
PARTS_PER_INSTANCE = 5


def quiet_warnings() -> None:
    """The local cluster's certificate is self-signed on purpose: no warning per request."""
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    logging.getLogger("urllib3").setLevel(logging.ERROR)


def say(msg: str) -> None:
    """Progress on stderr (the rows go to stdout)."""
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# ---- result rows ----------------------------------------------------------------------------


@dataclass
class Row:
    bench: str
    case: str
    result: str
    goal: str = ""
    baseline: str = ""
    verdict: str = ""  # "met" | "MISSED" | "" (information only)
    note: str = ""


HEADER = ("benchmark", "case", "result", "goal", "baseline (same run)", "verdict", "notes")


def table(rows: Sequence[Row]) -> list[str]:
    """A Markdown table of the rows."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        out.append("| " + " | ".join(cell(x) for x in (r.bench, r.case, r.result, r.goal,
                                                          r.baseline, r.verdict, r.note)) + " |")
    return out


def print_rows(rows: Sequence[Row]) -> None:
    for line in table(rows):
        print(line, flush=True)


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "MISSED")


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def dur_summary(label: str, values: Sequence[float]) -> str:
    """"claim jobs p50 120 ms, p99 900 ms (n=...)" for a list of seconds."""
    if not values:
        return f"{label}: none"
    return (f"{label} p50 {pct(values, 0.5) * 1000:.0f} ms, p99 {pct(values, 0.99) * 1000:.0f} "
            f"ms (n={len(values):,})")


def fmt_s(seconds: float | None, digits: int = 1) -> str:
    if seconds is None or seconds != seconds:
        return "n/a"
    return f"{seconds:.{digits}f} s"


# ---- machine --------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
        # What the run itself writes (docs/benchmarks*.md) does not make the code dirty.
        dirty = [line for line in subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
            check=True).stdout.splitlines() if "docs/benchmarks" not in line]
        if dirty:
            commit += " (work tree has uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "nproc": str(os.cpu_count()),
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
    }


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class LoadSampler:
    """Samples the 1-minute load average every few seconds while a benchmark runs."""

    def __init__(self, period: float = 5.0) -> None:
        self.period = period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            if self._stop.wait(self.period):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)

    def summary(self) -> str:
        if not self.samples:
            return "n/a"
        return (f"min {min(self.samples):.1f} / mean {sum(self.samples) / len(self.samples):.1f}"
                f" / max {max(self.samples):.1f}")


#: Which process is which, by its command line (first match wins): for `CpuMeter`.
ROLES = (("kube-apiserver", "kube-apiserver"), ("etcd", "bin/etcd"),
         ("kube-controller-manager", "kube-controller-manager"),
         ("fake kubelet", "warmpool.cluster.fake_kubelet"), ("scheduler", "-m scheduler"),
         ("workers", "multiprocessing.spawn"), ("redis", "redis-server"),
         ("redis", "valkey-server"))


def _cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) so far of every process on the machine, summed by role;
    the rest of the machine (the bench itself, its proxy and fake kubelet among it) apart."""
    tick = os.sysconf("SC_CLK_TCK")
    own = os.getpid()
    out: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if not cmd:
            continue  # a kernel thread
        role = ("bench (its proxy and watches)" if int(entry.name) == own
                else next((r for r, needle in ROLES if needle in cmd), "other"))
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class CpuMeter:
    """CPU seconds each role used between `start()` and `stop()` (processes that ended in
    between are not counted: a window's processes must outlive it)."""

    def __init__(self) -> None:
        self.used: dict[str, float] = {}
        self.wall = 0.0
        self._before: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> CpuMeter:
        self._before, self._t0 = _cpu_by_role(), time.monotonic()
        return self

    def stop(self) -> CpuMeter:
        after = _cpu_by_role()
        self.wall = time.monotonic() - self._t0
        self.used = {r: after[r] - self._before.get(r, 0.0) for r in after
                     if after[r] - self._before.get(r, 0.0) > 0}
        return self

    def describe(self, per: int = 0, what: str = "") -> str:
        """"kube-apiserver 68 s (0.85 cores, 93 ms / Session), ..." largest first."""
        if not self.used:
            return "n/a"
        parts = []
        for role, sec in sorted(self.used.items(), key=lambda x: -x[1]):
            part = f"{role} {sec:.0f} s ({sec / max(self.wall, 1e-9):.2f} cores"
            if per:
                part += f", {sec / per * 1000:.0f} ms / {what}"
            parts.append(part + ")")
        return (f"CPU over {self.wall:.0f} s on {os.cpu_count()} cores: " + ", ".join(parts))


# ---- memory ---------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a process, in kB."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                out[name] = int(rest.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (its threads included), from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hwm_mb(pid: int | None) -> float:
    return proc_status(pid).get("VmHWM", 0) / 1024 if pid else float("nan")


# ---- control plane and proxy ----------------------------------------------------------------


@contextlib.contextmanager
def private_cluster(tag: str) -> Iterator[local.ClusterInfo]:
    """A fresh local control plane of our own (temporary state directory), stopped after."""
    state = Path(tempfile.mkdtemp(prefix=f"warmpool-bench-{tag}-"))
    t = time.monotonic()
    info = local.up(state, watch_cache=True, die_with_parent=True)
    say(f"control plane {info.server} up in {time.monotonic() - t:.0f}s ({state})")
    try:
        yield info
    finally:
        try:
            local.down(state)
        finally:
            shutil.rmtree(state, ignore_errors=True)


def _proxy_without_nagle() -> None:
    """Workaround, until the proxy sets it itself: its handler writes a response's headers and
    body in separate sends, so with Nagle's algorithm on, every response waits for the
    client's delayed ACK (~40 ms on Linux); measured here: 1.5 ms direct, 57 ms through the
    proxy with no latency set. TCP_NODELAY on the accepted sockets (the standard library's
    own switch) removes that, so `latency=0.01` means 10 ms."""
    handler = getattr(apiproxy, "_Handler", None)
    if handler is not None and not getattr(handler, "disable_nagle_algorithm", False):
        handler.disable_nagle_algorithm = True


@contextlib.contextmanager
def latency_proxy(info: local.ClusterInfo, latency: float = 0.01,
                  seed: int = 7) -> Iterator[apiproxy.ApiProxy]:
    _proxy_without_nagle()
    with apiproxy.ApiProxy(upstream=info.server, token=info.token, seed=seed) as proxy:
        proxy.set(latency=latency)
        yield proxy


def direct_kube(info: local.ClusterInfo) -> Kube:
    return Kube(connect(str(info.kubeconfig)))


#: An oauth2-proxy configuration like the one Theia Cloud's chart installs in the namespace
#: (`oauth2-proxy-config`), with the placeholders the controller fills in per instance.
PROXY_TEMPLATE = "\n".join([
    'http_address = "0.0.0.0:5000"',
    'upstreams = ["http://127.0.0.1:placeholder-port/"]',
    'redirect_url = "https://placeholder/oauth2/callback"',
    'provider = "keycloak-oidc"',
    'oidc_issuer_url = "https://keycloak.example.com/realms/TheiaCloud"',
    'client_id = "theia-cloud"',
    'cookie_secret = "0123456789abcdef0123456789abcdef"',
    'cookie_secure = "true"',
    'email_domains = ["*"]',
    'authenticated_emails_file = "/emails/authenticated-emails-list"',
    'skip_provider_button = "true"',
    'pass_access_token = "true"',
    'pass_authorization_header = "true"',
    'set_authorization_header = "true"',
    'reverse_proxy = "true"',
    'ssl_upstream_insecure_skip_verify = "true"',
    'custom_templates_dir = "/templates"',
    'scope = "openid profile email"',
]) + "\n"


def new_namespace(kube: Kube, prefix: str) -> str:
    """A fresh namespace, with the `oauth2-proxy-config` ConfigMap a Theia Cloud namespace
    has (without it every reconcile's template read is a 404)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": v.NAMESPACE_PROXY_TEMPLATE, "namespace": name},
                 "data": {v.PROXY_CONFIG_KEY: PROXY_TEMPLATE}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Pods are refused until the default SA has its token
        sa = kube.get("v1", "ServiceAccount", name, "default")
        if sa is not None and sa.get("secrets"):
            break
        time.sleep(0.2)
    return name


def create_appdef(kube: Kube, ns: str, name: str, min_instances: int) -> dict[str, Any]:
    """The AppDefinition of the tests' world (tests/pool_world.py's create_appdef), and the
    shared route it names."""
    ensure_shared_route(kube, ns, "theia-cloud-demo-ws-ingress",
                        hostnames=(PoolSettings().instances_host,))
    return kube.create({
        "apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"name": f"{name}-app", "image": "theiacloud/theia-cloud-demo:1.0", "uid": 101,
                 "port": 3000, "ingressname": "theia-cloud-demo-ws-ingress",
                 # At the controller's default ceiling (warmpool.pool.model): above it the
                 # AppDefinition would be invalid and left as it is.
                 "minInstances": min_instances, "maxInstances": MAX_INSTANCES_CEILING,
                 "requestsCpu": "100m", "requestsMemory": "64Mi", "limitsCpu": "1",
                 "limitsMemory": "512Mi"},
    })


def set_min_instances(kube: Kube, ns: str, name: str, n: int) -> int:
    """Patch spec.minInstances; returns the AppDefinition's new metadata.generation."""
    obj = kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name,
                           {"spec": {"minInstances": n}})
    return int(obj["metadata"]["generation"])


def create_session(kube: Kube, ns: str, name: str, user: str, appdef: str) -> dict[str, Any]:
    return kube.create({
        "apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"name": name, "appDefinition": appdef, "user": user, "workspace": "ws"},
    })


# ---- watching what the cluster holds --------------------------------------------------------


def _gen_stub(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "gen": (meta.get("labels") or {}).get(v.LABEL_GENERATION),
            "id": naming.instance_id_from_name(meta.get("name") or ""),
            "claimed": any(r.get("kind") == v.SESSION_KIND
                           for r in meta.get("ownerReferences") or ())}


class PoolCounter:
    """Pool objects of a namespace (the three kinds, by the pool label), kept by watches on the
    direct connection: counting costs no request, however often it is asked."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self._stop = threading.Event()
        self.reflectors = [
            Reflector(kube, Watched(kind, api, POOL_SELECTOR), namespace,
                      lambda *_: None, summarize=_gen_stub, timeout_range=(240.0, 300.0))
            for api, kind in POOL_KINDS
        ]

    def start(self) -> PoolCounter:
        for r in self.reflectors:
            r.start(self._stop)
        for r in self.reflectors:
            r.synced.wait(60)
        return self

    def stop(self) -> None:
        self._stop.set()

    def counts(self, generation: int) -> tuple[int, int]:
        """(all pool objects, those labelled with `generation`)."""
        total = at_gen = 0
        want = str(generation)
        for r in self.reflectors:
            for stub in r.items():
                total += 1
                at_gen += stub.get("gen") == want
        return total, at_gen

    def converged(self, instances: int, generation: int) -> bool:
        total, at_gen = self.counts(generation)
        return total == at_gen == PARTS_PER_INSTANCE * instances

    def converged_free(self, instances: int, generation: int) -> bool:
        """Converged as far as free instances go (claimed ones keep their objects and their
        generation until released): every unclaimed id <= `instances` has its five objects
        at `generation`, and no unclaimed id above it has any."""
        parts: dict[int, int] = {}
        claimed: set[int] = set()
        stubs = [s for r in self.reflectors for s in r.items()]
        for s in stubs:
            if s.get("id") is not None and s.get("claimed"):
                claimed.add(s["id"])
        want = str(generation)
        for s in stubs:
            k = s.get("id")
            if k is None or k in claimed:
                continue
            if k > instances or s.get("gen") != want:
                return False
            parts[k] = parts.get(k, 0) + 1
        return all(parts.get(k, 0) == PARTS_PER_INSTANCE
                   for k in range(1, instances + 1) if k not in claimed)

    def wait(self, instances: int, generation: int, timeout: float,
             idle: Callable[[], bool] | None = None) -> float | None:
        """Seconds until `instances` full instances exist at `generation` and nothing else;
        None on timeout. With `idle`, the wait goes on until it is also true (not counted)."""
        start = time.monotonic()
        reached: float | None = None
        last_say = start
        while time.monotonic() - start < timeout:
            if reached is None and self.converged(instances, generation):
                reached = time.monotonic() - start
            if reached is not None and (idle is None or idle()):
                return reached
            if time.monotonic() - last_say > 30:
                last_say = time.monotonic()
                total, at_gen = self.counts(generation)
                say(f"  ... {time.monotonic() - start:.0f}s: {total} pool objects, {at_gen} at "
                    f"generation {generation}, want {PARTS_PER_INSTANCE * instances}")
            time.sleep(0.1)
        return reached


# ---- a private queue, workers and scheduler -------------------------------------------------


@dataclass
class Stack:
    """Queue settings unique to this run, worker processes and a scheduler on them.

    Workers import `workers.runlog` by default: the real handlers, each run logged to Redis
    first (so runs and their start times can be counted)."""

    redis_url: str
    kubeconfig: Path
    namespace: str
    processes: int = 2
    threads: int = 8
    modules: tuple[str, ...] = ("workers.runlog",)
    tag: str = field(default_factory=lambda: f"bench{uuid.uuid4().hex[:8]}")
    log_dir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.settings = QueueSettings(redis_url=self.redis_url, prefix=f"{self.tag}:warmpool:",
                                      namespace=f"{self.tag}:dramatiq")
        self.client: redis.Redis = redis_connect(self.redis_url)
        self.workers: WorkerPool | None = None
        self.scheduler: SchedulerProcess | None = None
        self.inspector = Inspector(self.client, self.settings)

    # workers
    def start_workers(self, processes: int | None = None, threads: int | None = None) -> None:
        self.workers = WorkerPool(
            self.settings, processes=processes or self.processes,
            threads=threads or self.threads, modules=self.modules,
            # No gateway routes to the instances here: a URL probe would only fail (the
            # claims measured are the pool's; the probe runs off the claim path anyway).
            # Strict minInstances: the pool benchmarks measure claims of prewarmed instances
            # (a burst would make up to maxInstances, the ceiling here, under churn).
            env={"KUBECONFIG": str(self.kubeconfig), "WARMPOOL_URL_PROBE": "off",
                 "WARMPOOL_BURST": "off", **self.worker_env})
        self.workers.start(timeout=120)

    def stop_workers(self) -> None:
        if self.workers is not None:
            self.workers.stop(timeout=30)
            self.workers = None

    def worker_pids(self) -> list[int]:
        return [p for p in (self.workers.pids if self.workers else []) if p]

    # scheduler
    def scheduler_env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig), "WARMPOOL_REDIS_URL": self.redis_url,
                "WARMPOOL_QUEUE_PREFIX": self.settings.prefix,
                "WARMPOOL_QUEUE_NAMESPACE": self.settings.namespace,
                "PYTHONWARNINGS": "ignore"}

    def start_scheduler(self) -> None:
        log_path = (self.log_dir / f"scheduler-{self.tag}.log") if self.log_dir else None
        self.scheduler = SchedulerProcess(
            ["--no-leader-elect", "--namespace", self.namespace, "--no-metrics",
             "--log-level", "WARNING"],
            env=self.scheduler_env(), log_path=log_path, cwd=REPO)
        self.scheduler.start(timeout=120)

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop(timeout=15)
            self.scheduler = None

    # the queue
    def idle(self) -> bool:
        s = self.inspector.stats()
        return s.waiting == 0 and s.running == 0 and s.delayed == 0

    def wait_idle(self, timeout: float = 120.0, settle: float = 0.5) -> bool:
        """Idle, and still idle `settle` seconds later (a run may add follow-ups)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.idle():
                time.sleep(settle)
                if self.idle():
                    return True
            time.sleep(0.1)
        return False

    @property
    def starts_key(self) -> str:
        from workers.runlog import starts_key

        return starts_key(self.settings)

    def _log(self, name: str) -> list[tuple[float, str]]:
        out = []
        for raw in self.client.lrange(name, 0, -1):
            t, _, key = text(raw).partition(" ")
            out.append((float(t), key))
        return out

    def starts(self) -> list[tuple[float, str]]:
        """Every job start logged so far: (time.time(), key)."""
        return self._log(self.starts_key)

    def durations(self, kind: str) -> list[float]:
        """Seconds each finished run of `kind` keys took (a key's runs never overlap, so its
        i-th end belongs to its i-th start)."""
        from workers.runlog import ends_key

        starts: dict[str, list[float]] = {}
        for t, key in self.starts():
            starts.setdefault(key, []).append(t)
        ends: dict[str, list[float]] = {}
        for t, key in self._log(ends_key(self.settings)):
            ends.setdefault(key, []).append(t)
        return [e - s for key, es in ends.items() if key.startswith(kind + "/")
                for s, e in zip(starts.get(key, []), es, strict=False)]

    def clear_starts(self) -> None:
        from workers.runlog import ends_key

        self.client.delete(self.starts_key, ends_key(self.settings))

    def close(self) -> None:
        try:
            self.stop_scheduler()
        finally:
            self.stop_workers()
            batch = list(self.client.scan_iter(match=f"{self.tag}:*", count=1000))
            for i in range(0, len(batch), 500):
                self.client.delete(*batch[i : i + 500])


def threaded(fn: Callable[[Any], Any], items: Sequence[Any], threads: int = 8) -> list[Any]:
    """Run fn over items on a few threads (the bench's own API traffic); results in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(fn, items))
