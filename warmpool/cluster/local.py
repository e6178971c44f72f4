"""A real, local Kubernetes control plane for development, tests and CI.

Why a real one: the controller's correctness rests on API-server behaviour that fakes get wrong
or leave out (409 on a stale resourceVersion, 410 after compaction, owner-reference garbage
collection, status subresources, CRD pruning). So `up` runs etcd, kube-apiserver and
kube-controller-manager (v1.20.2, built by build.sh from Debian's source package) on loopback
ports, plus a "fake kubelet" that marks Pods Ready because there is no scheduler or kubelet.

Everything lives in one state directory: data, keys, kubeconfig, logs, and two runtime files:
`pids.json` (what to stop) and `cluster.json` (how to reach it). The processes run in their own
sessions so that they outlive the `warmpool cluster up` command; `down` stops them by pid, after
checking that the pid still belongs to the process we started (pids get reused).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

K8S_VERSION = "1.20.2"
BUILD_SCRIPT = Path(__file__).with_name("build.sh")
CRD_DIR = Path(__file__).resolve().parent.parent / "kube" / "crds"
#: Upstream Theia Cloud's CRD chart (theia-cloud-crds 1.3.0-next), vendored unmodified.
UPSTREAM_CHART = CRD_DIR / "theia-cloud-upstream"
#: The namespace the chart's templates are rendered for (Theia Cloud's default release's).
UPSTREAM_RELEASE_NAMESPACE = "theia-cloud"
#: Which Theia Cloud CRDs a control plane is started with (`crd_documents`): warmpool's own
#: (the EduIDE-Cloud fork's versions, AppDefinition v1beta11), or upstream's (v1beta10).
CRD_SETS = ("warmpool", "upstream")
BINARIES = ("kube-apiserver", "kube-controller-manager", "etcd", "etcdctl")
# Start order; `down` stops in reverse so that clients go before the servers they talk to.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "fake-kubelet")
CONTROLLERS = "garbagecollector,namespace,deployment,replicaset,serviceaccount,serviceaccount-token"
# Every pool instance has two ClusterIP Services, so this range bounds the pool size: a /16
# holds 65,534 ClusterIPs, pools of ~32,000 instances (the old 10.0.0.0/24 held 127). It is
# kind's default service subnet (inside kubeadm's 10.96.0.0/12); nothing routes it here (no
# kube-proxy), only the API server allocates from it. kube-apiserver 1.20 refuses IPv4 ranges
# wider than /12, and wider ones make every Service write heavier (the allocation bitmap is
# one etcd object). A state dir from the /24 days keeps its old ClusterIPs; the API server's
# repair loop logs them as out of range, harmless (delete the state dir for a clean one).
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc"
READY_TIMEOUT = 90.0
#: How often etcd tells its watchers the store's revision when nothing they watch changed.
PROGRESS_NOTIFY = "200ms"
STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 25


class ClusterError(RuntimeError):
    """A control-plane operation failed; `message` is one line, `detail` the evidence (log tail)."""

    def __init__(self, message: str, detail: str = "", log: Path | None = None) -> None:
        self.message = message
        self.detail = detail
        self.log = log
        super().__init__(message + (f"\n{detail}" if detail else ""))


@dataclass
class ClusterInfo:
    """How to reach a running control plane (the content of `cluster.json`).

    `state_dir` is None for a cluster that this module did not start (for example one given to
    the tests by WARMPOOL_TEST_KUBECONFIG); then `pids` is empty and `etcd_url` may be None.
    """

    kubeconfig: Path
    server: str
    token: str
    state_dir: Path | None = None
    etcd_url: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    watch_cache: bool = True
    crds: str = "warmpool"  # one of CRD_SETS

    def to_json(self) -> str:
        data = asdict(self)
        data["kubeconfig"] = str(self.kubeconfig)
        data["state_dir"] = str(self.state_dir) if self.state_dir else None
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterInfo:
        data = json.loads(text)
        data["kubeconfig"] = Path(data["kubeconfig"])
        data["state_dir"] = Path(data["state_dir"]) if data.get("state_dir") else None
        return cls(**data)


# ---- binaries ------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where build.sh puts the binaries: outside the repo, shared by all work trees."""
    base = os.environ.get("WARMPOOL_CACHE") or str(Path.home() / ".cache" / "warmpool")
    return Path(base) / f"k8s-{K8S_VERSION}"


def bin_dir() -> Path:
    return cache_dir() / "bin"


