"""The resync's filter (`warmpool.controller.reconcile._has_work`): an instance whose own job
would find nothing to do is not queued; one with work, or with a Session the read does not
know, is."""

from __future__ import annotations

from tests.unit.pool_fixtures import SETTINGS, appdef, instance, session
from warmpool.controller.reconcile import _has_work
from warmpool.keys import PoolKey
from warmpool.pool.parts import Part

KEY = PoolKey("ns", "java")


class NoOtherHoldings:
    def referencing(self, namespace: str, appdef_name: str, s: object) -> frozenset[int]:
        return frozenset()


def has_work(view, sessions, a=None) -> bool:  # type: ignore[no-untyped-def]
    a = a or appdef(min_instances=3)
    return _has_work(NoOtherHoldings(), KEY, a, view, sessions, None,  # type: ignore[arg-type]
                     SETTINGS)


def test_a_converged_free_or_claimed_instance_has_no_work() -> None:
    a = appdef(min_instances=3)
    s1 = session("s1", instance=2, status="HANDLED")
    assert not has_work(instance(a, 1), [s1], a)
    assert has_work(instance(a, 2, holder=s1), [], a) is True  # a holder the read lacks
    claimed = instance(a, 2, holder=s1)
    # HANDLED with its annotation and every object owned: nothing to do.
    assert not has_work(claimed, [s1], a)


def test_missing_objects_an_outdated_generation_or_an_id_above_min_are_work() -> None:
    a = appdef(min_instances=3)
    assert has_work(instance(a, 1, missing=(Part.EMAIL_CONFIGMAP,)), [], a)
    assert has_work(instance(appdef(min_instances=3, generation=2), 1), [],
                    appdef(min_instances=3, generation=3))
    assert has_work(instance(a, 4), [], a)  # free above minInstances: retire it


def test_a_deleted_holders_instance_is_a_release_to_run() -> None:
    a = appdef(min_instances=3)
    gone = session("gone", instance=1, status="HANDLED")
    assert has_work(instance(a, 1, holder=gone), [], a)
