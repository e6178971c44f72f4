"""The five objects of an instance, and how each is named.

Listed in the order a release must touch them: the e-mail list first (access ends at once),
the external Service last (its Session reference is what a claim decides on, so it is the
marker that says "this instance still needs releasing" until everything else is clean).
"""

from __future__ import annotations

from enum import Enum

from warmpool.pool import naming


class Part(Enum):
    EMAIL_CONFIGMAP = ("v1", "ConfigMap", "email")
    PROXY_CONFIGMAP = ("v1", "ConfigMap", "proxy")
    DEPLOYMENT = ("apps/v1", "Deployment", None)
    INTERNAL_SERVICE = ("v1", "Service", "int")
    EXTERNAL_SERVICE = ("v1", "Service", None)
    # Not one of the five: the holder's own HTTPRoute (session-lifecycle §1), owned by the
    # Session and named after its uid, which the instance's plan creates, converges and
    # deletes under the instance's lease like the rest.
    ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute", "route")
    # Nor this: the shared Ingress of upstream Theia Cloud (session-lifecycle §4), whose rule
    # for the instance the plan adds and removes.
    INGRESS = ("networking.k8s.io/v1", "Ingress", "ingress")

    def __init__(self, api_version: str, kind: str, ident: str | None) -> None:
        self.api_version = api_version
        self.kind = kind
        self.ident = ident

    def object_name(self, appdef_spec_name: str, appdef_uid: str, instance: int) -> str:
        assert self not in (Part.ROUTE, Part.INGRESS), "not one of the five"
        if self is Part.INTERNAL_SERVICE:
            # The spec's table names the internal Service with the suffix form ("…-int").
            return naming.create_name_with_suffix(appdef_spec_name, appdef_uid, instance, "int")
        return naming.create_name(appdef_spec_name, appdef_uid, instance, self.ident)

    @property
    def is_service(self) -> bool:
        return self.kind == "Service"


#: The five objects of an instance, in release order.
PARTS: tuple[Part, ...] = (Part.EMAIL_CONFIGMAP, Part.PROXY_CONFIGMAP, Part.DEPLOYMENT,
                           Part.INTERNAL_SERVICE, Part.EXTERNAL_SERVICE)

#: The object kinds of the five, (apiVersion, kind), each once: what is listed and watched to
#: see every pool object. Services first, ConfigMaps last (the five in reverse), the order
#: every lister and watcher of them has always used.
POOL_KINDS: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys((p.api_version, p.kind) for p in reversed(PARTS)))
#: Their kinds alone ("Service", "Deployment", "ConfigMap"): what a watch event names.
POOL_KIND_NAMES: tuple[str, ...] = tuple(kind for _, kind in POOL_KINDS)
