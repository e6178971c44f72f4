"""The scheduler's endpoint: its own counters and state, the keys its producer added, and the
cluster-wide gauges, on a static fake API and fakeredis."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

import fakeredis
from prometheus_client.parser import text_string_to_metric_families

from metrics.collectors import AddCounter
from metrics.exposition import MetricsServer, scheduler_registry, serve
from scheduler.app import Scheduler, SchedulerConfig
from tests.waiting import wait_for
from warmpool.pool import vocabulary as v
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.settings import QueueSettings

NS = "ns1"


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "resourceVersion": "1", "uid": f"u-{name}", **extra}


class Kube:
    """Lists one AppDefinition; watches deliver what is pushed."""

    objects = {"AppDefinition": [{"metadata": meta("java", generation=1)}],
               "Session": [], "Service": [], "Deployment": [], "ConfigMap": [],
               "PoolSchedule": []}

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {k: [] for k in self.objects}
        self.lock = threading.Lock()

    def list_pages(self, api_version: str, kind: str, namespace: str | None,
                   **kw: Any) -> Any:
        yield [dict(o) for o in self.objects[kind]], "1"

    def watch(self, api_version: str, kind: str, namespace: str | None, **kw: Any) -> Any:
        time.sleep(0.02)  # stimulus: each fake watch lasts a moment, as a quiet server's
        with self.lock:
            pending, self.events[kind] = self.events[kind], []
        yield from pending


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_scheduler_endpoint() -> None:
    kube = Kube()
    client = fakeredis.FakeRedis()
    settings = QueueSettings(redis_url="redis://unused", prefix="sch:warmpool:",
                             namespace="sch:dramatiq")
    adds = AddCounter()
    producer = KeyedQueue(client, settings, observer=adds)
    app = Scheduler(lambda: kube, producer, SchedulerConfig(namespaces=[NS]))
    server = MetricsServer(scheduler_registry(app, client, settings, adds), "127.0.0.1", 0)
    server.start()
    started = time.time()
    app.start()
    try:
        assert app.wait_synced(10)
        wait_for(lambda: client.scard(settings.prefix + "dirty") == 1, timeout=10,
                 message="the startup resync's pool key")
        with kube.lock:
            kube.events["Session"].append({"type": "ADDED", "object": {
                "metadata": meta("s1"), "spec": {"appDefinition": "java"}}})
        wait_for(lambda: client.scard(settings.prefix + "dirty") == 3, timeout=10,
                 message="the Session's keys: its claim's and its timeout's")
        producer.add("pool/ns1/java")  # already waiting: deduplicated

        got = scrape(server.url)
        val = lambda name, **lb: got[(name, tuple(sorted(lb.items())))]  # noqa: E731
        assert val("warmpool_scheduler_leader") == 1  # no election: always leading
        assert val("warmpool_scheduler_synced") == 1
        assert val("warmpool_scheduler_resyncs_total", reason="startup") == 1
        assert val("warmpool_scheduler_resyncs_total", reason="periodic") == 0
        assert val("warmpool_scheduler_resyncs_total", reason="new_leader") == 0
        # A Unix time, of the startup resync: between the start and the scrape.
        assert started <= val("warmpool_scheduler_last_resync_timestamp_seconds") <= time.time()
        assert val("warmpool_scheduler_watch_events_total", kind=v.SESSION_KIND,
                   type="ADDED") == 1
        assert val("warmpool_scheduler_watch_events_total", kind="Deployment",
                   type="DELETED") == 0
        assert val("warmpool_scheduler_relists_total", kind="Session") == 0
        assert val("warmpool_workqueue_adds_total", kind="pool") == 1
        assert val("warmpool_workqueue_adds_total", kind="session") == 1
        assert val("warmpool_workqueue_deduplicated_total", kind="pool") == 1
        assert val("warmpool_workqueue_depth", kind="pool") == 1
        assert val("warmpool_workqueue_depth", kind="session") == 1
        assert val("warmpool_metrics_redis_up") == 1
        assert any(name == "process_cpu_seconds_total" for name, _ in got)
    finally:
        app.stop()
        server.stop()


def test_a_taken_default_port_is_a_warning_an_explicit_one_an_error() -> None:
    from prometheus_client import CollectorRegistry

    first = MetricsServer(CollectorRegistry(), "127.0.0.1", 0).start()
    try:
        port = first.address[1]
        assert serve(CollectorRegistry(), "127.0.0.1", port, required=False) is None
        try:
            serve(CollectorRegistry(), "127.0.0.1", port, required=True)
        except OSError:
            pass
        else:
            raise AssertionError("an explicit port that is taken must fail")
    finally:
        first.stop()
