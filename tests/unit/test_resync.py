"""The resync's filter (`warmpool.controller.reconcile._has_work`): an instance whose own job
would find nothing to do is not queued; one with work, or with a Session the read does not
know, is. For an invalid AppDefinition (`_releases_due`): only the releases that are due."""

from __future__ import annotations

from tests.unit.pool_fixtures import SETTINGS, appdef, instance, session
from warmpool.controller.reconcile import _has_work, _releases_due
from warmpool.keys import InstanceKey, PoolKey
from warmpool.pool.model import Invalid
from warmpool.pool.parts import Part

KEY = PoolKey("ns", "java")


class NoOtherHoldings:
    def referencing(self, namespace: str, appdef_name: str, s: object, *,
                    fresh: bool = False) -> frozenset[int]:
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


class InvalidPool(NoOtherHoldings):
    """A reader of one pool whose AppDefinition is invalid: its instances and Sessions."""

    def __init__(self, views, sessions) -> None:  # type: ignore[no-untyped-def]
        self.views, self.live = {v.id: v for v in views}, list(sessions)

    def sessions(self, namespace: str, appdef_name: str):  # type: ignore[no-untyped-def]
        return self.live

    def session_routes(self, namespace: str) -> list[object]:
        return []

    def pool(self, namespace, appdef_name, appdef, sessions):  # type: ignore[no-untyped-def]
        assert appdef is None  # read by owner references: the spec gives no names
        return self.views


def test_an_invalid_pool_queues_its_due_releases_and_nothing_else() -> None:
    """Issue #27: the resync of an invalid AppDefinition is refused, but the instances a
    release is due on are queued; a held, a free and an above-minInstances one are not."""
    a = appdef(min_instances=1)
    holder = session("s1", instance=1, status="HANDLED")
    gone = session("gone", instance=2, status="HANDLED", deleting=True)
    views = [instance(a, 1, holder=holder), instance(a, 2, holder=gone), instance(a, 3),
             instance(a, 9)]
    due = _releases_due(InvalidPool(views, [holder, gone]), KEY,  # type: ignore[arg-type]
                        Invalid("spec.image is missing"), SETTINGS)
    assert due == [InstanceKey("ns", "java", 2)]
