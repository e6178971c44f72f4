"""The test world's AppDefinitions and Sessions: one definition of what they look like.

Tests (unit and integration), the chaos runner and the benchmarks all make the same two kinds of
object; each used to spell the dict out itself, and the copies drifted (a field added to one
world was missing from the next). Here are the bodies, and the verbs a person or Theia Cloud's
service uses to make them on a real API server. The controller's own code is deliberately not
used to build them, so a test cannot pass because both sides share a bug.

- `appdef_spec` / `session_spec`: the spec of the world's AppDefinition / Session.
- `appdef_body` / `session_body`: an object around any spec (also a malformed one), with extra
  metadata (uid, generation, annotations...) for tests that feed objects straight to a parser.
- `create_appdef` / `create_session` (and `create_shared_route`, `patch_appdef_spec`,
  `delete_session`): the writes on the API server.
- `create_namespace`: a namespace ready for Pods, for the tests' fixture and the benchmarks.
"""

from __future__ import annotations

from typing import Any

from warmpool.kube.api import Kube, KubeError
from warmpool.pool import vocabulary as v
from warmpool.testing.gateway import GATEWAY, ensure_shared_route
from warmpool.testing.waiting import wait_for

__all__ = [
    "HOST",
    "IMAGE",
    "SHARED_ROUTE",
    "USERS",
    "appdef_body",
    "appdef_spec",
    "create_appdef",
    "create_namespace",
    "create_session",
    "create_shared_route",
    "delete_session",
    "patch_appdef_spec",
    "session_body",
    "session_spec",
]

USERS = [f"user{i}@example.com" for i in range(100)]
SHARED_ROUTE = "theia-cloud-demo-ws-ingress"
HOST = "instances.theia-cloud.local"  # = PoolSettings().instances_host
IMAGE = "theiacloud/theia-cloud-demo:1.0"


def appdef_spec(name: str = "java", *, min_instances: int = 2, max_instances: int = 10,
                spec_name: str | None = None, image: str = IMAGE,
                ingressname: str | None = SHARED_ROUTE, resources: bool = True,
                **extra: Any) -> dict[str, Any]:
    """The spec of the world's AppDefinition `name`: Theia Cloud's demo image on port 3000,
    small requests and limits (`resources`), the shared route (`ingressname`, None for none),
    and an unknown field the controller must keep (`someFutureField`). `extra` is merged last
    (it may override any key)."""
    spec: dict[str, Any] = {"name": spec_name or f"{name}-app", "image": image, "uid": 101,
                            "port": 3000, "minInstances": min_instances,
                            "maxInstances": max_instances}
    if ingressname is not None:
        spec["ingressname"] = ingressname
    if resources:
        spec.update({"requestsCpu": "100m", "requestsMemory": "64Mi", "limitsCpu": "1",
                     "limitsMemory": "512Mi", "someFutureField": {"kept": True}})
    return {**spec, **extra}


def session_spec(name: str, user: str, appdef: str = "java", *,
                 workspace: str | None = "ws") -> dict[str, Any]:
    """The spec of a Session `name` of `user` on AppDefinition `appdef` (Theia Cloud's service
    always names a workspace; None leaves it out)."""
    spec = {"name": name, "appDefinition": appdef, "user": user}
    if workspace is not None:
        spec["workspace"] = workspace
    return spec


def _body(api_version: str, kind: str, ns: str, name: str, spec: dict[str, Any],
          metadata: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": ns, **metadata}, "spec": spec, **extra}


def appdef_body(ns: str, name: str = "java", spec: dict[str, Any] | None = None, *,
                metadata: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """An AppDefinition object: `spec` as given (default `appdef_spec(name)`), `metadata`
    merged into name and namespace (uid, generation... as the API server would add them),
    `extra` top-level fields (status)."""
    return _body(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name,
                 appdef_spec(name) if spec is None else spec, metadata or {}, extra)


def session_body(ns: str, name: str, spec: dict[str, Any], *,
                 metadata: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A Session object around `spec` (`session_spec(...)`, or anything, malformed included)."""
    return _body(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name, spec, metadata or {}, extra)


def create_namespace(kube: Kube, name: str, *, labels: dict[str, str] | None = None,
                     timeout: float = 60) -> dict[str, Any]:
    """Namespace `name`, returned once Pods can be made in it: the API server refuses them
    until the default ServiceAccount exists (and, in 1.20, has its token secret)."""
    created = kube.create({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": name, "labels": dict(labels or {})}})

    def default_sa_has_token() -> bool:
        sa = kube.get("v1", "ServiceAccount", name, "default")
        return bool(sa and sa.get("secrets"))

    wait_for(default_sa_has_token, timeout=timeout, ignore=(KubeError,),
             message=f"the default ServiceAccount of {name}")
    return created


def create_shared_route(kube: Kube, ns: str, name: str = SHARED_ROUTE, *,
                        hostnames: tuple[str, ...] = (HOST,)) -> dict[str, Any]:
    """The route Helm creates for an installation (session-lifecycle §1, "The shared route"):
    parentRefs and hostnames, no rules (the API server adds its default rule). Idempotent."""
    return ensure_shared_route(kube, ns, name, hostnames=hostnames, gateway=GATEWAY)


def create_appdef(kube: Kube, ns: str, name: str = "java", *, min_instances: int = 2,
                  max_instances: int = 10, spec_name: str | None = None, image: str = IMAGE,
                  shared_route: bool = True, **extra: Any) -> dict[str, Any]:
    """The world's AppDefinition `name` (`appdef_spec`; `extra` spec fields merged) and, unless
    `shared_route` is False, the shared route it names."""
    if shared_route:
        create_shared_route(kube, ns)
    return kube.create(appdef_body(ns, name, appdef_spec(
        name, min_instances=min_instances, max_instances=max_instances, spec_name=spec_name,
        image=image, **extra)))


def patch_appdef_spec(kube: Kube, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name, {"spec": spec})


def create_session(kube: Kube, ns: str, name: str, user: str, appdef: str = "java"
                   ) -> dict[str, Any]:
    return kube.create(session_body(ns, name, session_spec(name, user, appdef)))


def delete_session(kube: Kube, ns: str, name: str) -> None:
    kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
