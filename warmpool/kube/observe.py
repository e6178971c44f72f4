"""Read what the decisions need: the AppDefinition, its Sessions and its instances' objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from warmpool.kube.api import Kube, not_served
from warmpool.kube.reflector import Watched
from warmpool.pool import builders, naming
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import InstanceView, is_appdef_ref, is_session_ref, refs
from warmpool.pool.meta import labels_of, meta_of
from warmpool.pool.model import AppDefinition, Invalid, Session, parse_appdefinition, parse_session
from warmpool.pool.parts import PARTS, POOL_KINDS, Part

# Every pool object carries the generation label: one selector finds them all, in a watch too.
POOL_SELECTOR = v.LABEL_GENERATION
#: The pool's kinds watched for their metadata alone: no decision reads a Service's or a
#: Deployment's spec or status from a watch (the workers' caches keep their metadata:
#: `warmpool.kube.cache.strip`; the scheduler maps their owner references and names, and a
#: spec changed by hand moves a Deployment's metadata.generation), so the server encodes,
#: and every watching process decodes, neither. A Deployment's status is written several
#: times per pod start by the deployment controller: its events were 44 % of the watch
#: bytes per Session at 2 Sessions/s (issue #28). ConfigMaps are watched whole: the
#: allow-list's data is read, and its change by hand must requeue its instance.
METADATA_ONLY_KINDS = frozenset({"Service", "Deployment"})
#: A watch of each kind of pool object, by that selector: what the workers' caches and the
#: scheduler keep (Services, Deployments, ConfigMaps: `POOL_KINDS`' order).
POOL_WATCHES: tuple[Watched, ...] = tuple(
    Watched(kind, api_version, POOL_SELECTOR, metadata_only=kind in METADATA_ONLY_KINDS)
    for api_version, kind in POOL_KINDS)


def read_appdef(kube: Kube, namespace: str, name: str) -> AppDefinition | Invalid | None:
    obj = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace, name)
    return None if obj is None else parse_appdefinition(obj)


def read_session(kube: Kube, namespace: str, name: str) -> Session | None:
    obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, namespace, name)
    return None if obj is None else parse_session(obj)


def list_sessions(
    kube: Kube, namespace: str, appdef_name: str | None = None, *, since: str | None = None,
) -> list[Session]:
    """The namespace's Sessions (of `appdef_name`, when given); `since`: from the API
    server's watch cache, not older than that resourceVersion (None: etcd, `Kube.list`)."""
    items, _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, namespace,
                         resource_version=since)
    sessions = [parse_session(o) for o in items]
    return [s for s in sessions if appdef_name is None or s.appdef == appdef_name]


def proxy_template(kube: Kube, namespace: str) -> str | None:
    cm = kube.get("v1", "ConfigMap", namespace, v.NAMESPACE_PROXY_TEMPLATE)
    # Anyone with `patch` on ConfigMaps writes it: returned as read, and bounded where it is
    # used, by warmpool.pool.proxy.prepare (64 KiB, TOML, known values, rewritten).
    return None if cm is None else (cm.get("data") or {}).get(v.PROXY_CONFIG_KEY)


#: Theia Cloud's labels on a Session's route (and its claimed Services).
ROUTE_SELECTOR = f"{v.LABEL_COMPONENT}=session,{v.LABEL_PART_OF}=theia-cloud"


def read_route(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    obj = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, namespace, name)
    if obj is not None:
        obj.setdefault("kind", v.ROUTE_KIND)
    return obj


