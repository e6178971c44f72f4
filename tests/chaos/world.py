"""A consistent view of the cluster: every list at one etcd revision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient

from warmpool.invariants import check
from warmpool.kube import observe
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v


class PinnedKube(Kube):
    """A Kube whose lists all read one etcd revision: the first list's, until `unpin()`.

    The invariant checker lists Sessions, AppDefinitions and three kinds of pool objects one
    after the other; without a common revision a claim landing between two lists would look
    like two holders. Every kind lives in the same etcd, so one revision is one moment.
    """

    def __init__(self, api_client: ApiClient) -> None:
        super().__init__(api_client)
        self.rv: str | None = None

    def unpin(self) -> None:
        self.rv = None

    def list(self, api_version: str, kind: str, namespace: str | None, *,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        query = [("labelSelector", label_selector)] if label_selector is not None else []
        if self.rv:
            query += [("resourceVersion", self.rv), ("resourceVersionMatch", "Exact")]
        body = self._send("GET", self._path(api_version, kind, namespace), query)
        rv = str((body.get("metadata") or {}).get("resourceVersion"))
        if self.rv is None:
            self.rv = rv
        return body.get("items") or [], rv


@dataclass
class World:
    """One snapshot of the namespaces under test (all at one revision)."""

    rv: str
    appdefs: dict[str, list[dict[str, Any]]]
    sessions: dict[str, list[dict[str, Any]]]
    objects: dict[str, list[dict[str, Any]]]
    routes: dict[str, list[dict[str, Any]]]


def snapshot(kube: PinnedKube, namespaces: list[str]) -> World:
    kube.unpin()
    appdefs, sessions, objects, routes = {}, {}, {}, {}
    for ns in namespaces:
        sessions[ns], _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
        appdefs[ns], _ = kube.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns)
        objects[ns] = observe.list_pool_objects(kube, ns)
        routes[ns], _ = kube.list(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns)
    assert kube.rv is not None
    return World(kube.rv, appdefs, sessions, objects, routes)


class WorldKube:
    """Answers `warmpool.invariants.check`'s lists from a snapshot (no second round trip)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def list(self, api_version: str, kind: str, namespace: str, *,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        if kind == v.APPDEF_KIND:
            items = self.world.appdefs[namespace]
        elif kind == v.SESSION_KIND:
            items = self.world.sessions[namespace]
        elif kind == v.ROUTE_KIND:
            items = self.world.routes[namespace]
        else:
            items = [o for o in self.world.objects[namespace] if o.get("kind") == kind]
        return [dict(i) for i in items], self.world.rv


def violations_in(world: World, namespaces: list[str], quiet: bool) -> list[str]:
    """`warmpool.invariants.check` for every namespace, on one snapshot."""
    kube: Any = WorldKube(world)
    return [f"{ns}: {x}" for ns in namespaces for x in check(kube, ns, quiet=quiet)]


def live_name(world: World, ns: str, uid: str) -> str:
    for s in world.sessions.get(ns, []):
        if s["metadata"].get("uid") == uid:
            return str(s["metadata"].get("name"))
    return uid[:8]
