"""Test-side reads on the real API server (Sessions, instances, snapshots) and `converge`.

The writes a person or Theia Cloud's service makes (AppDefinitions, Sessions, the shared
route) are `warmpool.testing.world`, shared with the chaos runner and the benchmarks. The
controller's own code is deliberately not used here, so a test cannot pass because both sides
share a bug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.waiting import wait_for
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v


def session_routes(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    """Session routes of `ns` by name (Theia Cloud's session labels)."""
    items, _ = kube.list(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns,
                         label_selector=f"{v.LABEL_COMPONENT}=session,{v.LABEL_PART_OF}=theia-cloud")
    return {o["metadata"]["name"]: o for o in items}


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


def instance_count(kube: Kube, ns: str, k: int, appdef: str = "java") -> int:
    """How many pool objects instance k has (5 when whole with routes, 0 when gone)."""
    return len(instance_objects(kube, ns, appdef, k))


def deployment_ready(objects: dict[str, dict[str, Any]]) -> bool:
    """Among an instance's objects (`instance_objects`), a Deployment reports its pod ready
    (`readyReplicas`, written by the Deployment controller after the pod's Ready condition):
    a claim then counts the instance warm, and takes the lowest warm id before any starting
    one (`warmpool.pool.claim.claimable_ids`)."""
    return any(key.startswith("Deployment/")
               and int((obj.get("status") or {}).get("readyReplicas") or 0) >= 1
               for key, obj in objects.items())


def emails(kube: Kube, ns: str, appdef: str, k: int) -> str | None:
    for key, obj in instance_objects(kube, ns, appdef, k).items():
        labels = obj["metadata"].get("labels") or {}
        if key.startswith("ConfigMap/") and labels.get(v.LABEL_TEMPLATE_PURPOSE) == "emails":
            return (obj.get("data") or {}).get(v.EMAILS_KEY, "")
    return None


def owner_kinds(obj: dict[str, Any]) -> list[str]:
    return sorted(r["kind"] for r in obj["metadata"].get("ownerReferences") or [])


def converge(kube: Kube, ns: str, expect: Callable[[], object] | None = None,
             what: str = "the pool", timeout: float = 120, *, interval: float = 0.2) -> None:
    """Wait until `expect()` holds (if given) and then every invariant holds, quiet ones too
    (`warmpool.invariants.check`): the controller has finished what the test started.

    `expect` is asked first, so a test can also record there what it sees on each poll (the
    always-invariants, say). The failure names `what`, whether `expect` held, and the
    violations left."""
    state: dict[str, object] = {}

    def done() -> bool:
        state["expect"] = expect() if expect is not None else True
        return bool(state["expect"]) and not check(kube, ns)

    def why() -> str:
        held = "held" if state.get("expect") else f"not met (last: {state.get('expect')!r})"
        return (f"{what} (expectation {held}); violations: "
                + "\n".join(map(str, check(kube, ns))))

    wait_for(done, timeout=timeout, interval=interval, message=why)


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
