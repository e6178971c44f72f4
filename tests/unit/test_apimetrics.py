"""`warmpool.cluster.apimetrics`: etcd's LISTs read from the API server's exposition text."""

from __future__ import annotations

from collections import Counter

from warmpool.cluster.apimetrics import etcd_counts, lists_between

EXPOSITION = """\
# HELP etcd_request_duration_seconds [ALPHA] Etcd request latency in seconds.
# TYPE etcd_request_duration_seconds histogram
etcd_request_duration_seconds_bucket{operation="list",type="*core.Pod",le="0.005"} 3
etcd_request_duration_seconds_bucket{operation="list",type="*core.Pod",le="+Inf"} 4
etcd_request_duration_seconds_sum{operation="list",type="*core.Pod"} 0.01
etcd_request_duration_seconds_count{operation="list",type="*core.Pod"} 4
etcd_request_duration_seconds_count{operation="get",type="*core.Pod"} 9
etcd_request_duration_seconds_count{operation="list",type="*core.Service"} 2
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="LIST",resource="pods"} 7
"""


def test_the_lists_etcd_answered_are_counted_by_type() -> None:
    assert etcd_counts(EXPOSITION) == Counter({"*core.Pod": 4, "*core.Service": 2})
    assert etcd_counts(EXPOSITION, "get") == Counter({"*core.Pod": 9})


def test_two_readings_give_the_lists_between_them() -> None:
    before = Counter({"*core.Pod": 4, "*core.Service": 2})
    after = Counter({"*core.Pod": 4, "*core.Service": 5, "*apps.ReplicaSet": 1})
    assert lists_between(before, after) == Counter({"*core.Service": 3,
                                                    "*apps.ReplicaSet": 1})
