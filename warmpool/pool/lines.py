"""Which Theia Cloud line a cluster runs, read from what its API server serves (pure).

Two lines of Theia Cloud are in use, and a cluster has the CRDs of exactly one:

- upstream (eclipse-theia/theia-cloud, chart theia-cloud-crds 1.x): AppDefinition v1beta10
  (storage; v1beta9 and v1beta8 also served), Session v1beta8, routing through one shared
  Ingress;
- the EduIDE-Cloud fork (and warmpool's own CRDs in warmpool/kube/crds, which copy its
  versions): AppDefinition v1beta11, Session v1beta8, routing through HTTPRoutes.

warmpool installs neither: it reads each kind at the version the cluster prefers among those it
knows (`choose_version`), so it runs on either without replacing a CRD that every live Session
of the cluster is stored under. `TheiaLine` is that choice; `warmpool.kube.api.Kube` makes it
once per cluster from the discovery API and sends every read, watch and write of a Theia Cloud
kind at its version. What differs between the versions it knows is in the README ("Theia
Cloud lines"): the model (`warmpool.pool.model`) reads the union of their fields, and a field
a version lacks is simply absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warmpool.pool import vocabulary as v

#: The versions of each Theia Cloud kind whose fields the model reads, newest first. v1beta8 of
#: AppDefinition is not among them: its spec.timeout is an object ({strategy, limit}), read
#: nowhere here; a cluster serving only that is refused with a message (`missing_advice`).
KNOWN: Mapping[str, tuple[str, ...]] = {
    v.APPDEF_KIND: ("v1beta11", "v1beta10", "v1beta9"),
    v.SESSION_KIND: ("v1beta8",),
}
#: The AppDefinition version only the EduIDE-Cloud fork serves (it adds spec.sidecars).
FORK_APPDEF_VERSION = "v1beta11"


@dataclass(frozen=True, slots=True)
class TheiaLine:
    """The version of each Theia Cloud kind warmpool uses on one cluster."""

    appdefinition: str
    session: str

    def version_of(self, kind: str) -> str | None:
        return {v.APPDEF_KIND: self.appdefinition, v.SESSION_KIND: self.session}.get(kind)

    @property
    def fork(self) -> bool:
        """The EduIDE-Cloud fork's line (or warmpool's own CRDs, which copy it)."""
        return self.appdefinition == FORK_APPDEF_VERSION

    @property
    def name(self) -> str:
        return "EduIDE-Cloud fork" if self.fork else "upstream Theia Cloud"

    def describe(self) -> str:
        return (f"{self.name}: AppDefinition {v.GROUP}/{self.appdefinition}, "
                f"Session {v.GROUP}/{self.session}")


#: What warmpool's own CRDs (warmpool/kube/crds) serve, and the versions the vocabulary names.
OWN = TheiaLine(appdefinition=v.APPDEF_API_VERSION.rpartition("/")[2],
                session=v.SESSION_API_VERSION.rpartition("/")[2])


def choose_version(kind: str, versions: Sequence[str],
                   kinds_by_version: Mapping[str, Sequence[str]]) -> str | None:
    """The version `kind` is read at: the first of the group's `versions` (the discovery API's
    order, which is the API server's priority order: its preferred version first) that serves
    `kind` and that warmpool knows. None: no version warmpool knows serves it.

    Per kind, not the group's one preferred version: in upstream's group the preferred version
    is v1beta10, which serves AppDefinition but no Session."""
    known = KNOWN.get(kind, ())
    for version in versions:
        if version in known and kind in kinds_by_version.get(version, ()):
            return version
    return None


def choose_line(versions: Sequence[str],
                kinds_by_version: Mapping[str, Sequence[str]]) -> TheiaLine | None:
    """The line for a group that serves `versions` (priority order) with these kinds; None when
    AppDefinition or Session is served at no version warmpool knows."""
    appdef = choose_version(v.APPDEF_KIND, versions, kinds_by_version)
    session = choose_version(v.SESSION_KIND, versions, kinds_by_version)
    if appdef is None or session is None:
        return None
    return TheiaLine(appdefinition=appdef, session=session)


def missing_advice(kind: str, versions: Sequence[str],
                   kinds_by_version: Mapping[str, Sequence[str]]) -> str:
    """What to tell a person whose cluster serves `kind` at no version warmpool reads. Never
    to install warmpool's own CRDs over the cluster's: replacing a Theia Cloud CRD rewrites
    the schema every live AppDefinition and Session is stored under."""
    served = [ver for ver in versions if kind in kinds_by_version.get(ver, ())]
    known = ", ".join(KNOWN.get(kind, ()))
    if not served:
        return (f"the cluster serves no {kind} ({v.GROUP}): install Theia Cloud first (its Helm "
                "chart theia-cloud-crds, or the EduIDE-Cloud fork's), then start warmpool; "
                "warmpool never installs or replaces Theia Cloud's CRDs on a cluster")
    return (f"the cluster serves {kind} only at {', '.join(served)}, and this warmpool reads "
            f"{kind} at {known}: upgrade Theia Cloud, or run a warmpool that knows "
            f"{served[0]}; do not replace the cluster's CRDs with warmpool's")


def default_routes(line: TheiaLine, httproute_served: bool) -> tuple[str, str]:
    """(WARMPOOL_ROUTES's value when it is unset, why): what the install routes with.

    The fork's install routes each Session through its own HTTPRoute under a shared one
    (session-lifecycle §1); upstream's routes through one shared Ingress (§4), whether or not
    a Gateway API CRD happens to be installed for something else. A fork install without the
    HTTPRoute CRD can route by nothing but an Ingress."""
    if line.fork and httproute_served:
        return "httproute", f"{line.name}'s routing: an HTTPRoute per Session"
    if line.fork:
        return "ingress", (f"{line.name}, but the cluster serves no HTTPRoute: Theia Cloud's "
                           "shared Ingress")
    return "ingress", f"{line.name}'s routing: Theia Cloud's shared Ingress"
