"""Which kinds the controller needs the API server to serve, for the settings it runs with.

A watch of a kind the server does not serve never finishes its first list: the cache would
never be ready and the scheduler never resync, with nothing said. So `warmpool worker` and
`warmpool scheduler` check these at start (`warmpool.config.check_servers`) and exit with
one line naming what is missing; a kind that is optional is detected instead (`optional`).

Theia Cloud's kinds are checked at whatever version the cluster's line serves them
(`Kube.served_api_version`); where none is served, the advice comes from
`warmpool.pool.lines.missing_advice`, and it never is to install warmpool's copies of Theia
Cloud's CRDs over the cluster's (that would rewrite the schema every live Session is stored
under).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from warmpool.kube.api import Kube
from warmpool.pool import lines
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import ROUTES_SETTING, PoolSettings
from warmpool.pool.parts import PARTS

#: (apiVersion, kind, what to do when it is missing)
Kind = tuple[str, str, str]

#: Said where the cluster serves no Theia Cloud kind at all (the check itself asks discovery
#: for the precise advice: `warmpool.pool.lines.missing_advice`).
THEIA_ADVICE = ("install Theia Cloud first (its Helm chart theia-cloud-crds); warmpool never "
                "installs or replaces Theia Cloud's CRDs on a cluster")


def theia() -> list[Kind]:
    """Theia Cloud's kinds warmpool reads and writes (the version named is the vocabulary's;
    the one checked and used is the cluster's line)."""
    return [(v.APPDEF_API_VERSION, v.APPDEF_KIND, THEIA_ADVICE),
            (v.SESSION_API_VERSION, v.SESSION_KIND, THEIA_ADVICE)]


def required(settings: PoolSettings) -> list[Kind]:
    kinds = theia()
    if settings.routing:
        kinds.append((v.ROUTE_API_VERSION, v.ROUTE_KIND,
                      "WARMPOOL_ROUTES=httproute needs the Gateway API's HTTPRoute CRD (installed "
                      "with the cluster's Gateway API implementation); or set WARMPOOL_ROUTES to "
                      "ingress or none"))
    return kinds


def used_by_jobs(settings: PoolSettings) -> list[tuple[str, str]]:
    """Every (apiVersion, kind) a job reads or writes under `settings`: what a worker looks up
    before it takes jobs (`Kube.resolve`), so that no claim waits for discovery."""
    pairs = [(api_version, kind) for api_version, kind, _ in required(settings)]
    pairs += [(p.api_version, p.kind) for p in PARTS]
    pairs += [("v1", "Pod"), ("apps/v1", "ReplicaSet"), ("v1", "Event"), SCHEDULES[:2]]
    if settings.ingress:
        pairs.append(("networking.k8s.io/v1", "Ingress"))
    return list(dict.fromkeys(pairs))


def settle_routes(kube: Kube, settings: PoolSettings, environ: Mapping[str, str]
                  ) -> tuple[PoolSettings, str]:
    """(`settings` with the routing the install has when WARMPOOL_ROUTES is unset, the line
    that says which and why): `warmpool.pool.lines.default_routes`, the fork's HTTPRoutes or
    upstream's shared Ingress. A value that is set is kept. A cluster whose line cannot be read
    keeps `settings`: the start-up check then says what is missing. The roles state the line
    at start, so an operator reads which routing runs without reading the code."""
    line = kube.line()
    shown = line.describe() if line is not None else "Theia Cloud not found"
    if environ.get(ROUTES_SETTING, "").strip():
        return settings, f"routing: {settings.routes} ({ROUTES_SETTING} is set; {shown})"
    if line is None:
        return settings, f"routing: {settings.routes} ({shown})"
    routes, why = lines.default_routes(line, kube.serves(v.ROUTE_API_VERSION, v.ROUTE_KIND))
    return (replace(settings, routes=routes),
            f"routing: {routes} ({ROUTES_SETTING} unset: {why}; {shown})")


#: Served only where warmpool's own CRD is installed: without it, no scheduled pool sizes.
SCHEDULES: Kind = (v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND,
                   "apply deploy/base/crds/poolschedules.yaml for scheduled pool sizes")
