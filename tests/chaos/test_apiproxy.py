"""The fault-injecting API proxy itself, against the real kube-apiserver.

Each fault mode is observed from a client's side: the official Python client (through
`warmpool.kube.api.Kube`) where its behaviour matters, plain `http.client` where the exact
answer (status, header, a dropped connection) is the point, since the official client retries
some failures by itself.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.kube import api
from warmpool.kube.api import Conflict, Kube, KubeError, connect
from warmpool.testing.apiproxy import ApiProxy, Faults, etcd_list_kind, list_goes_to_etcd

pytestmark = pytest.mark.chaos


@pytest.fixture
def proxy(cluster: ClusterInfo) -> Iterator[ApiProxy]:
    with ApiProxy(upstream=cluster.server, token=cluster.token, seed=11) as p:
        yield p


@pytest.fixture
def via(proxy: ApiProxy) -> Kube:
    """A Kube that reaches the API server through the proxy."""
    return Kube(connect(str(proxy.kubeconfig_path)))


def cm(ns: str, name: str, value: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
            "data": {"v": value}}


def raw(proxy: ApiProxy, method: str, path: str, body: dict | None = None,
        content_type: str = "application/json") -> tuple[int, dict[str, str], bytes]:
    """One request, no retries; the proxy adds the bearer token."""
    conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_list_and_watch_stream_through_the_proxy(
    proxy: ApiProxy, via: Kube, kube: Kube, namespace: str
) -> None:
    items, rv = via.list("v1", "ConfigMap", namespace)
    assert isinstance(items, list) and rv
    watched_before = proxy.watch_bytes()
    events: list[tuple[str, str]] = []

    def watch() -> None:
        for ev in via.watch("v1", "ConfigMap", namespace, resource_version=rv,
                            timeout_seconds=20):
            if ev["type"] == "BOOKMARK":
                continue
            events.append((ev["type"], ev["object"]["metadata"]["name"]))
            if len(events) == 3:
                return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    wait_for(proxy.open_watches, timeout=10, interval=0.05, message="the watch through the proxy")
    for i in range(3):  # one at a time: each event must arrive on its own, unbuffered
        kube.create(cm(namespace, f"w{i}"))
        # Before the next write: an event the proxy buffered would wait for later bytes.
        wait_for(lambda i=i: len(events) > i, timeout=10, interval=0.01,
                 message=f"event {i} through the proxy, before any later write")
    t.join(5)
    assert events == [("ADDED", f"w{i}") for i in range(3)]
    stats = proxy.stats()
    assert stats["watches"] >= 1 and stats["requests"] >= 2
    # The events' bytes are counted by the resource watched, and only there.
    watched = proxy.watch_bytes() - watched_before
    assert set(watched) == {"configmaps"}
    assert watched["configmaps"] >= 3 * len('{"type":"ADDED","object":{}}')


def test_lists_the_server_sends_to_etcd_are_counted_by_client_and_resource(
    proxy: ApiProxy, via: Kube, namespace: str
) -> None:
    """The proxy names the LISTs that reach etcd (no resourceVersion), not those the watch
    cache answers ("0"): the API server's counters cannot say whose they were."""
    before = proxy.etcd_lists()
    via.list("v1", "ConfigMap", namespace)
    via.list("v1", "ConfigMap", namespace, resource_version="0")
    via.list("v1", "Service", namespace, resource_version="0")
    for _ in via.list_pages("v1", "Service", namespace, page_size=100):
        pass
    via.create(cm(namespace, "one"))
    one, _ = via.list("v1", "ConfigMap", namespace, field_selector="metadata.name=one")
    assert [x["metadata"]["name"] for x in one] == ["one"]
    counted = {"configmaps consistent": 1, "services pages": 1, "configmaps one object": 1}
    assert proxy.etcd_lists() - before == counted
    assert proxy.etcd_lists("main") - before == counted
    assert not proxy.etcd_lists("someone-else")


@pytest.mark.parametrize(("query", "etcd"), [
    ("", True),
    ("?resourceVersion=0", False),
    ("?resourceVersion=0&limit=500", False),  # the cache answers it whole, limit ignored
    ("?resourceVersion=12&limit=500", True),  # a page at an exact version: etcd's
    ("?resourceVersion=12", False),  # not older than 12: the cache, once it has caught up
    ("?limit=500&continue=abc", True),
    ("?labelSelector=app%3Dx&limit=500", True),  # how every reflector's list starts
    ("?resourceVersion=12&resourceVersionMatch=Exact", True),
])
def test_which_lists_go_to_etcd(query: str, etcd: bool) -> None:
    assert list_goes_to_etcd(f"/api/v1/namespaces/ns/pods{query}") is etcd
    if etcd:
        paged = "limit" in query or "continue" in query
        assert etcd_list_kind(f"/api/v1/pods{query}") == ("pages" if paged else "consistent")
    assert etcd_list_kind("/api/v1/pods?fieldSelector=metadata.name%3Dp&labelSelector=a%3Db"
                          ) == "one object"
    assert etcd_list_kind("/api/v1/pods?fieldSelector=metadata.name%3Dp%2Cstatus.phase%3DX"
                          ) == "consistent"


