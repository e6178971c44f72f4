"""Instances warmpool builds carry what Java's template gives a prewarmed instance (issue #31):
the IDE's THEIACLOUD_* environment, the AppDefinition's pullSecret and the monitor port on the
external Service. Run against the real API server, which must accept these objects as built,
and through a claim, which must not touch the pod template (a rollout would restart the IDE
under its user).

The controller runs in-process and sequentially (``run_until_quiet``), as in the pool scenarios.
"""

from __future__ import annotations

from typing import Any

from tests.pool_world import held_instance, instance_objects
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube.api import Kube
from warmpool.pool.builders import PoolSettings
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec

SETTINGS = PoolSettings(routes="none", url_probe=False, service_url="https://svc.example/",
                        service_auth_token="token-for-test", keycloak_realm="theia")


def _parts(kube: Kube, ns: str, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Instance k's Deployment and external Service, as the API server has them."""
    objs = instance_objects(kube, ns, "java", k)
    deployment = next(o for name, o in objs.items() if name.startswith("Deployment/"))
    external = next(o for name, o in objs.items() if name.startswith("Service/")
                    and not name.endswith("-int"))
    return deployment, external


def _ide(deployment: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] != "oauth2-proxy")


def test_instances_carry_env_pull_secret_and_monitor_port_and_a_claim_keeps_the_template(
    kube: Kube, namespace: str,
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2, shared_route=False, pullSecret="regcred",
                  monitor={"port": 3001, "activityTracker": {"timeoutAfter": 30}})
    run_until_quiet(kube, ns, SETTINGS)
    for k in (1, 2):
        deployment, external = _parts(kube, ns, k)
        pod = deployment["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        env = {e["name"]: e.get("value", "") for e in _ide(deployment)["env"]}
        assert env["THEIACLOUD_SERVICE_URL"] == "https://svc.example/"
        assert env["THEIACLOUD_SERVICE_AUTH_TOKEN"] == env["THEIACLOUD_APP_ID"] == "token-for-test"
        assert env["THEIACLOUD_MONITOR_PORT"] == "3001"
        assert env["THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER"] == "true"
        assert env["THEIACLOUD_KEYCLOAK_REALM"] == "theia"
        assert env["THEIACLOUD_SESSION_URL"].endswith(f"-{k}/")
        assert env["THEIACLOUD_SESSION_USER"] == ""
        monitor = [p for p in external["spec"]["ports"] if p["name"] == "monitor-express"]
        assert [(p["port"], p["targetPort"]) for p in monitor] == [(3001, 3001)]

    before = {k: _parts(kube, ns, k)[0] for k in (1, 2)}
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns, SETTINGS)
    k = held_instance(kube, ns, "s1")
    assert k in before
    after, _ = _parts(kube, ns, k)
    # The claim wrote nothing to the pod template (a change there is a rollout: a new pod
    # under the user). Its metadata moves (owner reference, fence), so compare the spec.
    assert after["metadata"]["uid"] == before[k]["metadata"]["uid"]
    assert after["spec"] == before[k]["spec"]
    assert {e["name"]: e.get("value", "") for e in _ide(after)["env"]}[
        "THEIACLOUD_SESSION_USER"] == ""


def test_a_spec_that_adds_a_monitor_port_replaces_free_instances_with_it(
    kube: Kube, namespace: str,
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=1, shared_route=False)
    run_until_quiet(kube, ns, SETTINGS)
    _, external = _parts(kube, ns, 1)
    assert [p["name"] for p in external["spec"]["ports"]] == ["http"]
    patch_appdef_spec(kube, ns, "java", monitor={"port": 3001})
    run_until_quiet(kube, ns, SETTINGS)
    deployment, external = _parts(kube, ns, 1)
    assert [p["name"] for p in external["spec"]["ports"]] == ["http", "monitor-express"]
    monitor = {"containerPort": 3001, "name": "monitor", "protocol": "TCP"}
    assert monitor in _ide(deployment)["ports"]
