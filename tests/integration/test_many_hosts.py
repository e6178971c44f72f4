"""Two worker hosts, each in a network namespace of its own (issue #30, the CI tier).

The system runs with `SystemOptions.hosts`: worker process 0 on host 0, worker process 1 on
host 1, each reaching Redis and the API server only through its host's links (forwarding
proxies on the host's end of its veth, `warmpool.harness.hosts`), the scheduler on a third
host. Then:

1. one host is partitioned from Redis in the middle of a claim (its deciding write sent and
   held at the API proxy): its leases lapse, the other host serves the Session, and the held
   write, let go, is refused by the API server (409: the Service moved with the other host's
   write); no write of the cut-off host that reached the server after its lease lapsed was
   applied;
2. one host is partitioned from the API server in the middle of a scale-down (the retired
   instance's first write, the delete of its external Service, sent and held): its request
   times out (the job's request timeout is bounded by the lease TTL), the other host retires
   the instance, and the held delete, let go, is refused (404 or 409);
3. both links heal: the two hosts carry on as the same processes and the pool converges.

Where this machine cannot make network namespaces the test fails with `NetnsUnavailable`'s
message: it is never skipped.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_pool_concurrency import Watchdog
from tests.pool_world import held_instance, instance_count, session
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System, WorkerGroup
from warmpool.harness.hosts import Host
from warmpool.harness.netns import PREFIX, Network, check_available, ip
from warmpool.keys import SessionKey
from warmpool.kube.api import Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.queue.layout import Layout
from warmpool.queue.lease import holder_of
from warmpool.queue.settings import QueueSettings
from warmpool.testing.apiproxy import Hold, Write
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec

pytestmark = pytest.mark.redis


@pytest.fixture
def system(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[System]:
    check_available()  # raises with what is missing: this tier fails, never skips
    with System(cluster, namespaces=[namespace], proxy=True, hosts=3, threads=2,
                worker_groups=[WorkerGroup(1, host=0), WorkerGroup(1, host=1)],
                scheduler_hosts=[2], resync_period=20,
                queue=QueueSettings(lease_ttl=3.0, heartbeat_timeout=3.0,
                                    recovery_period=0.25, drain_timeout=5),
                log_dir=tmp_path) as s:
        yield s


def names() -> str:
    return ip("netns", "list").stdout + ip("-o", "link", "show").stdout


def test_a_dead_runs_hosts_are_removed_and_a_network_leaves_nothing_on_failure() -> None:
    check_available()
    dead = subprocess.Popen(["true"])  # a pid that has exited: a dead run's
    dead.wait()
    stale = f"{PREFIX}{dead.pid}-0"
    ip("netns", "add", stale)
    ip("link", "add", stale, "type", "veth", "peer", "name", f"{PREFIX}{dead.pid}-p")
    assert stale in names()
    with pytest.raises(RuntimeError, match="in the middle"), Network(2) as net:
        made = [h.name for h in net.hosts]
        assert stale not in names(), "the dead run's namespace and link outlived it"
        assert all(n in names() for n in made)
        raise RuntimeError("a run failing in the middle")
    assert not any(n in names() for n in made), "a failed run left its hosts behind"


def lease_pid(system: System, key: str) -> int | None:
    raw = system.client.get(Layout.of(system.settings).lease_prefix + key)
    if raw is None:
        return None
    return int(holder_of(raw.decode()).split(":")[1])


def held_on(holds: list[Hold], timeout: float = 60) -> int:
    """The index of the hold that caught a request first (the host that took the job); the
    others are released at once so they hold nothing later."""
    def first() -> int | None:
        return next((i + 1 for i, h in enumerate(holds) if h.requests), None)
    found = wait_for(first, timeout=timeout, interval=0.05,
                     message="a host's write to be held") - 1
    for i, h in enumerate(holds):
        if i != found:
            h.release()
    return found


def late(writes: list[Write], since: float) -> list[Write]:
    """Writes answered after `since`, but Events (they carry nothing, decide nothing)."""
    return [w for w in writes if w.at > since and "/events" not in w.path]


def test_hosts_see_only_their_links(system: System) -> None:
    host = system.hosts[0]
    port = int(system.redis.url.rsplit(":", 1)[1].split("/")[0])
    for p in (port, 6379):  # the system's Redis, and the machine's own on its usual port
        assert not host.reaches("127.0.0.1", p), f"a host reached 127.0.0.1:{p} of the " \
            "machine: its loopback is not its own"
    assert host.reaches(host.netns.gateway, host.redis.port)
    host.partition("redis")
    assert host.redis.stalled() == {"up", "down"}
    host.heal()
    assert system.leader() == 0, "the scheduler on host 2 does not lead"


def test_partitioned_hosts_late_writes_are_refused_and_the_other_host_finishes(
    system: System, kube: Kube, namespace: str,
) -> None:
    ns, dog, proxy = namespace, Watchdog(kube, namespace), system.proxy
    assert proxy is not None
    hosts: list[Host] = list(system.hosts.hosts[:2])
    pids = list(system.workers.pids)
    ad = create_appdef(kube, ns, min_instances=2)
    dog.converge()
    uid = ad["metadata"]["uid"]
    ext = {k: naming.create_name(ad["spec"]["name"], uid, k) for k in (1, 2)}

    # 1. A claim's deciding write is held; its host loses Redis.
    holds = [proxy.hold(h.name, method="PATCH", path=f"/services/{ext[1]}") for h in hosts]
    create_session(kube, ns, "s1", USERS[1])
    a = held_on(holds)
    skey = str(SessionKey(ns, "s1"))
    assert lease_pid(system, skey) == pids[a]
    hosts[a].partition("redis")
    wait_for(lambda: lease_pid(system, skey) not in (pids[a], None), timeout=60, interval=0.05,
             message="the cut-off host's Session lease to pass to the other host")
    lapsed = time.time()  # the cut-off host's leases are gone in Redis from here on

    def served() -> bool:
        dog.quiet()
        st = (session(kube, ns, "s1").get("status") or {}).get("operatorStatus")
        return st == v.STATUS_HANDLED and held_instance(kube, ns, "s1") == 1
    wait_for(served, timeout=90, interval=0.1, message="the other host to serve s1")
    holds[a].release()
    (answered,) = holds[a].wait_answered(1, timeout=30)
    assert answered.status == 409, f"the late claim write was answered {answered.status}"
    applied = [w for w in late(proxy.writes(hosts[a].name), lapsed) if not w.refused]
    assert not applied, f"host {a} wrote after its lease lapsed: {applied}"
    hosts[a].heal("redis")

    # 2. A scale-down's first write is held; its host loses the API server.
    holds = [proxy.hold(h.name, method="DELETE", path=f"/services/{ext[2]}") for h in hosts]
    patch_appdef_spec(kube, ns, "java", minInstances=1)
    c = held_on(holds)
    hosts[c].partition("api")
    cut = time.time()
    wait_for(lambda: dog.record() and instance_count(kube, ns, 2) == 0, timeout=120,
             interval=0.2, message="the other host to retire instance 2")
    holds[c].release()
    (answered,) = holds[c].wait_answered(1, timeout=30)
    assert answered.status in (404, 409), f"the late delete was answered {answered.status}"
    healed = time.time()
    hosts[c].heal("api")

    # 3. Healed: the same processes carry on, the pool converges.
    dog.converge(timeout=120)
    assert held_instance(kube, ns, "s1") == 1
    assert system.workers.pids == pids and not system.workers.dead(), "a host's worker restarted"
    # What host c had sent into the stalled link reached the server at the heal, each write
    # guarded by its precondition or fence (the held delete above is one of them).
    landed = [(w.method, w.path.rsplit("/", 2)[-2], w.status)
              for w in late(proxy.writes(hosts[c].name), cut) if w.at < healed + 30]
    print(f"\nclaim: host {a} cut from Redis, its late write answered 409; scale-down: "
          f"host {c} cut from the API server, its late delete answered {answered.status}; "
          f"host {c}'s writes answered after the cut: {landed}; links: "
          f"{[(h.name, h.redis.stats(), h.api.stats()) for h in hosts]}")


@pytest.fixture
def schedulers(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[System]:
    check_available()
    with System(cluster, namespaces=[namespace], proxy=True, hosts=2, workers=0,
                schedulers=2, scheduler_hosts=[0, 1], leader_lease=6.0,
                scheduler_identity="hosts", log_dir=tmp_path) as s:
        yield s


def test_a_leader_cut_from_the_api_server_steps_down_before_its_lease_is_taken(
    schedulers: System,
) -> None:
    """Lease 6 s, renew deadline 4 s: the stalled leader must say it no longer leads before
    the other scheduler says it does (their /status, over their hosts' own addresses, polled
    together); healed, it stays up as a standby (no restart)."""
    system = schedulers
    wait_for(lambda: system.leader() is not None, timeout=60, message="a leader")
    old = system.leader()
    assert old is not None
    other = 1 - old
    host = system.hosts[system.scheduler_host(old) or 0]
    host.partition("api")
    seen: list[tuple[bool, bool]] = []

    def taken_over() -> bool:
        leading = [s.status().get("leader") is True for s in system.schedulers]
        seen.append((leading[old], leading[other]))
        return leading[other]
    wait_for(taken_over, timeout=60, interval=0.05, message="the other scheduler to lead")
    host.heal("api")
    both = [i for i, (a, b) in enumerate(seen) if a and b]
    assert not both, f"both schedulers led at polls {both} of {len(seen)}"
    assert not seen[-1][0], "the stalled leader still led when the other took over"
    stepped = next(i for i, (a, _) in enumerate(seen) if not a)
    wait_for(lambda: system.schedulers[old].status().get("leader") is False, timeout=30,
             message="the healed scheduler to stand by")
    assert not system.dead(), f"a scheduler exited: {system.dead()}"
    print(f"\nleader {old} stalled: stopped leading at poll {stepped}, the other led at poll "
          f"{len(seen) - 1} (polls 50 ms apart)")


#: Run on a host: one Redis client and one API client (warmpool's own `connect`s), each
#: answering once, then, once the host is taken off the network (stdin's line), one more call
#: each; prints how long each took to fail, as JSON.
LOST_PATH_PROBE = """
import json, sys, threading, time
from warmpool.kube.api import Kube, connect as kube_connect
from warmpool.queue.redis_conn import connect as redis_connect
redis_url, kubeconfig = sys.argv[1], sys.argv[2]
r = redis_connect(redis_url)
k = Kube(kube_connect(kubeconfig))
r.ping(); k.date_header()
print("ready", flush=True)
sys.stdin.readline()
out = {}
def call(name, fn):
    start = time.monotonic()
    try:
        fn()
        out[name] = [time.monotonic() - start, "answered"]
    except Exception as exc:
        out[name] = [time.monotonic() - start, type(exc).__name__]