def test_large_list_and_writes_pass_unchanged(via: Kube, kube: Kube, namespace: str) -> None:
    big = "x" * 200_000  # more than one read from the upstream socket
    via.create(cm(namespace, "big", big))
    assert kube.get("v1", "ConfigMap", namespace, "big")["data"]["v"] == big
    via.merge_patch("v1", "ConfigMap", namespace, "big", {"data": {"v": "small"}})
    assert via.get("v1", "ConfigMap", namespace, "big")["data"]["v"] == "small"
    assert via.delete("v1", "ConfigMap", namespace, "big") is True
    assert via.get("v1", "ConfigMap", namespace, "big") is None


def test_deletes_made_through_the_proxy_are_known(proxy: ApiProxy, via: Kube, kube: Kube,
                                                  namespace: str) -> None:
    """Who deleted an object: the client behind the proxy, or someone else (the GC)."""
    first = via.create(cm(namespace, "mine", "1"))["metadata"]["uid"]
    kube.create(cm(namespace, "theirs", "1"))
    assert via.delete("v1", "ConfigMap", namespace, "mine", uid=first) is True
    assert kube.delete("v1", "ConfigMap", namespace, "theirs") is True
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    assert proxy.deleted(f"{base}/mine", first) and proxy.deleted(f"{base}/mine?x=")
    assert not proxy.deleted(f"{base}/theirs")
    # The next object of the same name, deleted by someone else, is not the first one.
    second = kube.create(cm(namespace, "mine", "2"))["metadata"]["uid"]
    assert kube.delete("v1", "ConfigMap", namespace, "mine", uid=second) is True
    assert not proxy.deleted(f"{base}/mine", second)


def test_added_latency(cluster: ClusterInfo, namespace: str) -> None:
    """Each request waits latency + uniform(0, jitter) before it is forwarded; none once the
    faults are reset. The proxy's sleep is recorded, not slept: exact, whatever the load."""
    slept: list[float] = []
    with ApiProxy(upstream=cluster.server, token=cluster.token, seed=11,
                  sleep=slept.append) as proxy:
        via = Kube(connect(str(proxy.kubeconfig_path)))
        via.list("v1", "ConfigMap", namespace)  # warm: discovery and a connection
        assert slept == []
        proxy.set(latency=0.15, jitter=0.05)
        via.list("v1", "ConfigMap", namespace)
        assert len(slept) == 1 and 0.15 <= slept[0] <= 0.20, slept
        proxy.reset()
        via.list("v1", "ConfigMap", namespace)
        assert len(slept) == 1, slept
        assert proxy.stats()["delayed"] == 1


def test_409_refuses_writes_only_and_applies_nothing(
    proxy: ApiProxy, via: Kube, kube: Kube, namespace: str
) -> None:
    kube.create(cm(namespace, "c1", "before"))
    proxy.set(p_409=1.0)
    assert via.get("v1", "ConfigMap", namespace, "c1")["data"]["v"] == "before"  # reads pass
    with pytest.raises(Conflict):
        via.merge_patch("v1", "ConfigMap", namespace, "c1", {"data": {"v": "after"}})
    assert kube.get("v1", "ConfigMap", namespace, "c1")["data"]["v"] == "before"
    assert proxy.stats()["409"] == 1


