"""Burst (issue #17, session-lifecycle §6 "Ours") on the real control plane: with no free
instance a claim makes one above minInstances, up to maxInstances; a Session waits only at
maxInstances, and a burst instance is retired on release like any instance above the target.
"""

from __future__ import annotations

from tests.pool_world import assert_invariants, held_instance, instance_objects, session
from tests.waiting import wait_for
from warmpool.controller.sequential import run_until_quiet
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.testing.world import USERS, create_appdef, create_session, delete_session

SETTINGS = PoolSettings(url_probe=False)  # burst is on by default


def test_six_sessions_on_min_2_max_5_five_served_the_sixth_waits_at_max(kube, namespace):
    ns = namespace
    create_appdef(kube, ns, min_instances=2, max_instances=5)
    run_until_quiet(kube, ns, SETTINGS)
    for i in range(1, 7):
        create_session(kube, ns, f"s{i}", USERS[i])
    run_until_quiet(kube, ns, SETTINGS)
    held = {f"s{i}": held_instance(kube, ns, f"s{i}") for i in range(1, 7)}
    # Oldest first: s1, s2 warm (the prewarmed 1, 2), s3-s5 cold (made for them), s6 waits.
    assert held == {"s1": 1, "s2": 2, "s3": 3, "s4": 4, "s5": 5, "s6": None}
    for name in ("s1", "s2", "s3", "s4", "s5"):
        assert session(kube, ns, name)["status"]["operatorStatus"] == v.STATUS_HANDLED
    status = session(kube, ns, "s6")["status"]
    assert status["operatorStatus"] == v.STATUS_HANDLING
    assert "maxInstances" in status["operatorMessage"] and "5" in status["operatorMessage"]
    for k in (3, 4, 5):
        assert len(instance_objects(kube, ns, "java", k)) == 5
    assert_invariants(kube, ns)

    # A warm one released: its instance is clean again and serves the sixth.
    delete_session(kube, ns, "s1")
    run_until_quiet(kube, ns, SETTINGS)
    assert held_instance(kube, ns, "s6") == 1
    assert session(kube, ns, "s6")["status"]["operatorStatus"] == v.STATUS_HANDLED

    # A burst one released: retired, as any free instance above the target is.
    delete_session(kube, ns, "s4")
    run_until_quiet(kube, ns, SETTINGS)
    wait_for(lambda: not instance_objects(kube, ns, "java", 4), timeout=30,
             message="burst instance 4 retired")
    assert_invariants(kube, ns)


def test_strict_min_instances_without_burst(kube, namespace) -> None:
    ns = namespace
    strict = PoolSettings(url_probe=False, burst=False)
    create_appdef(kube, ns, min_instances=1, max_instances=5)
    run_until_quiet(kube, ns, strict)
    for i in (1, 2):
        create_session(kube, ns, f"s{i}", USERS[i])
    run_until_quiet(kube, ns, strict)
    assert (held_instance(kube, ns, "s1"), held_instance(kube, ns, "s2")) == (1, None)
    assert "prewarmed" in session(kube, ns, "s2")["status"]["operatorMessage"]
    assert not instance_objects(kube, ns, "java", 2)
    assert_invariants(kube, ns)
