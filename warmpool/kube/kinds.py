"""Which kinds the controller needs the API server to serve, for the settings it runs with.

A watch of a kind the server does not serve never finishes its first list: the cache would
never be ready and the scheduler never resync, with nothing said. So `warmpool worker` and
`warmpool scheduler` check these at start (`warmpool.cli.config.check_servers`) and exit with
one line naming what is missing; a kind that is optional is detected instead (`optional`).
"""

from __future__ import annotations

from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings

#: (apiVersion, kind, what to do when it is missing)
Kind = tuple[str, str, str]


def required(settings: PoolSettings) -> list[Kind]:
    kinds: list[Kind] = [
        (v.APPDEF_API_VERSION, v.APPDEF_KIND, "install Theia Cloud's CRDs (deploy/base/crds)"),
        (v.SESSION_API_VERSION, v.SESSION_KIND, "install Theia Cloud's CRDs (deploy/base/crds)"),
    ]
    if settings.routing:
        kinds.append((v.ROUTE_API_VERSION, v.ROUTE_KIND,
                      "WARMPOOL_ROUTES=httproute needs the Gateway API's HTTPRoute CRD (installed "
                      "with the cluster's Gateway API implementation); or set WARMPOOL_ROUTES to "
                      "ingress or none"))
    return kinds


#: Served only where warmpool's own CRD is installed: without it, no scheduled pool sizes.
SCHEDULES: Kind = (v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND,
                   "apply deploy/base/crds/poolschedules.yaml for scheduled pool sizes")