threads = [threading.Thread(target=call, args=("redis", r.ping)),
           threading.Thread(target=call, args=("api", k.date_header))]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out), flush=True)
"""


def test_a_host_taken_off_the_network_fails_its_calls_instead_of_hanging(
    system: System,
) -> None:
    """The host taken off the network (`Netns.isolate`: nothing it sends is answered or even
    acknowledged, no reset: a dead path, not a stalled proxy): a Redis command and an API
    request already on established connections fail instead of hanging -- the Redis one
    within its COMMAND_TIMEOUT (5 s), the API one within DEAD_PATH_SECONDS (TCP_USER_TIMEOUT,
    25 s) and the client's reconnects -- where the kernel alone would retransmit for ~15
    minutes. The calls' times are printed, not asserted (the machine may be loaded)."""
    host = system.hosts[1]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    probe = subprocess.Popen(
        host.netns.exec_args([sys.executable, "-c", LOST_PATH_PROBE, host.redis_url,
                              str(host.kubeconfig)]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert probe.stdin is not None and probe.stdout is not None
    try:
        assert probe.stdout.readline().strip() == "ready"
        host.netns.isolate()
        start = time.monotonic()
        probe.stdin.write("go\n")
        probe.stdin.flush()
        ready, _, _ = select.select([probe.stdout], [], [], 180)  # far past the bound
        assert ready, "the probe's calls still hang 180 s after the host left the network"
        result = json.loads(probe.stdout.readline())
        took = time.monotonic() - start
    finally:
        host.netns.rejoin()
        probe.kill()
        probe.wait()
    assert result["redis"][1] != "answered" and result["api"][1] != "answered", result
    print(f"\nhost off the network: {result} (s, error), all done after {took:.1f}s")
