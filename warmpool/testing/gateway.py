"""The shared HTTPRoute an installation's Helm chart creates, for the demo, tests and benchmarks.

Theia Cloud's chart makes one route per installation (`gateway.instancesRouteName`), which
each AppDefinition names in `spec.ingressname`: parentRefs and hostnames, on purpose no rules
(session-lifecycle §1). The controller only reads it; without it, no Session is claimed.
"""

from __future__ import annotations

from typing import Any

from warmpool.kube.api import Conflict, Kube
from warmpool.pool import vocabulary as v

GATEWAY = "theia-cloud-gateway"


def ensure_shared_route(
    kube: Kube, namespace: str, name: str, *, hostnames: tuple[str, ...],
    gateway: str = GATEWAY,
) -> dict[str, Any]:
    """The route `name` of `namespace`, created as Helm would if it does not exist."""
    existing = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, namespace, name)
    if existing is not None:
        return existing
    try:
        return kube.create({
            "apiVersion": v.ROUTE_API_VERSION, "kind": v.ROUTE_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": [{"name": gateway, "namespace": namespace}],
                     "hostnames": list(hostnames)},
        })
    except Conflict:  # made meanwhile by another caller
        found = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, namespace, name)
        assert found is not None
        return found
