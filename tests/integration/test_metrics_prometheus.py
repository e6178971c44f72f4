"""A real Prometheus scrapes a real scheduler process and a worker host (two worker
processes behind one endpoint) every second while they run the pool on the real control plane
and a real Redis; PromQL over Prometheus' HTTP API must answer what the cluster shows.

Needs Debian's `prometheus` package (`prometheus` and `promtool` on PATH): without it the test
fails and says so (.ci/run installs it). Run with `-s` to see the PromQL answers.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metrics.exposition import MetricsServer, host_registry
from scheduler.process import SchedulerProcess
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo, free_port
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.decide import COLD_START_NOTE
from warmpool.queue import QueueSettings
from warmpool.testing.world import USERS, create_appdef, create_session, delete_session
from workers.process import WorkerPool

pytestmark = [pytest.mark.prometheus, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "metrics" / "grafana" / "warmpool-dashboard.json"
ALERTS = ROOT / "metrics" / "alerts.yml"


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"`{tool}` is not on PATH: the `prometheus` test tier needs Debian's "
                    "`prometheus` package (as root: apt-get update && apt-get install -y "
                    "prometheus; .ci/run installs it when missing)", pytrace=False)
    return path


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


class Prometheus:
    """A Prometheus server on loopback with its own config and storage in `workdir`."""

    def __init__(self, workdir: Path, targets: dict[str, list[str]],
                 rule_files: list[Path]) -> None:
        self.binary = require("prometheus")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "900ms"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": t}]}
                               for job, t in targets.items()],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "prometheus.log"

    def start(self) -> Prometheus:
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            return get(self.url + "/-/ready")[0] == 200

        wait_for(ready, timeout=60, interval=0.1, message="Prometheus to be ready")
        return self

    def api(self, path: str, **params: str) -> Any:
        status, body = get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise AssertionError(f"{path} {params}: {status} {body}")
        return data["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=promql)["result"]
        return result

    def value(self, promql: str) -> float | None:
        """The value of a query that yields one sample; None when it yields none."""
        result = self.query(promql)
        if not result:
            return None
        assert len(result) == 1, f"{promql}: {result}"
        return float(result[0]["value"][1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# --- what the cluster shows --------------------------------------------------------------------


def sessions(kube: Kube, ns: str) -> list[dict[str, Any]]:
    items, _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
    return [s for s in items if not s["metadata"].get("deletionTimestamp")]


def cold_told(session: dict[str, Any]) -> bool:
    """Whether a Session's status told its user that its claim was a cold start."""
    return COLD_START_NOTE in str((session.get("status") or {}).get("operatorMessage", ""))


def holding(kube: Kube, ns: str) -> int:
    """Live Sessions holding an instance (annotated with its id and HANDLED)."""
    return sum(1 for s in sessions(kube, ns)
               if (s["metadata"].get("annotations") or {}).get(v.ANNOTATION_INSTANCE_ID)
               and (s.get("status") or {}).get("operatorStatus") == v.STATUS_HANDLED)


def waiting(kube: Kube, ns: str) -> int:
    """Live Sessions waiting for an instance (HANDLING, no instance)."""
    return sum(1 for s in sessions(kube, ns)
               if not (s["metadata"].get("annotations") or {}).get(v.ANNOTATION_INSTANCE_ID)
               and (s.get("status") or {}).get("operatorStatus") == v.STATUS_HANDLING)


# --- the stack ---------------------------------------------------------------------------------


class Stack:
    def __init__(self, cluster: ClusterInfo, ns: str, settings: QueueSettings,
                 tmp_path: Path) -> None:
        assert settings.redis_url
        self.ns = ns
        self.tmp_path = tmp_path
        self.pool = WorkerPool(settings, processes=2, threads=4,
                               env={"KUBECONFIG": str(cluster.kubeconfig)},
                               metrics_dir=tmp_path / "multiproc")
        self.host = MetricsServer(host_registry(self.pool.metrics_dir or "", self.pool),
                                  "127.0.0.1", 0)
        self.scheduler_port = free_port()
        self.scheduler = SchedulerProcess(
            ["--namespace", ns, "--lease-namespace", ns, "--log-level", "INFO",
             "--metrics-host", "127.0.0.1", "--metrics-port", str(self.scheduler_port)],
            env={"KUBECONFIG": str(cluster.kubeconfig), "WARMPOOL_REDIS_URL": settings.redis_url,
                 "WARMPOOL_QUEUE_PREFIX": settings.prefix,
                 "WARMPOOL_QUEUE_NAMESPACE": settings.namespace,
                 "WARMPOOL_QUEUE_QUEUE_NAME": settings.queue_name, "PYTHONPATH": str(ROOT)},
            log_path=tmp_path / "scheduler.log", cwd=ROOT)
        self.prometheus: Prometheus | None = None

    @property
    def scheduler_metrics(self) -> str:
        return f"http://127.0.0.1:{self.scheduler_port}/metrics"

    def start(self) -> Stack:
        self.host.start()
        self.pool.start()
        self.scheduler.start()
        self.prometheus = Prometheus(
            self.tmp_path, {"warmpool-scheduler": [f"127.0.0.1:{self.scheduler_port}"],
                            "warmpool-worker": [f"127.0.0.1:{self.host.address[1]}"]},
            [ALERTS]).start()
        return self

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        self.scheduler.stop(timeout=20)
        self.pool.stop(timeout=40)
        self.host.stop()


