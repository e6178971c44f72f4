"""Fields that go verbatim into every instance's Deployment (builders._deployment_spec) are
checked when the AppDefinition is read: a value the API server would refuse makes the
AppDefinition Invalid, so a spec change with one deletes nothing (before, the free Deployments
were deleted for the new generation and their re-creation failed forever)."""

from __future__ import annotations

from typing import Any

import pytest

from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, Invalid, parse_appdefinition


def obj(**spec: Any) -> dict[str, Any]:
    base = {"name": "java", "image": "theiacloud/theia-cloud-demo:1.0", "port": 3000,
            "uid": 101, "minInstances": 1, "maxInstances": 3, "requestsCpu": "100m",
            "requestsMemory": "64Mi", "limitsCpu": "1", "limitsMemory": "512Mi"}
    base.update(spec)
    return {"metadata": {"name": "a", "uid": "u" * 20},
            "spec": {k: val for k, val in base.items() if val is not None}}


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"requestsCpu": "lots"}, "spec.requestsCpu must be a Kubernetes quantity"),
    ({"limitsMemory": "1 Gi"}, "spec.limitsMemory must be a Kubernetes quantity"),
    ({"requestsMemory": "64MB"}, "spec.requestsMemory must be a Kubernetes quantity"),
    ({"limitsCpu": True}, "spec.limitsCpu must be a Kubernetes quantity"),
    ({"limitsCpu": ["1"]}, "spec.limitsCpu must be a Kubernetes quantity"),
    ({"limitsCpu": float("nan")}, "spec.limitsCpu must be a Kubernetes quantity"),
    ({"limitsMemory": "-1Gi"}, "spec.limitsMemory must not be negative"),
    ({"requestsCpu": "2", "limitsCpu": "1"},
     "spec.requestsCpu ('2') must not exceed spec.limitsCpu ('1')"),
    ({"requestsMemory": "1Gi", "limitsMemory": "512Mi"},
     "spec.requestsMemory ('1Gi') must not exceed spec.limitsMemory ('512Mi')"),
    ({"imagePullPolicy": "always"},
     "spec.imagePullPolicy must be one of Always, IfNotPresent, Never, got 'always'"),
    ({"imagePullPolicy": 3}, "spec.imagePullPolicy must be one of"),
    ({"image": " theiacloud/demo"}, "spec.image must not contain whitespace"),
    ({"image": "theiacloud/demo\n"}, "spec.image must not contain whitespace"),
    ({"image": "theia cloud"}, "spec.image must not contain whitespace"),
    ({"image": 7}, "spec.image must be a string"),
    ({"uid": -1}, "spec.uid (the pod's runAsUser) must be between 0 and 2147483647, got -1"),
    ({"uid": 2**31}, "must be between 0 and 2147483647"),
    ({"port": v.OAUTH2_PROXY_PORT}, f"spec.port must not be {v.OAUTH2_PROXY_PORT}"),
])
def test_deployment_fields_the_api_server_would_refuse(spec: dict[str, Any],
                                                       fragment: str) -> None:
    parsed = parse_appdefinition(obj(**spec))
    assert isinstance(parsed, Invalid) and fragment in parsed.message, parsed


@pytest.mark.parametrize("spec", [
    {},
    {"requestsCpu": 2, "limitsCpu": 4},  # YAML numbers
    {"requestsCpu": 0.5, "limitsCpu": "500m"},
    {"requestsCpu": None, "requestsMemory": None},
    {"limitsCpu": None, "limitsMemory": None},
    {"requestsCpu": "", "limitsMemory": ""},
    {"requestsMemory": "512Mi", "limitsMemory": "512Mi"},
    {"requestsCpu": "1", "limitsCpu": "1000m"},
    {"imagePullPolicy": "Never"},
    {"imagePullPolicy": ""},
    {"uid": 0},
    {"uid": None},
    {"image": "registry.example.com:5000/theia/ide@sha256:" + "a" * 64},
])
def test_deployment_fields_kubernetes_accepts(spec: dict[str, Any]) -> None:
    parsed = parse_appdefinition(obj(**spec))
    assert isinstance(parsed, AppDefinition), parsed


def test_quantities_are_kept_as_written() -> None:
    parsed = parse_appdefinition(obj(requestsCpu=2, limitsCpu="2000m"))
    assert isinstance(parsed, AppDefinition)
    assert (parsed.requests_cpu, parsed.limits_cpu) == ("2", "2000m")
    assert parsed.image_pull_policy == "IfNotPresent"
