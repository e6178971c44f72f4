"""The alert rules and the example configuration under promtool: they load, and the alerts
fire (and stay quiet) on the series they are about (`promtool test rules`).

Needs Debian's `prometheus` package (promtool); fails, not skips, without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "metrics" / "alerts.yml"
CONFIG = ROOT / "metrics" / "prometheus.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("`promtool` is not on PATH: the `prometheus` test tier needs Debian's "
                    "`prometheus` package (as root: apt-get update && apt-get install -y "
                    "prometheus; .ci/run installs it when missing)", pytrace=False)
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)


def test_alert_rules_pass_promtool_check() -> None:
    proc = promtool("check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_example_prometheus_config_passes_promtool_check() -> None:
    proc = promtool("check", "config", str(CONFIG))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def alert(name: str, at: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    exp = [] if labels is None else [{"exp_labels": labels}]
    return {"eval_time": at, "alertname": name, "exp_alerts": exp}


SCHED = 'job="warmpool-scheduler", instance="s1:9090"'
WORKER = 'job="warmpool-worker", instance="w1:9091"'

CASES: list[dict[str, Any]] = [
    {   # the leader goes away at minute 2; no alert before the rule's 1 m `for`
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_scheduler_leader{{{SCHED}}}', "values": "1 1 0 0 0 0"},
            {"series": 'warmpool_scheduler_leader{job="warmpool-scheduler", '
                       'instance="s2:9090"}', "values": "0 0 0 0 0 0"},
        ],
        "alert_rule_test": [
            alert("WarmpoolNoLeader", "1m"),
            alert("WarmpoolNoLeader", "2m"),
            alert("WarmpoolNoLeader", "4m", {"severity": "critical"}),
        ],
    },
    {   # every scheduler gone: nothing to sum, absent() fires
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_scheduler_leader{{{SCHED}}}', "values": "1 1 _ _ _ _"},
        ],
        "alert_rule_test": [
            alert("WarmpoolNoLeader", "1m"),
            alert("WarmpoolNoLeader", "10m", {"severity": "critical"}),
        ],
    },
    {   # a dead letter shows up at minute 3
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_workqueue_dead_letters{{{SCHED}, kind="instance"}}',
             "values": "0 0 0 1 1 1 1"},
            {"series": f'warmpool_workqueue_dead_letters{{{SCHED}, kind="session"}}',
             "values": "0 0 0 0 0 0 0"},
        ],
        "alert_rule_test": [
            alert("WarmpoolDeadLetters", "2m"),
            alert("WarmpoolDeadLetters", "5m", {"severity": "warning", "kind": "instance"}),
        ],
    },
    {   # a Session waits 12 minutes; another AppDefinition's only 1
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_sessions_waiting_oldest_seconds{{{SCHED}, '
                       'appdefinition="java"}', "values": "0+60x15"},
            {"series": f'warmpool_sessions_waiting_oldest_seconds{{{SCHED}, '
                       'appdefinition="python"}', "values": "60x15"},
        ],
        "alert_rule_test": [
            alert("WarmpoolSessionsWaiting", "9m"),
            alert("WarmpoolSessionsWaiting", "13m",
                  {"severity": "warning", "appdefinition": "java"}),
        ],
    },
    {   # a thread stuck on one job on one host: unfinished work grows 60 s a minute
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_workqueue_unfinished_work_seconds{{{WORKER}, '
                       'kind="instance"}', "values": "0+60x20"},
        ],
        "alert_rule_test": [
            alert("WarmpoolStuckWork", "6m"),
            alert("WarmpoolStuckWork", "12m", {"severity": "warning", "kind": "instance",
                                               "job": "warmpool-worker",
                                               "instance": "w1:9091"}),
        ],
    },
    {   # leases expire every 30 s for 20 minutes (a crash-looping worker)
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_lease_expired_total{{{WORKER}, kind="instance"}}',
             "values": "0+2x30"},
            {"series": f'warmpool_lease_lost_total{{{WORKER}, kind="instance"}}',
             "values": "0x30"},
        ],
        "alert_rule_test": [
            alert("WarmpoolLeaseExpiries", "5m"),
            alert("WarmpoolLeaseExpiries", "20m", {"severity": "warning", "kind": "instance"}),
        ],
    },
    {   # the instance queue grows by 10 keys a minute for 20 minutes
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_workqueue_depth{{{SCHED}, kind="instance"}}',
             "values": "0+10x30"},
            {"series": f'warmpool_workqueue_depth{{{SCHED}, kind="session"}}',
             "values": "0x30"},
        ],
        "alert_rule_test": [
            alert("WarmpoolQueueGrowing", "8m"),
            alert("WarmpoolQueueGrowing", "25m", {"severity": "warning", "kind": "instance"}),
        ],
    },
    {   # warm claims take 0.75 s from minute 5 (above the 0.5 s objective), cold ones
        # always 2 s; back under at minute 30: the alert fires, then resolves
        "interval": "1m",
        "input_series": [
            *({"series": f'warmpool_claim_duration_seconds_bucket{{{WORKER}, '
                         f'appdefinition="java", start="warm", le="{le}"}}',
               "values": values} for le, values in (
                ("0.25", "0+10x5 50+0x25 50+10x30"), ("0.5", "0+10x5 50+0x25 50+10x30"),
                ("1", "0+10x60"), ("2", "0+10x60"), ("+Inf", "0+10x60"))),
            *({"series": f'warmpool_claim_duration_seconds_bucket{{{WORKER}, '
                         f'appdefinition="java", start="cold", le="{le}"}}',
               "values": values} for le, values in (
                ("1", "0x60"), ("2", "0+5x60"), ("+Inf", "0+5x60"))),
        ],
        "alert_rule_test": [
            alert("WarmpoolWarmClaimsSlow", "4m"),
            alert("WarmpoolWarmClaimsSlow", "20m", {"severity": "warning",
                                                    "appdefinition": "java", "start": "warm"}),
            alert("WarmpoolWarmClaimsSlow", "50m"),
        ],
    },
    {   # a quiet, healthy pool: nothing fires
        "interval": "1m",
        "input_series": [
            {"series": f'warmpool_scheduler_leader{{{SCHED}}}', "values": "1x20"},
            {"series": f'warmpool_workqueue_depth{{{SCHED}, kind="instance"}}', "values": "0x20"},
            {"series": f'warmpool_workqueue_dead_letters{{{SCHED}, kind="instance"}}',
             "values": "0x20"},
            {"series": f'warmpool_workqueue_workers{{{SCHED}}}', "values": "4x20"},
            {"series": f'warmpool_metrics_redis_up{{{SCHED}}}', "values": "1x20"},
            {"series": f'warmpool_reconcile_total{{{WORKER}, kind="instance", '
                       'result="success"}', "values": "0+100x20"},
            {"series": f'warmpool_reconcile_total{{{WORKER}, kind="instance", '
                       'result="error"}', "values": "0+1x20"},
        ],
        "alert_rule_test": [alert(name, "20m") for name in (
            "WarmpoolNoLeader", "WarmpoolDeadLetters", "WarmpoolQueueGrowing",
            "WarmpoolNoWorkers", "WarmpoolRedisUnreachable", "WarmpoolReconcileErrors")],
    },
]


def test_alerts_fire_on_what_they_are_about(tmp_path: Path) -> None:
    # promtool compares annotations too; they are prose with templates, so test a copy of the
    # rules without them (expressions, `for` and labels are what decide firing).
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    stripped = tmp_path / "alerts.yml"
    stripped.write_text(yaml.safe_dump(rules))
    spec = tmp_path / "alerts_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(stripped)],
                                    "evaluation_interval": "1m", "tests": CASES}))
    proc = promtool("test", "rules", str(spec))
    assert proc.returncode == 0, proc.stdout + proc.stderr
