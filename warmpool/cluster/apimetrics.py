"""What the API server says it did: its own request counters, read from its /metrics.

The benchmarks and tests count requests the controller sends; only the API server knows which
of them it answered from its watch cache and which it sent on to etcd. kube-apiserver 1.20
counts every etcd request in `etcd_request_duration_seconds` by `operation` (get, list,
create, update, delete, ...) and `type` (the stored Go type: ``*core.Pod``, ``*core.Service``,
``*apps.ReplicaSet``, a CRD's ``*unstructured.Unstructured``), so the difference of two
readings is how many LISTs etcd answered in between, per kind.
"""

from __future__ import annotations

import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from warmpool.cluster.local import ClusterInfo, insecure_ctx

ETCD_REQUESTS = "etcd_request_duration_seconds"


def etcd_counts(text: str, operation: str = "list") -> Counter[str]:
    """`type` -> how many etcd requests of `operation` the exposition `text` counts."""
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != ETCD_REQUESTS:
            continue
        for sample in family.samples:
            if (sample.name == f"{ETCD_REQUESTS}_count"
                    and sample.labels.get("operation") == operation):
                out[sample.labels.get("type", "")] += int(sample.value)
    return out


def read_as_admin(info: ClusterInfo, path: str, timeout: float = 10.0) -> bytes:
    """The body of a GET of `path` on the API server, as the cluster's admin (loopback,
    self-signed cert): its /metrics, or its pprof profile (`bench.pprof`)."""
    req = urllib.request.Request(f"{info.server}{path}")
    req.add_header("Authorization", f"Bearer {info.token}")
    with urllib.request.urlopen(req, timeout=timeout, context=insecure_ctx()) as resp:
        return bytes(resp.read())


def read_metrics(info: ClusterInfo, timeout: float = 10.0) -> str:
    """The API server's /metrics, as the cluster's admin."""
    return read_as_admin(info, "/metrics", timeout).decode()


def etcd_lists(info: ClusterInfo) -> Counter[str]:
    """`type` -> LISTs etcd has answered for the API server since it started."""
    return etcd_counts(read_metrics(info))


def lists_between(before: Counter[str], after: Counter[str]) -> Counter[str]:
    """The etcd LISTs per type between two readings (types with none left out)."""
    return Counter({t: n for t in after if (n := after[t] - before.get(t, 0)) > 0})