def build_recipe() -> str:
    """The RECIPE number in build.sh: binaries stamped with another one are stale."""
    match = re.search(r"^RECIPE=(\S+)$", BUILD_SCRIPT.read_text(), re.MULTILINE)
    return match.group(1) if match else ""


def binaries_present() -> bool:
    """True if build.sh would reuse the cache: all binaries there, built by the current recipe."""
    try:
        stamp = (bin_dir() / "RECIPE").read_text().strip()
    except OSError:
        return False
    return stamp == build_recipe() and all(
        os.access(bin_dir() / name, os.X_OK) for name in BINARIES
    )


def build(progress: bool = True) -> None:
    """Build (or reuse) the binaries by running build.sh; several minutes when cold.

    With `progress`, build.sh's stage lines go straight to our stderr; without, they are kept
    and shown only if the build fails.
    """
    cmd = ["bash", str(BUILD_SCRIPT), str(cache_dir())]
    if progress:
        rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, check=False).returncode
        if rc != 0:
            raise ClusterError(f"building the control plane failed (build.sh exit {rc})")
        return
    proc = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-LOG_TAIL_LINES:])
        raise ClusterError(f"building the control plane failed (build.sh exit {proc.returncode})",
                           tail)


# ---- small helpers -------------------------------------------------------------------------


def default_state_dir() -> Path:
    base = os.environ.get("WARMPOOL_STATE") or str(Path.home() / ".local" / "state" / "warmpool")
    return Path(base) / "cluster"


def free_port() -> int:
    """A loopback port free right now (a small race remains; `up` fails clearly if it is lost)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    """Distinct free ports: hold all sockets open while choosing so none is handed out twice."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """Serialize up/down on one state dir (two `up`s at once would start two etcds)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def insecure_ctx() -> ssl.SSLContext:
    # The apiserver's serving cert is self-signed and generated at first start: the kubeconfig
    # uses insecure-skip-tls-verify too. Loopback only, so nothing is exposed.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_ok(url: str, token: str | None = None, timeout: float = 2.0) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=insecure_ctx()) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def apiserver_ready(info: ClusterInfo) -> bool:
    return _http_ok(f"{info.server}/readyz", info.token)


# ---- process bookkeeping -------------------------------------------------------------------


def _proc_state(pid: int) -> str | None:
    """The /proc state letter, or None if the pid does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_ours(pid: int, marker: str) -> bool:
    """True if pid is alive (not a zombie) and still runs what we started (guards pid reuse)."""
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return any(marker in part for part in _cmdline(pid))


def _reap(pid: int) -> None:
    # When the caller (a test session) is the parent, a stopped child stays a zombie until
    # waited for; reap it so that "no process left" is literally true.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _read_pids(state_dir: Path) -> dict[str, dict[str, Any]]:
    path = state_dir / "pids.json"
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _write_pids(state_dir: Path, pids: dict[str, dict[str, Any]]) -> None:
    tmp = state_dir / "pids.json.tmp"
    tmp.write_text(json.dumps(pids, indent=2, sort_keys=True) + "\n")
    tmp.replace(state_dir / "pids.json")


def _await_exit(pid: int, marker: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not _is_ours(pid, marker):
            return True
        time.sleep(0.1)
    return False


def _await_reaped(pid: int, timeout: float = 3.0) -> None:
    """Give the parent (init, once the starting CLI has exited) a moment to reap the zombie,
    so that `pgrep` right after `down` shows nothing; a zombie that stays is dead anyway."""
    deadline = time.monotonic() + timeout
    while _proc_state(pid) is not None and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)


def _stop_pid(pid: int, marker: str, timeout: float = STOP_TIMEOUT) -> bool:
    """SIGTERM, wait, SIGKILL. Returns True if the process is gone (or was not ours)."""
    if not _is_ours(pid, marker):
        _reap(pid)
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _await_exit(pid, marker, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not _await_exit(pid, marker, 5.0):
            return False
    _await_reaped(pid)
    return True


def _tie_to_parent(argv: list[str]) -> list[str]:
    """Prefix argv so the process gets SIGTERM when its parent dies (test-owned clusters).

    util-linux's setpriv sets PR_SET_PDEATHSIG and execs, so the pid stays the component's.
    Not a preexec_fn: running Python in a child forked from a threaded test process can deadlock.
    """
    import shutil

    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


class _Starter:
    """Starts components, records each pid at once, and can undo everything it started."""

    def __init__(self, state_dir: Path, die_with_parent: bool) -> None:
        self.state_dir = state_dir
        self.logs = state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.die_with_parent = die_with_parent
        self.pids: dict[str, dict[str, Any]] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: Sequence[str], marker: str,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                _tie_to_parent(list(argv)) if self.die_with_parent else list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=env,
                start_new_session=True,  # survives the CLI; Ctrl-C in a shell does not reach it
            )
        self.procs[name] = proc
        self.pids[name] = {"pid": proc.pid, "marker": marker, "log": str(log)}
        _write_pids(self.state_dir, self.pids)
        return proc

    def fail(self, name: str, message: str) -> ClusterError:
        """Stop everything started so far and build the error to raise."""
        log = self.logs / f"{name}.log"
        tail = log_tail(log)
        last = tail.splitlines()[-1].strip() if tail.strip() else ""
        detail = f"--- last lines of {log} ---\n{tail}"
        self.stop_all()
        hint = f": {last[:200]}" if last else ""
        return ClusterError(f"{message}{hint} (log: {log})", detail, log)

    def stop_all(self) -> None:
        for name in reversed(list(self.pids)):
            entry = self.pids[name]
            _stop_pid(int(entry["pid"]), str(entry["marker"]))
            proc = self.procs.get(name)
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=1)
        with contextlib.suppress(OSError):
            (self.state_dir / "pids.json").unlink()

    def wait_until(self, name: str, check: Any, what: str, timeout: float = READY_TIMEOUT) -> None:
        """Poll `check()` until true; fail early with the log tail if the process exits."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise self.fail(name, f"{name} exited with code {proc.returncode} before {what}")
            if check():
                return
            time.sleep(0.2)
        raise self.fail(name, f"{name}: timed out after {timeout:.0f} s waiting for {what}")


