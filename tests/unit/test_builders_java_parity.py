"""What a prewarmed instance carries of Java's template (issue #31): the THEIACLOUD_* environment,
the AppDefinition's pullSecret and the monitor port on the external Service.

The expected values are read off Java's DefaultDeploymentTemplateReplacements and
TheiaCloudServiceUtil for an eager instance (getReplacements(namespace, appDefinition, k)).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.pool_fixtures import session
from warmpool.pool import builders
from warmpool.pool.model import AppDefinition, Invalid, parse_appdefinition
from warmpool.pool.parts import Part
from warmpool.testing.world import appdef_body, appdef_spec

SETTINGS = builders.PoolSettings(
    routes="none", url_probe=False, instances_host="ide.example.org", use_paths=True,
    instances_path="instances", service_url="https://service.example.org/service",
    service_auth_token="tok-123", keycloak_url="https://kc.example.org/", keycloak_realm="tc",
    keycloak_client_id="theia")


def parsed(**spec: Any) -> AppDefinition | Invalid:
    return parse_appdefinition(appdef_body("ns", "java", appdef_spec(
        "java", spec_name="java-17", ingressname=None, **spec),
        metadata={"uid": "aaaa-bbbb-381261d79c23", "generation": 1}))


def appdef(**spec: Any) -> AppDefinition:
    a = parsed(**spec)
    assert isinstance(a, AppDefinition), a
    return a


def build(part: Part, a: AppDefinition, k: int = 3) -> dict[str, Any]:
    return builders.build(part, a, k, holder=None, proxy_template=None, settings=SETTINGS)


def ide(a: AppDefinition) -> dict[str, Any]:
    containers = build(Part.DEPLOYMENT, a)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] != "oauth2-proxy")


def env(a: AppDefinition) -> dict[str, str]:
    return {e["name"]: e["value"] for e in ide(a)["env"]}


def test_env_carries_every_theiacloud_variable_of_java_in_its_order() -> None:
    names = [e["name"] for e in ide(appdef())["env"]]
    assert names == list(builders.THEIACLOUD_ENV)


def test_env_values_for_an_eager_instance() -> None:
    got = env(appdef(monitor={"port": 8081, "activityTracker": {"timeoutAfter": 30}}))
    assert got == {
        "THEIACLOUD_SERVICE_AUTH_TOKEN": "tok-123",
        "THEIACLOUD_APP_ID": "tok-123",
        "THEIACLOUD_SERVICE_URL": "https://service.example.org/service",
        # A prewarmed instance belongs to no Session yet; Java leaves these empty.
        "THEIACLOUD_SESSION_UID": "",
        "THEIACLOUD_SESSION_NAME": "",
        "THEIACLOUD_SESSION_USER": "",
        "THEIACLOUD_SESSION_SECRET": "",
        # https:// + instancesHost + /<instancesPath>/<spec.name>-<k> + /
        "THEIACLOUD_SESSION_URL": "https://ide.example.org/instances/java-17-3/",
        "THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER": "true",
        "THEIACLOUD_MONITOR_PORT": "8081",
        "THEIACLOUD_KEYCLOAK_URL": "https://kc.example.org/",
        "THEIACLOUD_KEYCLOAK_REALM": "tc",
        "THEIACLOUD_KEYCLOAK_CLIENT_ID": "theia",
    }


def test_env_without_monitor_turns_the_tracker_off() -> None:
    got = env(appdef())
    assert got["THEIACLOUD_MONITOR_PORT"] == ""
    assert got["THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER"] == "false"
    monitor_only = env(appdef(monitor={"port": 8081}))
    assert monitor_only["THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER"] == "false"


def test_a_claim_changes_nothing_in_the_pod_template() -> None:
    """Session variables are not patched at a claim (Java does not either): the template of a
    held instance is the free one's, so a claim never restarts the pod."""
    a = appdef(monitor={"port": 8081})
    held = builders.build(Part.DEPLOYMENT, a, 3, holder=session(instance=3),
                          proxy_template=None, settings=SETTINGS)
    assert held["spec"] == build(Part.DEPLOYMENT, a)["spec"]