def read_ingress(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    obj = kube.get("networking.k8s.io/v1", "Ingress", namespace, name)
    if obj is not None:
        obj.setdefault("kind", "Ingress")
    return obj


def list_session_routes(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    items, _ = kube.list(v.ROUTE_API_VERSION, v.ROUTE_KIND, namespace,
                         label_selector=ROUTE_SELECTOR)
    for item in items:
        item.setdefault("kind", v.ROUTE_KIND)
    return items


def list_schedules(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The PoolSchedules of `namespace` (none where their CRD is not installed)."""
    try:
        items, _ = kube.list(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, namespace)
    except Exception as exc:
        if not_served(exc):
            return []
        raise
    for item in items:
        item.setdefault("kind", v.SCHEDULE_KIND)
    return items


def holder_uids(view: InstanceView) -> set[str]:
    """The uids of the Sessions any of an instance's objects references."""
    return {str(r["uid"]) for _, obj in view.existing() for r in refs(obj)
            if is_session_ref(r) and r.get("uid")}


def observe_instance(kube: Kube, appdef: AppDefinition, instance: int) -> InstanceView:
    """The five objects of one instance, by their exact names (five GETs)."""
    objects = {
        part: kube.get(part.api_version, part.kind, appdef.namespace,
                       builders.object_name(appdef, part, instance))
        for part in PARTS
    }
    return InstanceView(instance, objects)


def classify(obj: Mapping[str, Any]) -> Part | None:
    """Which of the five an object is (when names cannot be computed): from its kind and its
    name, which the controller chose at creation and nobody can change, so a hand-edited
    `template-purpose` or `service-type` label cannot turn an allow-list into a proxy
    configuration (the chaos tier's hostile edits, issue #27); from the labels only for a
    name that is not one of ours."""
    kind = obj.get("kind")
    labels = labels_of(obj)
    if kind == "Deployment":
        return Part.DEPLOYMENT
    split = naming.split_instance_name(str(meta_of(obj).get("name") or ""))
    rest = split[1] if split is not None else None
    if kind == "Service":
        if rest is not None:  # "-int" is the internal Service's suffix, kept whole
            return Part.INTERNAL_SERVICE if rest.endswith("-int") else Part.EXTERNAL_SERVICE
        internal = labels.get(v.LABEL_SERVICE_TYPE) == v.SERVICE_TYPE_INTERNAL
        return Part.INTERNAL_SERVICE if internal else Part.EXTERNAL_SERVICE
    if kind == "ConfigMap":
        if rest is not None:  # the ident comes first: instance-<k>-email-..., -proxy-...
            for part in (Part.EMAIL_CONFIGMAP, Part.PROXY_CONFIGMAP):
                if rest.startswith(f"{part.ident}-"):
                    return part
        by_purpose: dict[str | None, Part] = {v.PURPOSE_PROXY: Part.PROXY_CONFIGMAP,
                                              v.PURPOSE_EMAILS: Part.EMAIL_CONFIGMAP}
        return by_purpose.get(labels.get(v.LABEL_TEMPLATE_PURPOSE))
    return None


def list_pool_objects(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """Every pool object in the namespace (three lists), each with its kind filled in."""
    out: list[dict[str, Any]] = []
    for api_version, kind in POOL_KINDS:
        items, _ = kube.list(api_version, kind, namespace, label_selector=POOL_SELECTOR)
        for item in items:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", api_version)
            out.append(item)
    return out


def referencing(kube: Kube, namespace: str, uid: str) -> frozenset[int]:
    """Ids of the instances whose external Service references the Session with `uid`, from
    the server (one LIST of the pool's Services): where a cache's answer would decide a
    release that nothing on the server guards."""
    items, _ = kube.list("v1", "Service", namespace, label_selector=POOL_SELECTOR)
    found: set[int] = set()
    for svc in items:
        svc.setdefault("kind", "Service")
        k = naming.instance_id_from_name(meta_of(svc).get("name", ""))
        if (k is not None and classify(svc) is Part.EXTERNAL_SERVICE
                and any(is_session_ref(r) and r.get("uid") == uid for r in refs(svc))):
            found.add(k)
    return frozenset(found)


def list_pool_pods(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The pool's pods (their template carries the generation label), for a reader without
    a cache: which instances are warm. From etcd, like every read of such a reader."""
    items, _ = kube.list("v1", "Pod", namespace, label_selector=POOL_SELECTOR)
    for item in items:
        item.setdefault("kind", "Pod")
    return items


def group_pool(
    objects: list[dict[str, Any]], appdef_name: str, appdef: AppDefinition | None,
    sessions: Iterable[Session] = (),
) -> dict[int, InstanceView]:
    """Group pool objects of one AppDefinition into instances.

    With the AppDefinition at hand an object belongs to it by its exact expected name (so an
    object whose AppDefinition reference the Java operator stripped is still found). Without it
    (deleted, or invalid) by an owner reference naming it, or by a reference to one of
    `sessions` that belongs to it: when an AppDefinition is deleted the garbage collector strips
    its reference from the objects a live Session also owns, and those are exactly the objects
    that must stay visible, so that the holder's allow-list is still kept right.
    """
    holder_uids = {s.uid for s in sessions if s.appdef == appdef_name}
    found: dict[int, dict[Part, dict[str, Any] | None]] = {}
    for obj in objects:
        name = meta_of(obj).get("name", "")
        k = naming.instance_id_from_name(name)
        part = classify(obj)
        if k is None or part is None:
            continue
        if appdef is not None:
            if builders.object_name(appdef, part, k) != name:
                continue
        elif not any(is_appdef_ref(r, appdef_name)
                     or (is_session_ref(r) and r.get("uid") in holder_uids)
                     for r in refs(obj)):
            continue
        found.setdefault(k, {})[part] = obj
    return {k: InstanceView(k, {p: objs.get(p) for p in PARTS}) for k, objs in found.items()}


def observe_pool(
    kube: Kube, namespace: str, appdef_name: str, appdef: AppDefinition | None,
    sessions: Iterable[Session] = (),
) -> dict[int, InstanceView]:
    return group_pool(list_pool_objects(kube, namespace), appdef_name, appdef, sessions)
