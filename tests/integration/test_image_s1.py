"""The real system run from the built image (issue #19, item 1): the scheduler and two worker
containers of `localhost/warmpool:<version>` (deploy/image/build.sh builds it) under rootful
podman, against the local control plane and a real Redis, pass pool-spec scenario S1 end to
end, and the invariant checker finds nothing.

Each container is run as its Deployment in deploy/base would run it, as far as podman can say
so: the manifests' args and environment (fieldRef, the Secret's Redis URL, the ConfigMap), the
image's ENTRYPOINT as PID 1, UID/GID 10001, a read-only root filesystem with only the
manifests' emptyDirs writable (fresh host directories, as the kubelet makes them; podman's own
tmpfs on /tmp, /run and /var/tmp is switched off, as Kubernetes has none), all capabilities
dropped, no privilege escalation, the ServiceAccount's kubeconfig mounted read-only, and a
hostname of its own (a pod's name). The differences from a pod: `--network host` (the control
plane and Redis listen on this host's loopback), so the health and metrics servers bind
127.0.0.1 on free ports; no CPU or memory limits; the probes are run by `podman exec`, as the
kubelet would run the exec ones.

Marked `image`: `make test` leaves it out; `make image-test` (deploy/image/run-s1.sh) builds
the image and runs it. It fails, and says how to build it, when the image is missing.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes import client as k8s

from tests.integration.test_deploy_cluster import (
    DEPLOY,
    FORBIDDEN,
    LOG_TIMESTAMP,
    apply_rbac,
    dump,
    kubectl,
    pool_spec_s1,
    render,
    sa_kubeconfig,
)
from tests.pool_world import held_instance
from tests.unit.test_deploy_manifests import parse_cli
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo, free_port
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.queue import Layout, QueueSettings
from warmpool.queue.inspect import Inspector

pytestmark = [pytest.mark.image, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = os.environ.get("WARMPOOL_IMAGE") or f"localhost/warmpool:{VERSION}"
RUNTIME = os.environ.get("WARMPOOL_OCI_RUNTIME") or "runc"
KUBECONFIG_IN_CONTAINER = "/etc/warmpool/kubeconfig"
LABEL = "warmpool.image-test"  # every container this module starts carries it


def podman(*args: str, check_rc: bool = True, timeout: float = 120
           ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["podman", "--runtime", RUNTIME, *args], capture_output=True,
                         text=True, timeout=timeout)
    if check_rc:
        assert out.returncode == 0, f"podman {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None or shutil.which(RUNTIME) is None:
        pytest.fail(f"podman and {RUNTIME} are needed (Debian: apt-get install podman runc "
                    "mmdebstrap), then deploy/image/build.sh")
    if os.geteuid() != 0:
        pytest.fail("the containers run under rootful podman: run as root")
    if podman("image", "exists", IMAGE, check_rc=False).returncode != 0:
        pytest.fail(f"no image {IMAGE}: build it with deploy/image/build.sh (`make image`)")
    return IMAGE


class Container:
    """One container of the rendered manifests, run from the image by podman."""

    def __init__(self, objs: list[dict[str, Any]], deployment: str, *, name: str, image: str,
                 kubeconfig: Path, core_v1: k8s.CoreV1Api, namespace: str,
                 extra_env: dict[str, str], tmp_path: Path) -> None:
        d = next(o for o in objs if o["kind"] == "Deployment"
                 and o["metadata"]["name"] == deployment)
        pod = d["spec"]["template"]["spec"]
        (self.container,) = pod["containers"]
        self.name, self.image, self.namespace = name, image, namespace
        self.grace = int(pod.get("terminationGracePeriodSeconds", 30))
        self.fs_group = int(pod["securityContext"]["fsGroup"])
        self.tmp_path = tmp_path
        env: dict[str, str] = {}
        for ref in self.container.get("envFrom") or []:
            cm = core_v1.read_namespaced_config_map(ref["configMapRef"]["name"], namespace)
            env.update(cm.data or {})
        for e in self.container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif "fieldRef" in e["valueFrom"]:
                assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
                env[e["name"]] = namespace
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                secret = core_v1.read_namespaced_secret(ref["name"], namespace)
                env[e["name"]] = base64.b64decode(
                    secret.data[ref["key"]]).decode()  # type: ignore[index]
        # In a pod, the client library finds the in-cluster config; here the ServiceAccount's
        # kubeconfig stands in for it.
        env.update(KUBECONFIG=KUBECONFIG_IN_CONTAINER, **extra_env)
        assert all("\n" not in val for val in env.values())
        self.env = env
        # An env file, not `-e`: the Redis URL (a secret) stays off the command line.
        self.env_file = tmp_path / f"{name}.env"
        self.env_file.write_text("".join(f"{k}={val}\n" for k, val in env.items()))
        self.env_file.chmod(0o600)
        self.kubeconfig = kubeconfig
        self.args = self._local_args(self.container["args"])
        self.started = False

    @staticmethod
    def _local_args(args: list[str]) -> list[str]:
        """The manifests' args, the servers on loopback: the network is the host's here."""
        out = []
        for a in args:
            if a.startswith("--health-host="):
                a = "--health-host=127.0.0.1"
            elif a.startswith("--health-port="):
                a = "--health-port=0"
            out.append(a)
        _, params = parse_cli(out)
        if "metrics_port" in params:
            out += ["--metrics-host=127.0.0.1", f"--metrics-port={free_port()}"]
        return out

    def run_argv(self) -> list[str]:
        sc = self.container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        user = f"{sc['runAsUser']}:{sc['runAsGroup']}"
        nofile = subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True,
                                text=True).stdout.strip()
        argv = ["run", "--detach", "--name", self.name, "--hostname", self.name,
                "--label", f"{LABEL}={self.namespace}",
                "--read-only", "--read-only-tmpfs=false", "--user", user,
                "--network", "host", "--cap-drop=all", "--security-opt=no-new-privileges",
                "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=32768:32768",
                "--stop-timeout", str(self.grace), "--env-file", str(self.env_file),
                "--volume", f"{self.kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro"]
        # The manifests' emptyDirs (all of them are): what the kubelet makes for one, a fresh
        # directory on the node, mode 0777, group fsGroup with setgid. (Not `--tmpfs`: podman
        # gives a tmpfs the mode of the image's directory under it, root-owned, so a 0755 one
        # owned by 10001 in the image becomes unwritable for 10001.)
        for mount in self.container.get("volumeMounts") or []:
            path = mount["mountPath"]
            host = self.tmp_path / f"{self.name}{path.replace('/', '-')}"
            host.mkdir()
            os.chown(host, 0, self.fs_group)
            host.chmod(0o2777)
            argv += ["--volume", f"{host}:{path}:rw"]
        return [*argv, self.image, *self.args]

    def start(self) -> Container:
        podman(*self.run_argv())
        self.started = True
        return self

    def running(self) -> bool:
        out = podman("inspect", "--format", "{{.State.Running}}", self.name, check_rc=False)
        return out.stdout.strip() == "true"

    def log(self) -> str:
        out = podman("logs", self.name, check_rc=False)
        return out.stdout + out.stderr

    def wait_log(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        def seen() -> re.Match[str] | None:
            found = re.search(pattern, self.log())
            assert found or self.running(), f"{self.name} exited:\n{self.log()}"
            return found
        found = wait_for(seen, timeout=timeout, interval=0.5, message=f"{self.name}: {pattern}")
        assert found is not None
        return found

    def exec(self, *argv: str, env: dict[str, str] | None = None) -> int:
        flags = [f"--env={k}={val}" for k, val in (env or {}).items()]
        return podman("exec", *flags, self.name, *argv, check_rc=False,
                      timeout=60).returncode

    def stop(self) -> int:
        """SIGTERM to PID 1 (the image's ENTRYPOINT), SIGKILL after the grace period, as the
        kubelet does; the exit code."""
        podman("stop", "--time", str(self.grace), self.name, timeout=self.grace + 60)
        out = podman("inspect", "--format", "{{.State.ExitCode}}", self.name)
        return int(out.stdout.strip())

    def remove(self) -> None:
        if self.started:
            podman("rm", "--force", "--time", "5", self.name, check_rc=False, timeout=90)


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for c in reversed(started):
        if c.started and c.running():
            print(f"--- {c.name} (still running at teardown) ---\n{c.log()[-6000:]}")
        c.remove()


def test_s1_from_the_image_scheduler_and_two_workers_as_containers(
    image: str, cluster: ClusterInfo, namespace: str, tmp_path: Path, kube: Kube,
    core_v1: k8s.CoreV1Api, request: pytest.FixtureRequest, containers: list[Container],
) -> None:
    ns = namespace
    settings: QueueSettings = request.getfixturevalue("queue_settings")
    client: redis.Redis = request.getfixturevalue("redis_client")
    objs = render(DEPLOY / "base", ns, tmp_path)
    apply_rbac(cluster, ns, tmp_path)
    config = next(o for o in objs if o["kind"] == "ConfigMap")
    kubectl(cluster, "apply", "-f", "-", stdin=dump([config]))
    assert settings.redis_url
    kubectl(cluster, "-n", ns, "create", "secret", "generic", "warmpool-redis",
            f"--from-literal=url={settings.redis_url}")
    # One ServiceAccount per role (issue #27, point 7): each container gets the token of the
    # one its Deployment names.
    kubeconfigs = {}
    for d in (o for o in objs if o["kind"] == "Deployment"):
        sa = d["spec"]["template"]["spec"]["serviceAccountName"]
        kubeconfigs[d["metadata"]["name"]] = sa_kubeconfig(
            cluster, core_v1, ns, tmp_path / f"{sa}.kubeconfig", sa)
        os.chown(kubeconfigs[d["metadata"]["name"]], 10001, 10001)  # the containers' user (0600)

    isolation = {"WARMPOOL_QUEUE_PREFIX": settings.prefix,
                 "WARMPOOL_QUEUE_NAMESPACE": settings.namespace}
    tag = uuid.uuid4().hex[:6]

    def container(deployment: str, name: str) -> Container:
        return Container(objs, deployment, name=f"wp-{tag}-{name}", image=image,
                         kubeconfig=kubeconfigs[deployment], core_v1=core_v1, namespace=ns,
                         extra_env=isolation, tmp_path=tmp_path)
    workers = [container("warmpool-worker", f"worker-{i}") for i in ("a", "b")]
    scheduler = container("warmpool-scheduler", "scheduler")
    for worker in workers:
        containers.append(worker.start())
    for worker in workers:
        worker.wait_log(r"worker processes x \d+ threads")
    containers.append(scheduler.start())
    health = scheduler.wait_log(r"health=(http://\S+)").group(1)
    wait_for(lambda: http_status(f"{health}/readyz") == 200, timeout=90, interval=0.5,
             message="the scheduler's /readyz")
    assert http_status(f"{health}/healthz") == 200
    for c in (scheduler, *workers):
        found = re.search(r"metrics=(http://\S+)", c.log())
        assert found, f"{c.name} logged no metrics URL:\n{c.log()}"
        assert http_status(found.group(1)) == 200, c.name

    # Both worker containers are on the queue, each a host of its own (its hostname).
    inspector = Inspector(client, settings)
    wait_for(lambda: {w.name for w in workers} <= {
        (info.process or "").split(":")[0] for info in inspector.workers() if info.alive},
        timeout=60, interval=0.5, message="both worker containers' heartbeats")
    # The workers' HTTP probes, as the kubelet asks them: live and ready (not ready without
    # Redis: tests/unit/test_worker_health.py).
    for worker in workers:
        base = worker.wait_log(r"health=(http://\S+)").group(1)
        for name in ("livenessProbe", "readinessProbe"):
            path = worker.container[name]["httpGet"]["path"]
            assert http_status(f"{base}{path}") == 200, (worker.name, name)
    # The root filesystem is read-only for the containers' processes.
    assert scheduler.exec("python3", "-c", "open('/opt/venv/x', 'w')") != 0

    # S1 (pool-spec §6), with the shared HTTPRoute the AppDefinition names.
    pool_spec_s1(kube, ns, client, settings, timeout=150)  # containers start slower
    # Nothing orphaned: every pool object of the namespace belongs to instance 1 or 2.
    assert check(kube, ns) == []
    for name in ("s1", "s2"):
        assert held_instance(kube, ns, name) in (1, 2)

    lease = kube.get("coordination.k8s.io/v1", "Lease", ns, "warmpool-scheduler")
    assert lease is not None and lease["spec"]["holderIdentity"].startswith(scheduler.name)

    # The ENTRYPOINT as PID 1 reaps what it starts: no zombie in any container.
    zombies = ("import os, sys; sys.exit(any(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1]"
               ".split()[0] == 'Z' for p in os.listdir('/proc') if p.isdigit()))")
    for c in (scheduler, *workers):
        assert c.exec("python3", "-c", zombies) == 0, f"{c.name} has zombie processes"

    # SIGTERM to each PID 1: the scheduler releases its Lease, the workers drain; exit 0.
    assert scheduler.stop() == 0, scheduler.log()
    for worker in workers:
        assert worker.stop() == 0, worker.log()
    for c in (scheduler, *workers):
        refused = [line for line in c.log().splitlines()
                   if FORBIDDEN.search(LOG_TIMESTAMP.sub("", line))]
        assert refused == [], f"{c.name} was refused (the Role lacks a verb)"
        tracebacks = [line for line in c.log().splitlines() if "Traceback" in line]
        assert tracebacks == [], f"{c.name}:\n{c.log()[-6000:]}"
    raw_errors: dict[bytes, bytes] = client.hgetall(Layout.of(settings).errors)  # type: ignore[assignment]
    errors = {k.decode(): val.decode(errors="replace") for k, val in raw_errors.items()}
    assert not [k for k, text in errors.items() if FORBIDDEN.search(text)], errors
