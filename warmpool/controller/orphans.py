"""The sweep of a namespace's pool objects that nothing owns (a `SweepKey`'s job).

The scheduler queues it for an event of a pool object with no AppDefinition or Session
reference, and at each resync for every namespace where its caches hold such an object. The
decision is `warmpool.pool.orphans`;
this reads and writes:

1. the candidates from the reader (the cache: a scan, no request), which may be stale;
2. only when there is one: the namespace's AppDefinitions and Sessions from the API server
   (two LISTs). A cache's answer is not enough for a deletion here: an object named for an
   AppDefinition the cache has not seen yet would look like garbage; the server's "no
   AppDefinition has that uid" is final, because a uid never comes back;
3. each deletion with the object's uid and resourceVersion as preconditions: an owner
   reference, label or annotation written since the candidate was read (a claim, a hand's
   repair) makes it a 409 and the object stays; a 404 means someone deleted it first.

An ownerless object of a living AppDefinition is handed to its instance's job (a follow-up),
which puts the reference back. One a live Session may hold is left, with a Warning naming it.
"""

from __future__ import annotations

import contextlib
import logging

from warmpool.controller.guard import Unguarded
from warmpool.controller.result import FollowUp, Outcome, Result
from warmpool.keys import InstanceKey, SweepKey
from warmpool.kube import observe
from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.kube.executor import Executor
from warmpool.kube.reader import Reader
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.meta import meta_of
from warmpool.pool.orphans import Obj, decide_orphans, ownerless
from warmpool.pool.parts import Part

log = logging.getLogger(__name__)


def sweep_orphans(reader: Reader, kube: Kube, key: SweepKey) -> Result:
    """Delete the namespace's ownerless pool objects whose AppDefinition is gone; queue the
    instances of those whose AppDefinition lives."""
    ns = key.namespace
    candidates = ownerless(
        (part, obj) for obj in reader.pool_objects(ns)
        if (part := observe.classify(obj)) is not None)
    if not candidates:
        return Result(Outcome.SWEPT)
    appdefs, _ = kube.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns)
    plan = decide_orphans(candidates, appdefs, observe.list_sessions(kube, ns))
    executor = Executor(kube, ns, Unguarded(), sink=reader)
    deleted = 0
    for action in plan.deletes:
        # Changed since it was read (409) or already gone (404): the next sweep looks again.
        with contextlib.suppress(Conflict, KubeError):
            executor.apply([action])
            deleted += 1
            log.info("deleted %s %s/%s: %s", action.part.kind, ns, action.name, action.why)
    for name, why in plan.kept:
        executor.apply([Report(
            "OwnerlessObject", f"{name} has no owner and its AppDefinition is gone; left: {why}",
            regarding=_regarding(candidates, name))])
    follow_ups: list[FollowUp] = [
        (InstanceKey(ns, appdef, k), None) for appdef, k in sorted(set(plan.instances))]
    return Result(Outcome.SWEPT, follow_ups,
                  message=f"{deleted} deleted, {len(plan.instances)} to their instance's job, "
                          f"{len(plan.kept)} left")


def _regarding(candidates: list[tuple[Part, Obj]], name: str) -> dict[str, str]:
    part = next(p for p, obj in candidates if meta_of(obj).get("name") == name)
    return {"kind": part.kind, "name": name, "apiVersion": part.api_version}