def test_500_and_429_with_retry_after(proxy: ApiProxy, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    proxy.set(p_500=1.0, scope="all")
    status, _, body = raw(proxy, "GET", path)
    assert status == 500 and json.loads(body)["kind"] == "Status"
    proxy.set(p_500=0.0, p_429=1.0, retry_after=7, scope="mutating")
    assert raw(proxy, "GET", path)[0] == 200  # scope: writes only
    status, headers, body = raw(proxy, "POST", path, cm(namespace, "c2"))
    assert status == 429 and headers["retry-after"] == "7"
    assert json.loads(body)["reason"] == "TooManyRequests"
    stats = proxy.stats()
    assert stats["500"] == 1 and stats["429"] == 1


def test_official_client_reports_injected_errors(proxy: ApiProxy, via: Kube,
                                                 namespace: str) -> None:
    via.list("v1", "ConfigMap", namespace)  # discovery done while the proxy is transparent
    proxy.set(p_500=1.0, scope="all")
    with pytest.raises(KubeError) as err:
        via.list("v1", "ConfigMap", namespace)
    assert err.value.status == 500


def test_dropped_connection(proxy: ApiProxy, namespace: str) -> None:
    proxy.set(p_drop=1.0, scope="all")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        raw(proxy, "GET", f"/api/v1/namespaces/{namespace}/configmaps")
    assert proxy.stats()["dropped"] == 1


def test_lost_response_the_write_still_happens(
    proxy: ApiProxy, kube: Kube, namespace: str
) -> None:
    proxy.set(p_lost_response=1.0)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        raw(proxy, "POST", f"/api/v1/namespaces/{namespace}/configmaps",
            cm(namespace, "lost", "written"))
    assert kube.get("v1", "ConfigMap", namespace, "lost")["data"]["v"] == "written"
    assert proxy.stats()["lost_response"] == 1


def _watch_until_error(via: Kube, namespace: str, rv: str, box: list[Any],
                       timeout_seconds: int = 30) -> None:
    try:
        for _ in via.watch("v1", "ConfigMap", namespace, resource_version=rv,
                           timeout_seconds=timeout_seconds):
            pass
        box.append("ended")
    except Exception as exc:  # what the reflector sees when its stream is cut
        box.append(exc)


def test_watch_cut_mid_stream(proxy: ApiProxy, via: Kube, namespace: str) -> None:
    _, rv = via.list("v1", "ConfigMap", namespace)
    box: list[Any] = []
    t = threading.Thread(target=_watch_until_error, args=(via, namespace, rv, box), daemon=True)
    t.start()
    wait_for(proxy.open_watches, timeout=10, interval=0.05, message="the watch through the proxy")
    assert proxy.cut_watches() == 1
    t.join(5)
    assert not t.is_alive(), "a cut watch must end its reader (its server timeout is 30 s)"
    assert box and box[0] != "ended", "a cut watch must end with an error, not cleanly"


def test_a_silent_watch_ends_on_the_client_read_timeout(
        proxy: ApiProxy, via: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch whose connection goes silent (no FIN, no more bytes) must end with an error
    soon after its server-side timeout, not block its reader forever."""
    monkeypatch.setattr(api, "WATCH_READ_MARGIN", 1)
    _, rv = via.list("v1", "ConfigMap", namespace)
    box: list[Any] = []
    t = threading.Thread(target=_watch_until_error, args=(via, namespace, rv, box, 2),
                         daemon=True)
    t.start()
    wait_for(proxy.open_watches, timeout=10, interval=0.05, message="the watch through the proxy")
    assert proxy.stall_watches() == 1
    via.create(cm(namespace, "after-the-stall"))  # an event the stalled stream must not relay
    t.join(30)
    assert not t.is_alive(), "a silent watch blocked its reader past the read timeout"
    assert box and box[0] != "ended", "a silent watch must end with an error, not cleanly"


def recording_timers(proxy: ApiProxy) -> list[float]:
    """The delays of the timers the proxy starts (they still fire, on real time)."""
    delays: list[float] = []

    def timer(seconds: float, fn: Callable[[], None]) -> threading.Timer:
        delays.append(seconds)
        return threading.Timer(seconds, fn)

    proxy.timer = timer
    return delays


def test_watch_dropped_after_a_random_time(proxy: ApiProxy, via: Kube, namespace: str) -> None:
    delays = recording_timers(proxy)
    _, rv = via.list("v1", "ConfigMap", namespace)
    proxy.set(p_drop_watch=1.0, drop_watch_after=0.5)
    box: list[Any] = []
    _watch_until_error(via, namespace, rv, box)  # its server-side timeout: 30 s
    assert box[0] != "ended", "the watch ended by its timeout, not cut by the proxy"
    assert proxy.stats()["watch_cut"] == 1
    assert len(delays) == 1 and 0 <= delays[0] <= 0.5  # cut after uniform(0, 0.5) s


def test_outage_refuses_connections_then_recovers(proxy: ApiProxy, via: Kube,
                                                  namespace: str) -> None:
    delays = recording_timers(proxy)
    proxy.outage(1.0, mode="refuse")
    assert delays == [1.0]  # the outage ends after the second asked for
    assert proxy.in_outage == "refuse"
    with pytest.raises(ConnectionRefusedError), socket.create_connection(
            (proxy.host, proxy.port), timeout=2):
        pass
    wait_for(lambda: proxy.in_outage is None, timeout=10, message="the outage's end")
    assert isinstance(via.list("v1", "ConfigMap", namespace)[0], list)


def test_outage_503_cuts_watches_and_answers_503(proxy: ApiProxy, via: Kube,
                                                 namespace: str) -> None:
    _, rv = via.list("v1", "ConfigMap", namespace)
    box: list[Any] = []
    t = threading.Thread(target=_watch_until_error, args=(via, namespace, rv, box), daemon=True)
    t.start()
    wait_for(proxy.open_watches, timeout=10, interval=0.05, message="the watch through the proxy")
    proxy.outage(None, mode="503")
    t.join(5)
    assert box and box[0] != "ended"
    status, headers, _ = raw(proxy, "GET", f"/api/v1/namespaces/{namespace}/configmaps")
    assert status == 503 and "retry-after" in headers
    proxy.end_outage()
    assert raw(proxy, "GET", f"/api/v1/namespaces/{namespace}/configmaps")[0] == 200


def test_seeded_faults_repeat(cluster: ClusterInfo, namespace: str) -> None:
    def outcomes(seed: int) -> list[int]:
        with ApiProxy(upstream=cluster.server, token=cluster.token, seed=seed) as p:
            p.set(p_500=0.5, scope="all")
            return [raw(p, "GET", f"/api/v1/namespaces/{namespace}/configmaps")[0]
                    for _ in range(16)]

    first = outcomes(5)
    assert first == outcomes(5)
    assert set(first) == {200, 500}
    assert outcomes(6) != first


def test_settings_are_validated_and_restored(proxy: ApiProxy) -> None:
    with pytest.raises(ValueError):
        proxy.set(p_500=1.5)
    with pytest.raises(ValueError):
        proxy.set(scope="reads")
    with proxy.faulty(latency=0.5, p_409=0.2):
        assert proxy.faults().active() == {"latency": 0.5, "p_409": 0.2}
    assert proxy.faults() == Faults()


def test_clock_offset_moves_the_clusters_clock_as_its_clients_read_it(
    proxy: ApiProxy, via: Kube, kube: Kube,
) -> None:
    """`clock_offset` shifts the Date of every response (what `ApiServerClock` reads) and
    nothing else: the server's own timestamps are left as they are."""
    from warmpool.kube.clock import ApiServerClock

    direct = ApiServerClock(kube).sync()
    proxy.set(clock_offset=1800)
    shifted = ApiServerClock(via).sync()
    assert 1800 - 5 <= shifted - direct <= 1800 + 5  # whole seconds, one request apart
    proxy.set(clock_offset=-7200)
    assert -7200 - 5 <= ApiServerClock(via).sync() - direct <= -7200 + 5
    proxy.reset()
    assert abs(ApiServerClock(via).sync() - direct) <= 5


class ManualClock:
    """The proxy's clock, moved by the test: a delayed chunk is released when it says so.
    It counts its readings, so the test knows when the delay line has looked at it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def looked_at(self) -> None:
        """Return once the clock has been read twice from now: the reader's decision on the
        first reading is then made (it reads again only after deciding)."""
        since = self.reads
        wait_for(lambda: self.reads >= since + 2, timeout=10, interval=0.01,
                 message="the delay line reading the clock")


def _watch_names(kube: Kube, namespace: str, rv: str, box: list[str], n: int) -> None:
    for ev in kube.watch("v1", "ConfigMap", namespace, resource_version=rv, timeout_seconds=60):
        if ev["type"] != "BOOKMARK":
            box.append(ev["object"]["metadata"]["name"])
        if len(box) == n:
            return


def test_watch_delay_holds_one_clients_events_in_order(cluster: ClusterInfo, kube: Kube,
                                                       namespace: str) -> None:
    """A lagging client's watch events are held until the (manual) clock reaches their due
    time, then relayed in order; the other client's watch of the same events is not held."""
    clock = ManualClock()
    with ApiProxy(upstream=cluster.server, token=cluster.token, seed=3, clock=clock) as proxy:
        lagging = Kube(connect(str(proxy.add_client("lagging"))))
        prompt = Kube(connect(str(proxy.kubeconfig_path)))
        _, rv = kube.list("v1", "ConfigMap", namespace)
        proxy.set(watch_delay=5.0, watch_delay_client="lagging")
        late: list[str] = []
        early: list[str] = []
        threads = [threading.Thread(target=_watch_names, args=(k, namespace, rv, box, 3),
                                    daemon=True) for k, box in ((lagging, late), (prompt, early))]
        for t in threads:
            t.start()
        wait_for(lambda: proxy.open_watches() == 2, timeout=10, interval=0.02)
        for i in range(2):
            kube.create(cm(namespace, f"d{i}"))
        wait_for(lambda: len(early) == 2, timeout=10, interval=0.02,  # the other client: not held
                 message=lambda: f"the prompt client's first two events: {early}")
        wait_for(lambda: proxy.held_watch_events("lagging") == 2, timeout=10, interval=0.02)
        clock.now += 2.0
        proxy.set(watch_delay=0.0)  # lowered: what is held keeps its time, what follows
        kube.create(cm(namespace, "d2"))  # waits behind it
        wait_for(lambda: len(early) == 3, timeout=10, interval=0.02,
                 message=lambda: f"the prompt client's three events: {early}")
        wait_for(lambda: proxy.held_watch_events("lagging") == 3, timeout=10, interval=0.02)
        clock.looked_at()
        assert late == [] and proxy.held_watch_events("lagging") == 3, (
            "a held event was relayed before its time")
        clock.now += 2.9  # 4.9 s after the first two were read
        clock.looked_at()
        assert late == [] and proxy.held_watch_events("lagging") == 3
        clock.now += 0.2
        wait_for(lambda: len(late) == 3, timeout=10, interval=0.02,
                 message=lambda: f"the lagging client's three events: {late}")
        for t in threads:
            t.join(5)
        assert late == early == ["d0", "d1", "d2"]
        assert proxy.stats()["watch_delay"] == 1
        assert proxy.traffic("lagging").requests["WATCH"] == 1
        assert proxy.traffic("lagging").bytes["WATCH"] > 0


def test_traffic_by_verb_and_client(proxy: ApiProxy, via: Kube, namespace: str) -> None:
    """Requests and body bytes by verb (a collection GET is a LIST), per client."""
    via.list("v1", "ConfigMap", namespace)  # discovery, out of the window
    before = proxy.traffic()
    via.create(cm(namespace, "t1", "x" * 1000))
    got = via.get("v1", "ConfigMap", namespace, "t1")
    items, _ = via.list("v1", "ConfigMap", namespace)  # with t1's 1,000 bytes of data
    via.merge_patch("v1", "ConfigMap", namespace, "t1", {"data": {"v": "y"}})
    via.delete("v1", "ConfigMap", namespace, "t1")
    delta = proxy.traffic() - before
    assert {k: n for k, n in delta.requests.items() if n} == {
        "POST": 1, "GET": 1, "PATCH": 1, "LIST": 1, "DELETE": 1}
    assert delta.bytes["GET"] >= len(json.dumps(got)) * 0.8
    assert delta.bytes["LIST"] > 1000 and delta.total_requests() == 5
    assert proxy.traffic("main") == proxy.traffic()
    assert proxy.traffic("someone-else").total_requests(watches=True) == 0
    assert items


def test_hold_keeps_one_clients_write_from_the_server_until_released(
    proxy: ApiProxy, via: Kube, kube: Kube, namespace: str
) -> None:
    """A held write has been sent but not forwarded: the server does not see it until the
    hold is released, and a resourceVersion that went stale meanwhile is then refused."""
    created = kube.create(cm(namespace, "held"))
    rv = created["metadata"]["resourceVersion"]
    hold = proxy.hold(method="PATCH", path="/configmaps/held")
    outcome: list[object] = []

    def late_write() -> None:
        try:
            outcome.append(via.merge_patch("v1", "ConfigMap", namespace, "held",
                                           {"data": {"v": "late"}}, resource_version=rv))
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=late_write, daemon=True)
    t.start()
    (held,) = hold.wait_held(1)
    assert held.method == "PATCH" and held.json()["data"] == {"v": "late"}
    assert kube.get("v1", "ConfigMap", namespace, "held")["data"] == {"v": "1"}
    kube.merge_patch("v1", "ConfigMap", namespace, "held", {"data": {"v": "meanwhile"}})
    hold.release()
    (answered,) = hold.wait_answered(1)
    t.join(30)
    assert answered.status == 409
    assert isinstance(outcome[0], Conflict)
    assert kube.get("v1", "ConfigMap", namespace, "held")["data"] == {"v": "meanwhile"}
    # only the next `count` matching requests are held
    via.merge_patch("v1", "ConfigMap", namespace, "held", {"data": {"v": "after"}})
    assert proxy.stats()["held"] == 1