# ---- keys, kubeconfig, CRDs ----------------------------------------------------------------


def _ensure_keys(state_dir: Path) -> tuple[Path, Path, str]:
    """Service-account key pair and admin token; kept across down/up so that the data in etcd
    (service-account token secrets) stays valid and old kubeconfigs keep working."""
    pki = state_dir / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    key, pub = pki / "sa.key", pki / "sa.pub"
    if not (key.exists() and pub.exists()):
        for argv in (
            ["openssl", "genrsa", "-out", str(key), "2048"],
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ClusterError(f"{' '.join(argv[:2])} failed", proc.stderr.strip())
        key.chmod(0o600)
    token_file = pki / "tokens.csv"
    if token_file.exists():
        token = token_file.read_text().split(",", 1)[0].strip()
    else:
        token = secrets.token_hex(24)
        token_file.write_text(f'{token},admin,admin,"system:masters"\n')
        token_file.chmod(0o600)
    return key, pub, token


def write_kubeconfig(path: Path, server: str, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "warmpool", "cluster": {
            "server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "warmpool", "context": {
            "cluster": "warmpool", "user": "admin", "namespace": "default"}}],
        "current-context": "warmpool",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)


def install_crds(kubeconfig: Path, timeout: float = 60.0, crds: str = "warmpool") -> list[str]:
    """Create or update every CRD of the set `crds` (`crd_documents`) and wait until each is
    Established.

    Done before kube-controller-manager starts: its garbage collector discovers CRDs created
    later only after 30 s and then backs off, so owner references to our kinds would be honoured
    a minute late.
    """
    import warnings

    import urllib3
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    with warnings.catch_warnings():
        # Our own loopback server with a self-signed cert: skipping verification is intended.
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        try:
            return _install_crds(client.ApiextensionsV1Api(api_client), ApiException, timeout,
                                 crds)
        finally:
            api_client.close()


