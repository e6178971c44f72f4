"""A claimed Session's HTTPRoute (session-lifecycle §1, §3), as pure functions.

The route sends the holder's browser to its instance: `<Session uid>-route`, owned by the
Session, labelled like the claimed Services, with the shared route's `parentRefs` and
`hostnames` and Theia Cloud's two rules byte-for-byte (a redirect of the bare path to its
trailing-slash form, and the prefix to the instance's external Service, oauth2-proxy). It
exists exactly while its Session holds the instance and the shared route exists; the
instance's plan creates it after the allow-list is the holder's, converges it when edited,
and deletes it first on release (`warmpool.pool.decide`).

What the API server adds to a route it stores (defaults of the CRD's schema) is normalised
on both sides before comparing (`same_spec`): otherwise every reconcile would patch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from warmpool.pool import builders, grammar
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.meta import labels_of, meta_of, name_of, owner_refs
from warmpool.pool.model import AppDefinition, Session
from warmpool.pool.parts import Part

Obj = Mapping[str, Any]

#: A Session's message while its AppDefinition's shared route does not exist (Java's).
ROUTE_MISSING = "HTTPRoute not available."
#: ... while its route cannot be written (Java's message for any route write failure).
ROUTE_FAILED = "Failed to edit HTTPRoute."


#: What the route tells oauth2-proxy the browser asked for (its sign-in redirect returns
#: there). Theia Cloud's route sends `%REQ(:PATH)%`, the path *with its query*; oauth2-proxy
#: before 7.11 matched skip_auth_routes against that (GHSA-7rh7-c77v-6434: `/x?/health`
#: skipped authentication). Envoy's `%PATH(NQ)%` is the same path without the query. The
#: header is still *set*, not dropped: dropped, a client's own X-Forwarded-Uri would pass
#: through the gateway, which oauth2-proxy trusts (trusted_proxy_ip), and the sign-in
#: redirect would lose the session's path prefix that the URLRewrite removes.
FORWARDED_URI = "%PATH(NQ)%"


def route_name(session_uid: str) -> str:
    return f"{session_uid}{v.ROUTE_SUFFIX}"


def _spec(obj: Obj | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def is_session_route(obj: Obj) -> bool:
    """A route a controller made for one Session (Theia Cloud's labels), not a shared one."""
    labels = labels_of(obj)
    return (labels.get(v.LABEL_COMPONENT) == "session"
            and labels.get(v.LABEL_PART_OF) == "theia-cloud")


def session_uid_of(route: Obj) -> str:
    """The Session a session route was made for: its session-uuid label."""
    return str(labels_of(route).get(v.LABEL_SESSION_UUID) or "")


def backends(route: Obj) -> set[str]:
    """The names of the Services a route's rules send to."""
    out: set[str] = set()
    for rule in _spec(route).get("rules") or ():
        if not isinstance(rule, Mapping):
            continue
        for ref in rule.get("backendRefs") or ():
            if isinstance(ref, Mapping) and ref.get("name") and ref.get("kind", "Service") \
                    == "Service" and not ref.get("group"):
                out.add(str(ref["name"]))
    return out


def only_owned_by_its_session(route: Obj) -> bool:
    """Whether every owner reference of a session route names the Session it was made for,
    so deleting it takes nothing another owner holds (session-lifecycle §3, the sweep)."""
    uid = session_uid_of(route)
    return bool(uid) and all(
        r.get("kind") == v.SESSION_KIND and r.get("uid") == uid
        for r in owner_refs(route))


def hostnames(appdef: AppDefinition, shared: Obj, settings: PoolSettings) -> list[str]:
    """The shared route's hostnames as stored, or (none there) the instances host and each
    `ingressHostnamePrefixes` entry before it."""
    stored = _spec(shared).get("hostnames") or []
    if stored:
        return [str(h) for h in stored]
    host = settings.instances_host
    return [host, *(f"{p}{host}" for p in appdef.ingress_hostname_prefixes)]


def shared_route_error(appdef: AppDefinition, shared: Obj, settings: PoolSettings) -> str | None:
    """Why a Session's route may not copy the shared route `shared` (the field and the rule),
    or None.

    The shared route is anyone's with `patch` on HTTPRoutes: its `parentRefs` and `hostnames`
    are copied into every holder's route, so each is held to the Gateway API's grammar
    (warmpool.pool.grammar: the six ParentReference fields, RFC 1123 hostnames, at most 32 and
    16 of them). The Gateway API's CRD holds the stored shared route to most of this, but
    not every cluster's CRD is that version, and it admits a parentRef `name` of any
    characters; a value the API server refuses in a Session route would fail every claim of
    the pool (each Session ERROR). The hostnames made of the instances host and the
    AppDefinition's prefixes (used when the shared route has none) are checked the same way:
    those the CRD never saw.
    """
    spec = _spec(shared)
    if (error := grammar.route_parents_error(spec.get("parentRefs"),
                                             spec.get("hostnames"))) is not None:
        return error
    if not spec.get("hostnames"):
        for host in hostnames(appdef, shared, settings):
            if (error := grammar.hostname_error(host)) is not None:
                return (f"the hostname {grammar.shown(host)} (the instances host, after a "
                        f"spec.ingressHostnamePrefixes entry of AppDefinition "
                        f"{appdef.name}) {error}")
    return None


def invalid_shared_route(appdef: AppDefinition, error: str) -> str:
    """A waiting Session's message (and the Warning's) while the shared route is invalid."""
    return (f"HTTPRoute {appdef.ingress_name!r} (spec.ingressname of AppDefinition "
            f"{appdef.name}) cannot be copied into Session routes: {error}")


def desired_route(
    appdef: AppDefinition, instance: int, holder: Session, shared: Obj, settings: PoolSettings
) -> dict[str, Any]:
    """The whole route of `holder` on `instance` (session-lifecycle §1, "The object")."""
    path = settings.session_path(appdef, instance)
    service = builders.object_name(appdef, Part.EXTERNAL_SERVICE, instance)
    return {
        "apiVersion": v.ROUTE_API_VERSION,
        "kind": v.ROUTE_KIND,
        "metadata": {
            "name": route_name(holder.uid),
            "namespace": holder.namespace,
            "labels": builders.session_labels(appdef, holder),
            "ownerReferences": [holder.owner_reference()],
        },
        "spec": {
            "parentRefs": copy.deepcopy(list(_spec(shared).get("parentRefs") or [])),
            "hostnames": hostnames(appdef, shared, settings),
            "rules": [
                {"matches": [{"path": {"type": "Exact", "value": path}}],
                 "filters": [{"type": "RequestRedirect",
                              "requestRedirect": {"statusCode": 302, "path": {
                                  "type": "ReplaceFullPath", "replaceFullPath": f"{path}/"}}}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": f"{path}/"}}],
                 "filters": [
                     {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                         "set": [{"name": "X-Forwarded-Uri", "value": FORWARDED_URI}]}},
                     {"type": "URLRewrite", "urlRewrite": {"path": {
                         "type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}],
                 "backendRefs": [{"name": service, "port": appdef.port}]},
            ],
        },
    }


# --- comparing with what the server stored ------------------------------------------------

def _with_defaults(items: Iterable[Any], defaults: Mapping[str, Any]) -> list[Any]:
    return [{**defaults, **item} if isinstance(item, Mapping) else item for item in items]


def normalised(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` with the defaults a Gateway API v1.5.1 CRD gives a stored route filled in:
    `parentRefs` gain group and kind; `backendRefs` group, kind and weight; a redirect its
    302; a path match its type and value; a route without rules the catch-all rule."""
    out = copy.deepcopy(dict(spec))
    out["parentRefs"] = _with_defaults(out.get("parentRefs") or [],
                                       {"group": "gateway.networking.k8s.io", "kind": "Gateway"})
    out["hostnames"] = list(out.get("hostnames") or [])
    rules = out.get("rules") or [{}]
    normal_rules = []
    for rule in rules:
        if not isinstance(rule, Mapping):
            normal_rules.append(rule)
            continue
        rule = dict(rule)
        matches = rule.get("matches") or [{}]
        rule["matches"] = [
            {**m, "path": {"type": "PathPrefix", "value": "/", **(m.get("path") or {})}}
            if isinstance(m, Mapping) else m for m in matches]
        filters = []
        for f in rule.get("filters") or ():
            if isinstance(f, Mapping) and isinstance(f.get("requestRedirect"), Mapping):
                f = {**f, "requestRedirect": {"statusCode": 302, **f["requestRedirect"]}}
            filters.append(f)
        if filters or "filters" in rule:
            rule["filters"] = filters
        if "backendRefs" in rule:
            rule["backendRefs"] = _with_defaults(rule["backendRefs"] or [],
                                                 {"group": "", "kind": "Service", "weight": 1})
        normal_rules.append(rule)
    out["rules"] = normal_rules
    return out


def same_spec(live: Obj, desired: Obj) -> bool:
    return normalised(_spec(live)) == normalised(_spec(desired))


def route_patch(live: Obj, desired: Obj) -> dict[str, Any]:
    """The merge patch that converges `live` to `desired`: the spec (its three lists, whole),
    the six session labels, the Session's owner reference. Foreign labels, annotations and
    owner references are left as they are. Empty when nothing differs."""
    patch: dict[str, Any] = {}
    if not same_spec(live, desired):
        spec = _spec(desired)
        patch["spec"] = {k: spec[k] for k in ("parentRefs", "hostnames", "rules")}
    labels = labels_of(live)
    changed = {k: val for k, val in labels_of(desired).items() if labels.get(k) != val}
    if changed:
        patch.setdefault("metadata", {})["labels"] = changed
    refs: list[Any] = list(owner_refs(live))
    for ref in owner_refs(desired):
        if not any(r.get("uid") == ref["uid"] and r.get("name") == ref["name"] for r in refs):
            refs.append(ref)
    if refs != list(owner_refs(live)):
        patch.setdefault("metadata", {})["ownerReferences"] = refs
    return patch


def routes_to_instance(
    candidates: Iterable[Obj], service: str, holder_uids: Iterable[str]
) -> tuple[Obj, ...]:
    """The session routes among `candidates` that belong to an instance: those sending to its
    external Service `service`, and the route of each Session its objects reference,
    wherever that one sends (edited by hand, it is still the holder's to converge)."""
    names = {route_name(uid) for uid in holder_uids}
    found: dict[str, Obj] = {}
    for r in candidates:
        name = name_of(r)
        if is_session_route(r) and (service in backends(r) or name in names):
            found[name] = r
    return tuple(found[n] for n in sorted(found))


def stray_routes(routes: Sequence[Obj], holder_uid: str | None) -> list[Obj]:
    """The session routes to an instance that are not its holder's, and hold nothing for
    another owner: a released Session's, a double claim's. They are deleted (guarded)."""
    keep = route_name(holder_uid) if holder_uid else None
    return [r for r in routes if is_session_route(r) and meta_of(r).get("name") != keep
            and only_owned_by_its_session(r)]
