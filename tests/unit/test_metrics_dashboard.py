"""The Grafana dashboard and the alert rules only use series the endpoints export, and the
dashboard is ready for provisioning (data source as a variable). The rules are checked by
promtool in tests/integration/test_metrics_promtool.py; every query is evaluated by a real
Prometheus in test_metrics_prometheus.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fakeredis
import yaml
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import metrics.worker  # noqa: F401  (registers the worker series in this process)
from metrics.collectors import AddCounter, ClusterCollector, SchedulerCollector, WorkerPoolCollector
from metrics.poolstate import PoolState
from scheduler.app import SchedulerStats
from warmpool.queue.settings import QueueSettings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "metrics" / "grafana" / "warmpool-dashboard.json"
ALERTS = ROOT / "metrics" / "alerts.yml"


def exported() -> set[str]:
    """Every sample name any warmpool endpoint can expose."""
    settings = QueueSettings(redis_url="redis://unused")
    client = fakeredis.FakeRedis()
    PoolState(client, settings).record_instance("instance/ns/java/1", "java", "free", 1)
    PoolState(client, settings).waiting("session/ns/s", "java")
    app = SimpleNamespace(stats=SchedulerStats(), reflectors=[], is_leader=lambda: True,
                          synced=lambda: True, event_counts=dict, resync_counts=dict)
    pool = SimpleNamespace(procs=[], restarts=0)
    registry = CollectorRegistry()
    registry.register(ClusterCollector(client, settings))
    registry.register(SchedulerCollector(app, AddCounter()))  # type: ignore[arg-type]
    registry.register(WorkerPoolCollector(pool))  # type: ignore[arg-type]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    names = set()
    for reg in (registry, REGISTRY):
        for family in reg.collect():  # families with no sample yet (appdefinition) count
            names |= {family.name + suffix for suffix in suffixes[family.type]}
    return {n for n in names if n.startswith("warmpool_")}


def referenced(expr: str) -> set[str]:
    return set(re.findall(r"\bwarmpool_[a-z_]+\b", expr))


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_uses_only_exported_series() -> None:
    known = exported()
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    missing = {name for e in exprs for name in referenced(e)} - known
    assert not missing, f"the dashboard queries series nobody exports: {sorted(missing)}"


def test_the_dashboard_is_ready_for_provisioning() -> None:
    board = dashboard()
    assert board["uid"] == "warmpool" and board["title"]
    (ds,) = [v for v in board["templating"]["list"] if v["name"] == "DS_PROMETHEUS"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    # No panel overlaps another.
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))


def test_the_alerts_use_only_exported_series_and_say_what_to_do() -> None:
    known = exported()
    every = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    rules = [r for r in every if "alert" in r]
    records = {r["record"] for r in every if "record" in r}
    assert {r["alert"] for r in rules} >= {
        "WarmpoolNoLeader", "WarmpoolStuckWork", "WarmpoolQueueGrowing", "WarmpoolDeadLetters",
        "WarmpoolSessionsWaiting", "WarmpoolLeaseExpiries", "WarmpoolWarmClaimsSlow"}
    assert records == {"warmpool:claim_objective_seconds", "warmpool:claim_duration_seconds:p99"}
    for rule in every:
        missing = referenced(rule["expr"]) - known
        assert not missing, (rule.get("alert") or rule["record"], missing)
    for rule in rules:
        missing = referenced(rule["expr"]) - known
        assert not missing, (rule["alert"], missing)
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_no_series_is_labelled_with_an_identity() -> None:
    """Label names are limited to the kind, the result, the AppDefinition (and the watched
    object's event type, the resync reason, the pool state, a claim's start and a wait's limit):
    no id, name or e-mail."""
    allowed = {"kind", "result", "appdefinition", "type", "reason", "state", "le", "start",
               "limit"}
    settings = QueueSettings(redis_url="redis://unused")
    registry = CollectorRegistry()
    registry.register(ClusterCollector(fakeredis.FakeRedis(), settings))
    for reg in (registry, REGISTRY):
        for family in text_string_to_metric_families(generate_latest(reg).decode()):
            if not family.name.startswith("warmpool_"):
                continue
            for s in family.samples:
                assert set(s.labels) <= allowed, (s.name, s.labels)