def render_upstream_chart(chart: Path = UPSTREAM_CHART,
                          namespace: str = UPSTREAM_RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """Upstream's CRDs from the vendored Helm chart, rendered the way its README says for a
    control plane without a conversion webhook or cert-manager (this one runs neither), and
    without Helm (not installed here):

    - `{{ .Release.Namespace }}`, the only template expression the chart uses, becomes
      `namespace` (it names where the webhook's Service and certificate would live); any other
      expression is refused, so a chart that grew one is noticed rather than mis-rendered;
    - each CRD's `conversion:` block (strategy Webhook) is dropped, leaving the API server's
      default, None: its served versions then differ only in the apiVersion they show, which
      is enough for a reader of one version. All versions stay served, so discovery lists
      v1beta10 before v1beta9 and v1beta8 exactly as on a real upstream cluster.

    The vendored files themselves stay as they are."""
    docs: list[dict[str, Any]] = []
    for path in sorted((chart / "templates").glob("*.yaml")):
        text = path.read_text().replace("{{ .Release.Namespace }}", namespace)
        if "{{" in text:
            raise ClusterError(f"{path}: a template expression other than "
                               "{{ .Release.Namespace }}; render it with Helm")
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.get("spec", {}).pop("conversion", None)
                docs.append(doc)
    return docs


def crd_documents(crds: str = "warmpool") -> list[dict[str, Any]]:
    """The CRDs of a CRD set. "warmpool": every file in warmpool/kube/crds (Theia Cloud's kinds
    at the fork's versions, PoolSchedule, HTTPRoute). "upstream": upstream Theia Cloud's
    (`render_upstream_chart`) with warmpool's PoolSchedule and the Gateway API's HTTPRoute
    beside them, as on an upstream install that also runs a Gateway API implementation."""
    if crds not in CRD_SETS:
        raise ClusterError(f"unknown CRD set {crds!r}; one of {', '.join(CRD_SETS)}")
    own = [doc for path in sorted(CRD_DIR.glob("*.yaml"))
           for doc in yaml.safe_load_all(path.read_text()) if doc]
    if crds == "warmpool":
        return own
    upstream = render_upstream_chart()
    theirs = {doc["spec"]["group"] for doc in upstream}
    return upstream + [doc for doc in own if doc["spec"]["group"] not in theirs]


#: Answers of a server that is still settling: etcd's stream to a kube-apiserver that has
#: just reported ready can still break once ("rpc error: ... unexpected EOF", a 500; seen in a
#: full test run). Retried until the install's deadline, like any other wait for the server.
_TRANSIENT = frozenset({500, 503, 504})


def _install_crds(ext: Any, api_exception: type[Exception], timeout: float,
                  crds: str = "warmpool") -> list[str]:
    deadline = time.monotonic() + timeout

    def settling(exc: Exception) -> bool:
        return getattr(exc, "status", None) in _TRANSIENT and time.monotonic() < deadline

    names = []
    for doc in crd_documents(crds):
        name = doc["metadata"]["name"]
        names.append(name)
        while True:
            try:
                _create_or_replace_crd(ext, api_exception, doc)
                break
            except api_exception as exc:
                if not settling(exc):
                    raise
                time.sleep(0.2)
    pending = set(names)
    while pending:
        for name in sorted(pending):
            try:
                crd = ext.read_custom_resource_definition(name)
            except api_exception as exc:
                if not settling(exc):
                    raise
                continue
            conds = (crd.status.conditions if crd.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conds):
                pending.discard(name)
        if pending and time.monotonic() > deadline:
            raise ClusterError(f"CRDs not Established after {timeout:.0f} s: {sorted(pending)}")
        if pending:
            time.sleep(0.2)
    return names


def _create_or_replace_crd(ext: Any, api_exception: type[Exception],
                           doc: dict[str, Any]) -> None:
    name = doc["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body=doc)
    except api_exception as exc:
        if getattr(exc, "status", None) != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        doc["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, body=doc)


# ---- up / down / status --------------------------------------------------------------------


def _load_info(state_dir: Path) -> ClusterInfo | None:
    path = state_dir / "cluster.json"
    if not path.exists():
        return None
    try:
        return ClusterInfo.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _all_alive(state_dir: Path) -> bool:
    pids = _read_pids(state_dir)
    return bool(pids) and all(
        _is_ours(int(e["pid"]), str(e["marker"])) for e in pids.values()
    ) and set(pids) == set(COMPONENTS)


def up(state_dir: Path | None = None, watch_cache: bool | None = None,
       die_with_parent: bool = False, build_if_missing: bool = True,
       kubelet_args: Sequence[str] = (), crds: str = "warmpool") -> ClusterInfo:
    """Start etcd, kube-apiserver, CRDs, kube-controller-manager and the fake kubelet.

    Idempotent: if the state dir already has a healthy cluster, it is returned unchanged
    (unless `watch_cache` is given and differs: then it is restarted, keeping its data).
    `watch_cache=False` passes --watch-cache=false, so that a watch from a compacted
    resourceVersion really gets 410 Gone (the watch cache would otherwise answer from memory);
    None keeps a running cluster's setting, and for a new one reads WARMPOOL_WATCH_CACHE
    (default on). `die_with_parent` ties the processes to the
    calling process's life (tests), so a killed test run leaves nothing behind.
    `kubelet_args`: more flags of the fake kubelet (`--start-delay 5`, `--fail PATTERN=REASON`:
    `warmpool.cluster.fake_kubelet`), for a new cluster.
    `crds`: the CRD set installed (`crd_documents`): warmpool's own, or upstream Theia Cloud's.
    One API server holds one CRD per kind, so a set is a control plane of its own (its own
    state dir); a state dir that ran the other set is refused, not converted.
    If a step fails, everything started so far is stopped and a ClusterError carries the tail
    of the failing component's log.
    """
    state_dir = (state_dir or default_state_dir()).resolve()
    with _locked(state_dir):
        existing = _load_info(state_dir)
        if existing is not None and existing.crds != crds:
            raise ClusterError(f"{state_dir} holds a control plane with the {existing.crds} "
                               f"CRDs, not {crds}: use another state dir")
        if (existing is not None and watch_cache in (None, existing.watch_cache)
                and _all_alive(state_dir) and apiserver_ready(existing)):
            return existing
        if watch_cache is None:
            flag = os.environ.get("WARMPOOL_WATCH_CACHE", "1").lower()
            watch_cache = flag not in ("0", "false", "no", "off")
        # Leftovers of a crashed or half-stopped cluster: stop them before starting anew.
        _down_locked(state_dir)

        if not binaries_present():
            if not build_if_missing:
                raise ClusterError(f"control-plane binaries missing in {bin_dir()}; "
                                   "run `warmpool cluster build`")
            build(progress=True)
        bins = bin_dir()
        key, pub, token = _ensure_keys(state_dir)
        certs = state_dir / "certs"
        certs.mkdir(exist_ok=True)
        etcd_port, peer_port, api_port, kcm_port = _free_ports(4)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        server = f"https://127.0.0.1:{api_port}"
        kubeconfig = state_dir / "kubeconfig"
        write_kubeconfig(kubeconfig, server, token)
        info = ClusterInfo(
            kubeconfig=kubeconfig, server=server, token=token, state_dir=state_dir,
            etcd_url=etcd_url, watch_cache=watch_cache, crds=crds,
            ports={"etcd": etcd_port, "etcd-peer": peer_port, "kube-apiserver": api_port,
                   "kube-controller-manager": kcm_port},
        )

        st = _Starter(state_dir, die_with_parent)
        try:
            peer = f"http://127.0.0.1:{peer_port}"
            st.start("etcd", [
                str(bins / "etcd"), "--name=warmpool", f"--data-dir={state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=warmpool={peer}", "--initial-cluster-state=new",
                "--log-level=warn", "--logger=zap",
                # Tell every watcher (the API server's watch cache) how far the store has
                # come even when nothing of its kind changed: see EfficientWatchResumption.
                f"--experimental-watch-progress-notify-interval={PROGRESS_NOTIFY}",
            ], marker=str(bins / "etcd"))
            st.wait_until("etcd", lambda: _http_ok(f"{etcd_url}/health"), "etcd /health")

            api_argv = [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1", f"--secure-port={api_port}",
                "--advertise-address=127.0.0.1",
                # No kubelets, and Endpoints may not hold a loopback address: skip the
                # reconciler of the `kubernetes` Service's endpoints instead of logging errors.
                "--endpoint-reconciler-type=none",
                "--authorization-mode=RBAC",
                f"--token-auth-file={state_dir / 'pki' / 'tokens.csv'}",
                f"--service-account-key-file={pub}",
                f"--service-account-signing-key-file={key}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--cert-dir={certs}",
            ]
            if not watch_cache:
                api_argv.append("--watch-cache=false")
            else:
                # The watch cache of a kind advances on etcd's progress notifications too,
                # not only on that kind's changes (alpha in 1.20, on by default from 1.21): a
                # LIST at a recent resourceVersion of a quiet kind (the pods of a pool at
                # rest) is then answered from it within PROGRESS_NOTIFY, instead of waiting
                # 3 s for a change and failing with 504 (warmpool.kube.api.Kube.list).
                api_argv.append("--feature-gates=EfficientWatchResumption=true")
            st.start("kube-apiserver", api_argv, marker=str(bins / "kube-apiserver"))
            st.wait_until("kube-apiserver", lambda: apiserver_ready(info), "/readyz")

            try:
                install_crds(kubeconfig, crds=crds)
            except Exception as exc:
                raise st.fail("kube-apiserver", f"installing CRDs failed: {exc}") from exc

            kcm_certs = certs / "kube-controller-manager"
            kcm_certs.mkdir(exist_ok=True)
            st.start("kube-controller-manager", [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--controllers={CONTROLLERS}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={key}",
                f"--root-ca-file={certs / 'apiserver.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--bind-address=127.0.0.1", f"--secure-port={kcm_port}", "--port=0",
                f"--cert-dir={kcm_certs}",
            ], marker=str(bins / "kube-controller-manager"))
            st.wait_until("kube-controller-manager",
                          lambda: _http_ok(f"https://127.0.0.1:{kcm_port}/healthz"),
                          "its /healthz")

            ready_file = state_dir / "fake-kubelet.ready"
            with contextlib.suppress(OSError):
                ready_file.unlink()
            env = dict(os.environ)
            # The fake kubelet must import this package even when started from elsewhere.
            pkg_root = str(Path(__file__).resolve().parent.parent.parent)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
            env["PYTHONUNBUFFERED"] = "1"
            st.start("fake-kubelet", [
                sys.executable, "-m", "warmpool.cluster.fake_kubelet",
                "--kubeconfig", str(kubeconfig), "--ready-file", str(ready_file),
                *kubelet_args,
            ], marker="warmpool.cluster.fake_kubelet", env=env)
            st.wait_until("fake-kubelet", ready_file.exists, "its first pod list", timeout=30)
        except ClusterError:
            raise
        except BaseException as exc:
            st.stop_all()
            raise ClusterError(f"starting the control plane failed: {exc}") from exc

        info.pids = {name: int(entry["pid"]) for name, entry in st.pids.items()}
        tmp = state_dir / "cluster.json.tmp"
        tmp.write_text(info.to_json())
        tmp.replace(state_dir / "cluster.json")
        return info


def _down_locked(state_dir: Path) -> list[str]:
    pids = _read_pids(state_dir)
    order = [n for n in COMPONENTS if n in pids] + [n for n in pids if n not in COMPONENTS]
    order.reverse()  # clients first, etcd last
    left = []
    for name in order:
        entry = pids[name]
        if not _stop_pid(int(entry["pid"]), str(entry["marker"])):
            left.append(f"{name} (pid {entry['pid']})")
    if left:
        raise ClusterError(f"could not stop: {', '.join(left)}")
    for runtime in ("pids.json", "cluster.json", "fake-kubelet.ready"):
        with contextlib.suppress(OSError):
            (state_dir / runtime).unlink()
    return order


def down(state_dir: Path | None = None) -> list[str]:
    """Stop every component by pid (SIGTERM, then SIGKILL) and check that none is left.

    Keeps data, keys, kubeconfig and logs; removes only the runtime files (pids.json,
    cluster.json). Returns the names of the components that had been recorded.
    """
    state_dir = (state_dir or default_state_dir()).resolve()
    if not state_dir.exists():
        return []
    with _locked(state_dir):
        return _down_locked(state_dir)


def status(state_dir: Path | None = None) -> dict[str, Any]:
    """Per component: pid and whether it runs; plus whether the apiserver answers /readyz."""
    state_dir = (state_dir or default_state_dir()).resolve()
    pids = _read_pids(state_dir)
    loaded = _load_info(state_dir)
    components = {}
    for name in COMPONENTS:
        entry = pids.get(name)
        alive = bool(entry and _is_ours(int(entry["pid"]), str(entry["marker"])))
        components[name] = {"pid": int(entry["pid"]) if entry else None, "running": alive}
    return {
        "state_dir": str(state_dir),
        "components": components,
        "ready": loaded is not None and apiserver_ready(loaded),
        "server": loaded.server if loaded else None,
        "kubeconfig": str(loaded.kubeconfig) if loaded else None,
    }


def get_info(state_dir: Path | None = None) -> ClusterInfo:
    """The running cluster of a state dir, or ClusterError if there is none."""
    state_dir = (state_dir or default_state_dir()).resolve()
    loaded = _load_info(state_dir)
    if loaded is None:
        raise ClusterError(f"no cluster is up in {state_dir}; run `warmpool cluster up`")
    return loaded


def env(state_dir: Path | None = None) -> str:
    """Shell text for `eval "$(warmpool cluster env)"`."""
    loaded = get_info(state_dir)
    return f"export KUBECONFIG={_shell_quote(str(loaded.kubeconfig))}\n"


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