def test_pull_secret_becomes_image_pull_secrets() -> None:
    pod = build(Part.DEPLOYMENT, appdef(pullSecret="regcred"))["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    for unset in ({}, {"pullSecret": ""}, {"pullSecret": None}):
        pod = build(Part.DEPLOYMENT, appdef(**unset))["spec"]["template"]["spec"]
        assert "imagePullSecrets" not in pod


@pytest.mark.parametrize("bad", ["Reg_Cred", "a/b", " regcred", "x" * 254, 7, ["regcred"]])
def test_a_bad_pull_secret_refuses_its_appdefinition(bad: object) -> None:
    result = parsed(pullSecret=bad)
    assert isinstance(result, Invalid)
    assert result.message.startswith("spec.pullSecret ")


def test_monitor_port_is_declared_on_the_external_service_and_the_container() -> None:
    a = appdef(monitor={"port": 8081})
    ports = build(Part.EXTERNAL_SERVICE, a)["spec"]["ports"]
    assert ports == [
        {"name": "http", "port": 3000, "targetPort": "web"},
        {"name": "monitor-express", "port": 8081, "targetPort": 8081, "protocol": "TCP"}]
    assert ide(a)["ports"] == [{"containerPort": 3000}, {"containerPort": 8081,
                                                        "name": "monitor"}]
    # The internal Service is unchanged (Java's templateInternalService has no monitor).
    internal = build(Part.INTERNAL_SERVICE, a)["spec"]["ports"]
    assert [p["name"] for p in internal] == ["http-internal"]


def test_monitor_port_equal_to_the_app_port_is_not_declared_twice() -> None:
    a = appdef(monitor={"port": 3000})
    assert [p["name"] for p in build(Part.EXTERNAL_SERVICE, a)["spec"]["ports"]] == ["http"]
    assert ide(a)["ports"] == [{"containerPort": 3000}]
    assert env(a)["THEIACLOUD_MONITOR_PORT"] == "3000"


@pytest.mark.parametrize("monitor, why", [
    ({"port": 0}, "spec.monitor.port must be a TCP port"),
    ({"port": 65536}, "spec.monitor.port must be a TCP port"),
    ({"port": "http"}, "spec.monitor.port must be an integer"),
    ({"port": 5000}, "spec.monitor.port must not be 5000"),
    ("8081", "spec.monitor must be an object"),
])
def test_a_bad_monitor_port_refuses_its_appdefinition(monitor: object, why: str) -> None:
    result = parsed(monitor=monitor)
    assert isinstance(result, Invalid)
    assert result.message.startswith(why), result.message


def test_a_bad_activity_tracker_value_does_not_refuse_the_pool() -> None:
    """The tracker's minutes are the timeouts' concern (read as unset there)."""
    a = appdef(monitor={"port": 8081, "activityTracker": {"timeoutAfter": "soon"}})
    assert a.monitor_port == 8081 and a.activity_tracker


def test_the_new_fields_change_the_shape() -> None:
    """A pullSecret or monitor port added to the spec replaces free instances (their pods
    would otherwise keep running without them)."""
    plain = build(Part.DEPLOYMENT, appdef())["metadata"]["annotations"]
    for changed in (appdef(pullSecret="regcred"), appdef(monitor={"port": 8081})):
        assert build(Part.DEPLOYMENT, changed)["metadata"]["annotations"] != plain


def test_settings_from_env() -> None:
    got = builders.PoolSettings.from_env({
        "WARMPOOL_SERVICE_URL": " https://svc/ ", "WARMPOOL_SERVICE_AUTH_TOKEN": "t0k",
        "WARMPOOL_KEYCLOAK_URL": "https://kc/", "WARMPOOL_KEYCLOAK_REALM": "r",
        "WARMPOOL_KEYCLOAK_CLIENT_ID": "c"})
    assert (got.service_url, got.service_auth_token, got.keycloak_url, got.keycloak_realm,
            got.keycloak_client_id) == ("https://svc/", "t0k", "https://kc/", "r", "c")
    assert "t0k" not in repr(got)
    assert builders.PoolSettings.from_env({}).service_url == ""


@pytest.mark.parametrize("name", ["WARMPOOL_SERVICE_URL", "WARMPOOL_SERVICE_AUTH_TOKEN",
                                  "WARMPOOL_KEYCLOAK_REALM"])
@pytest.mark.parametrize("raw", ["a b", "a\nb", "é", "x" * 3000])
def test_bad_settings_are_refused_without_showing_the_value(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name) as caught:
        builders.PoolSettings.from_env({name: raw})
    assert raw not in str(caught.value)
