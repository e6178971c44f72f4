"""A retirement decided on a stale read must not delete a held instance's objects when the
external Service, its guard, has vanished meanwhile (docs/reliability.md, finding 20).

A free instance above minInstances is retired by deleting its external Service first, at the
resourceVersion read: a claim since then changed the Service, so the server refuses the
delete and the plan stops. That guard fails open when someone else deleted the Service in
between (by hand, or the chaos tier): the delete finds nothing (404), and the plan went on to
delete the other four objects at the versions it read, which a cache whose Service watch lags
its ConfigMap watch holds as they are now, references to the holder and all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tests.pool_world import held_instance, instance_objects
from warmpool.controller.guard import LocalLeases
from warmpool.controller.reconcile import reconcile_instance
from warmpool.controller.sequential import run_until_quiet
from warmpool.keys import InstanceKey
from warmpool.kube.api import Kube
from warmpool.kube.reader import LiveReader
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.instances import InstanceView
from warmpool.pool.model import AppDefinition, Session
from warmpool.pool.parts import Part
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec

SETTINGS = PoolSettings(url_probe=False)


class _ServiceWatchLags(LiveReader):
    """The API server, except that a cached (non-fresh) read of the instance shows its
    external Service as `stale` had it: a worker whose Service watch has not yet brought the
    claim's reference, nor the Service's deletion since."""

    def __init__(self, kube: Kube, stale: dict) -> None:
        super().__init__(kube, routes=SETTINGS.routing)
        self.stale = stale
        self.fresh_reads = 0

    def instance(self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
                 k: int, sessions: Sequence[Session], *, fresh: bool = False) -> InstanceView:
        view = super().instance(namespace, appdef_name, appdef, k, sessions, fresh=fresh)
        if fresh:
            self.fresh_reads += 1
            return view
        return dataclasses.replace(
            view, objects={**view.objects, Part.EXTERNAL_SERVICE: self.stale})


def test_a_retirement_whose_guarding_service_vanished_reads_again_before_deleting(
    kube: Kube, namespace: str
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=1, max_instances=1)
    run_until_quiet(kube, ns, SETTINGS)
    ext_key = next(key for key in instance_objects(kube, ns, "java", 1)
                   if key.startswith("Service/") and not key.endswith("-int"))
    ext_name = ext_key.partition("/")[2]
    free_service = kube.get("v1", "Service", ns, ext_name)
    assert free_service is not None

    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns, SETTINGS)
    assert held_instance(kube, ns, "s1") == 1
    # Instance 1 is now above minInstances, and its external Service is deleted by hand.
    patch_appdef_spec(kube, ns, "java", minInstances=0)
    kube.delete("v1", "Service", ns, ext_name)
    held = {key: obj["metadata"]["uid"]
            for key, obj in instance_objects(kube, ns, "java", 1).items()}
    assert ext_key not in held and len(held) == 4, held

    reader = _ServiceWatchLags(kube, free_service)
    key = InstanceKey(ns, "java", 1)
    with LocalLeases().try_lease(str(key)) as guard:
        assert guard is not None
        result = reconcile_instance(reader, kube, key, guard, SETTINGS)

    # The stale read said "free, above minInstances": retire. The Service's delete found
    # nothing, so the plan was decided again on the server's view, where the other four
    # objects name s1: nothing of s1's was deleted, and its Service was made again.
    after = instance_objects(kube, ns, "java", 1)
    assert {key: after[key]["metadata"]["uid"] for key in held if key in after} == held
    assert reader.fresh_reads >= 1
    assert result.record.plan is not None and result.record.plan.holder is not None
    assert result.record.plan.holder.name == "s1"
    svc = after[ext_key]
    assert any(r.get("kind") == v.SESSION_KIND and r.get("name") == "s1"
               for r in svc["metadata"].get("ownerReferences", []))