@pytest.fixture
def stack(request: pytest.FixtureRequest, cluster: ClusterInfo, namespace: str,
          tmp_path: Path) -> Iterator[Stack]:
    require("prometheus")
    require("promtool")
    settings: QueueSettings = request.getfixturevalue("queue_settings")
    st = Stack(cluster, namespace, settings, tmp_path)
    try:
        yield st.start()
    finally:
        st.stop()


def promtool_check_metrics(url: str) -> None:
    status, text = get(url)
    assert status == 200, text
    proc = subprocess.run([require("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"promtool check metrics on {url}:\n{proc.stdout}{proc.stderr}")


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [var["definition"].replace("label_values(", "group by (appdefinition) (")
              .replace(", appdefinition)", ")")
              for var in board["templating"]["list"] if var["type"] == "query"]
    return exprs


def grafana_to_promql(expr: str) -> str:
    return (expr.replace("$__rate_interval", "1m").replace("$appdefinition", ".*"))


def test_promql_answers_what_the_cluster_shows(stack: Stack, kube: Kube) -> None:
    ns = stack.ns
    prom = stack.prometheus
    assert prom is not None
    answers: dict[str, float | None] = {}

    def ask(promql: str) -> float | None:
        answers[promql] = value = prom.value(promql)
        return value

    def agree(promql: str, truth: int) -> bool:
        return ask(promql) == truth

    phases: list[str] = []

    def phase(title: str, *queries: str) -> None:
        lines = [f"{title} (cluster: {holding(kube, ns)} holding, {waiting(kube, ns)} waiting)"]
        for q in queries:
            result = prom.query(q)
            shown = ", ".join(
                (",".join(f"{k}={x}" for k, x in r["metric"].items()) + ": " if r["metric"]
                 else "") + r["value"][1] for r in result) or "(none)"
            lines.append(f"    {q} = {shown}")
        phases.append("\n".join(lines))

    wait_for(lambda: ask('count(up{job=~"warmpool-.*"} == 1)') == 2, timeout=30,
             message="Prometheus to scrape the scheduler and the worker host")
    wait_for(lambda: ask("sum(warmpool_scheduler_leader)") == 1, timeout=30,
             message="one leading scheduler")
    # Both targets say which build they run (one version: no rollout in progress).
    assert ask('count(warmpool_build_info{job=~"warmpool-.*"} == 1)') == 2
    assert ask("count(count by (version) (warmpool_build_info))") == 1

    # Two prewarmed, room for one more (a burst, a cold start): the fourth Session waits.
    create_appdef(kube, ns, min_instances=2, max_instances=3)
    wait_for(lambda: agree('sum(max by (appdefinition) (warmpool_pool_instances{state="free"}))',
                           2), timeout=90, message="two free instances in PromQL")

    for i in (1, 2, 3, 4):  # two warm, one cold (made for it), one waiting at maxInstances
        create_session(kube, ns, f"s{i}", USERS[i])
    claimed_q = 'sum(max by (appdefinition) (warmpool_pool_instances{state="claimed"}))'
    waiting_q = "sum(max by (appdefinition) (warmpool_sessions_waiting))"

    def claims_agree(claimed: int, waits: int) -> bool:
        return (holding(kube, ns) == claimed and waiting(kube, ns) == waits
                and agree(claimed_q, claimed) and agree(waiting_q, waits))

    wait_for(lambda: claims_agree(3, 1), timeout=90, interval=0.5,
             message=lambda: f"3 claimed and 1 waiting, cluster and PromQL alike: {answers}")
    assert ask('sum(max by (appdefinition) (warmpool_pool_instances{state="free"}))') == 0
    phase("four Sessions, two prewarmed instances, maxInstances 3", claimed_q, waiting_q,
          'max by (appdefinition, state) (warmpool_pool_instances)',
          "max(warmpool_sessions_waiting_oldest_seconds)")

    holder = next(s["metadata"]["name"] for s in sessions(kube, ns)
                  if (s["metadata"].get("annotations") or {}).get(v.ANNOTATION_INSTANCE_ID)
                  == "1")
    told_before = {s["metadata"]["name"]: cold_told(s) for s in sessions(kube, ns)}
    delete_session(kube, ns, holder)  # its prewarmed instance goes to the waiting Session
    wait_for(lambda: claims_agree(3, 0), timeout=90, interval=0.5,
             message=lambda: f"the waiting Session served: {answers}")
    wait_for(lambda: (ask("sum(warmpool_releases_total)") or 0) >= 1, timeout=30,
             message="the release counted")
    phase("a holder deleted: the waiting Session served", claimed_q, waiting_q,
          "sum(warmpool_releases_total)")
    assert check(kube, ns) == []

    # Work was done, nothing was dead-lettered, every claim's latency was observed.
    assert (ask("sum(warmpool_workqueue_work_duration_seconds_count)") or 0) > 0
    assert (ask('sum(warmpool_reconcile_total{result="success"})') or 0) > 0
    assert ask("sum(max by (kind) (warmpool_workqueue_dead_letters))") == 0
    assert ask("sum(warmpool_workqueue_dead_lettered_total)") == 0
    # Warm and cold claims counted apart, each once, as each Session's status told its user.
    # The burst's claim is cold (its instance was made for it). The claim after the release
    # took the released instance, whose pod is being reset: warm only if the kubelet had
    # replaced it by then, which this test does not control (CI, stop 43, counted 2 warm
    # where this test expected 3).
    def told_cold() -> int:
        told = dict(told_before)  # the deleted holder's, read while it lived
        told.update((s["metadata"]["name"], cold_told(s)) for s in sessions(kube, ns))
        return sum(told.values())

    warm_q = 'sum(warmpool_claim_duration_seconds_count{start="warm"})'
    cold_q = 'sum(warmpool_claim_duration_seconds_count{start="cold"})'
    wait_for(lambda: (ask(warm_q) or 0) + (ask(cold_q) or 0) == 4
             and ask(cold_q) == told_cold() >= 1, timeout=30,
             message=lambda: f"4 claims, the cold ones as the Sessions say "
                             f"({told_cold()}): {answers}")
    assert (ask('sum(warmpool_workqueue_adds_total{job="warmpool-scheduler"})') or 0) > 0
    assert (ask('sum(warmpool_scheduler_watch_events_total{kind="Session"})') or 0) >= 3
    assert ask('sum(warmpool_scheduler_resyncs_total{reason="new_leader"})') == 1
    assert ask("max(warmpool_workqueue_workers)") == 2

    # SIGKILL a worker process and restart it: once idle, nothing runs and nothing is negative.
    stack.pool.kill(0)
    stack.pool.restart(0)
    wait_for(lambda: ask("sum(warmpool_worker_restarts_total)") == 1
             and ask("sum(warmpool_worker_processes)") == 2, timeout=30,
             message="the restart seen by Prometheus")
    wait_for(lambda: ask("sum(warmpool_workqueue_in_flight)") == 0
             and ask("sum(warmpool_workqueue_unfinished_work_seconds)") == 0
             and ask("max(warmpool_workqueue_longest_running_processor_seconds)") == 0,
             timeout=60, message="idle gauges at 0 after the kill and restart")
    assert prom.query('{__name__=~"warmpool_.+"} < 0') == [], "negative values"
    assert claims_agree(3, 0)
    phase("a worker SIGKILLed and restarted, idle", "sum(warmpool_worker_restarts_total)",
          "sum(warmpool_workqueue_in_flight)", "sum(warmpool_workqueue_unfinished_work_seconds)",
          'count({__name__=~"warmpool_.+"} < 0)')
    phase("work done", "sum by (kind) (warmpool_reconcile_total)",
          'sum(warmpool_reconcile_total{result="success"})',
          "histogram_quantile(0.95, sum by (le) "
          "(rate(warmpool_claim_duration_seconds_bucket[5m])))",
          "histogram_quantile(0.95, sum by (le) "
          "(rate(warmpool_workqueue_queue_duration_seconds_bucket[5m])))",
          "sum(max by (kind) (warmpool_workqueue_depth))")

    # Every endpoint's exposition passes promtool's lint.
    promtool_check_metrics(stack.scheduler_metrics)
    promtool_check_metrics(stack.host.url)

    # The dashboard's queries and the alert rules evaluate on this server.
    for expr in dashboard_queries():
        prom.query(grafana_to_promql(expr))
    rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert len(rules) >= 6
    assert all(r["health"] in ("ok", "unknown") for r in rules), rules
    wait_for(lambda: all(r["health"] == "ok" for g in prom.api("rules")["groups"]
                         for r in g["rules"]), timeout=30, message="every rule evaluated")
    firing = {a["labels"]["alertname"] for a in prom.api("alerts")["alerts"]}
    assert not firing & {"WarmpoolNoLeader", "WarmpoolDeadLetters", "WarmpoolNoWorkers",
                         "WarmpoolRedisUnreachable"}, firing

    print("\nPromQL answers, last seen:")
    for q, a in answers.items():
        if not re.match(r"count\(up", q):
            print(f"  {q} = {a}")
    print("\n".join(["PromQL by phase:", *phases]))
