"""Test-side verbs on the real API server: make AppDefinitions and Sessions, read instances.

These are what a person or Theia Cloud's service does to the cluster; the controller's own
code is deliberately not used here, so a test cannot pass because both sides share a bug.
"""

from __future__ import annotations

from typing import Any

from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.testing.gateway import GATEWAY, ensure_shared_route

USERS = [f"user{i}@example.com" for i in range(100)]


SHARED_ROUTE = "theia-cloud-demo-ws-ingress"
HOST = "instances.theia-cloud.local"


def create_shared_route(kube: Kube, ns: str, name: str = SHARED_ROUTE, *,
                        hostnames: tuple[str, ...] = (HOST,)) -> dict[str, Any]:
    """The route Helm creates for an installation (session-lifecycle §1, "The shared route"):
    parentRefs and hostnames, no rules (the API server adds its default rule). Idempotent."""
    return ensure_shared_route(kube, ns, name, hostnames=hostnames, gateway=GATEWAY)


def session_routes(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    """Session routes of `ns` by name (Theia Cloud's session labels)."""
    items, _ = kube.list(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns,
                         label_selector=f"{v.LABEL_COMPONENT}=session,{v.LABEL_PART_OF}=theia-cloud")
    return {o["metadata"]["name"]: o for o in items}


def create_appdef(kube: Kube, ns: str, name: str = "java", *, min_instances: int = 2,
                  max_instances: int = 10, spec_name: str | None = None,
                  image: str = "theiacloud/theia-cloud-demo:1.0",
                  shared_route: bool = True) -> dict[str, Any]:
    """An AppDefinition (and, unless `shared_route` is False, the shared route it names)."""
    if shared_route:
        create_shared_route(kube, ns)
    return kube.create({
        "apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"name": spec_name or f"{name}-app", "image": image, "uid": 101, "port": 3000,
                 "ingressname": SHARED_ROUTE, "minInstances": min_instances,
                 "maxInstances": max_instances, "requestsCpu": "100m", "requestsMemory": "64Mi",
                 "limitsCpu": "1", "limitsMemory": "512Mi", "someFutureField": {"kept": True}},
    })


def patch_appdef_spec(kube: Kube, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name, {"spec": spec})


def create_session(kube: Kube, ns: str, name: str, user: str, appdef: str = "java"
                   ) -> dict[str, Any]:
    return kube.create({
        "apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"name": name, "appDefinition": appdef, "user": user, "workspace": "ws"},
    })


def delete_session(kube: Kube, ns: str, name: str) -> None:
    kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)


def session(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
    assert obj is not None, f"Session {name} is gone"
    return obj


def held_instance(kube: Kube, ns: str, name: str) -> int | None:
    ann = session(kube, ns, name)["metadata"].get("annotations") or {}
    raw = ann.get(v.ANNOTATION_INSTANCE_ID)
    return int(raw) if raw else None


def instance_objects(kube: Kube, ns: str, appdef: str, k: int) -> dict[str, dict[str, Any]]:
    """The pool objects of instance k found by listing (not by the controller's name logic)."""
    ad = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, appdef)
    uid12 = ad["metadata"]["uid"][-12:] if ad else None
    out = {}
    for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment"), ("v1", "ConfigMap")):
        items, _ = kube.list(api_version, kind, ns, label_selector=v.LABEL_GENERATION)
        for item in items:
            name = item["metadata"]["name"]
            if naming.instance_id_from_name(name) == k and (uid12 is None or uid12 in name):
                out[f"{kind}/{name}"] = item
    return out


def emails(kube: Kube, ns: str, appdef: str, k: int) -> str | None:
    for key, obj in instance_objects(kube, ns, appdef, k).items():
        labels = obj["metadata"].get("labels") or {}
        if key.startswith("ConfigMap/") and labels.get(v.LABEL_TEMPLATE_PURPOSE) == "emails":
            return (obj.get("data") or {}).get(v.EMAILS_KEY, "")
    return None


def owner_kinds(obj: dict[str, Any]) -> list[str]:
    return sorted(r["kind"] for r in obj["metadata"].get("ownerReferences") or [])


def assert_invariants(kube: Kube, ns: str, quiet: bool = True) -> None:
    violations = check(kube, ns, quiet=quiet)
    assert not violations, "invariants violated:\n" + "\n".join(map(str, violations))


def snapshot(kube: Kube, ns: str, appdef: str, k: int) -> dict[str, tuple[Any, ...]]:
    """What the controller could have written to instance k's objects (not status, not RV).

    A Deployment's resourceVersion also moves when the deployment controller updates its
    status and its revision annotation, so "untouched by warmpool" is judged on what warmpool
    writes.
    """
    out = {}
    for name, obj in instance_objects(kube, ns, appdef, k).items():
        meta = obj["metadata"]
        ours = {k: val for k, val in (meta.get("annotations") or {}).items()
                if k.startswith(("warmpool.io/", "theia-cloud.io/"))}
        out[name] = (meta["uid"], meta.get("labels"), ours,
                     meta.get("ownerReferences"), obj.get("spec"), obj.get("data"))
    return out
