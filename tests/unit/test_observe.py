"""Grouping listed pool objects into instances (pure: no server)."""

from __future__ import annotations

import copy

from tests.unit.pool_fixtures import appdef, instance, session
from warmpool.kube.observe import group_pool
from warmpool.pool.parts import PARTS


def _listed(*views):
    """The objects of `views` as a namespace list returns them: kind filled in, unordered."""
    out = []
    for view in views:
        for part, obj in view.existing():
            item = copy.deepcopy(obj)
            item.setdefault("kind", part.kind)
            out.append(item)
    return out


def _strip_appdef_refs(objects):
    """What the garbage collector does once the AppDefinition is gone."""
    for obj in objects:
        meta = obj["metadata"]
        meta["ownerReferences"] = [r for r in meta.get("ownerReferences") or []
                                   if r["kind"] != "AppDefinition"]
    return [o for o in objects if o["metadata"]["ownerReferences"]]


def test_with_the_appdefinition_objects_are_found_by_their_exact_names() -> None:
    a = appdef(min_instances=2)
    s = session(instance=1, status="HANDLED")
    pool = group_pool(_listed(instance(a, 1, holder=s), instance(a, 2)), "java", a, [s])
    assert sorted(pool) == [1, 2]
    assert all(pool[k].get(p) is not None for k in (1, 2) for p in PARTS)


def test_a_deleted_appdefinitions_held_instance_is_found_by_its_holders_reference() -> None:
    """Finding 3 of the chaos work: after the GC the Session's reference is all that is left."""
    a = appdef(min_instances=2)
    s = session(instance=1, status="HANDLED")
    left = _strip_appdef_refs(_listed(instance(a, 1, holder=s), instance(a, 2)))
    assert len(left) == len(PARTS)  # the free instance went with its AppDefinition

    pool = group_pool(left, "java", None, [s])
    assert sorted(pool) == [1]
    assert all(pool[1].get(p) is not None for p in PARTS)


def test_a_session_of_another_appdefinition_does_not_pull_its_objects_in() -> None:
    a = appdef(min_instances=1)
    other = session(name="other", instance=1, status="HANDLED", appdef_name="python")
    left = _strip_appdef_refs(_listed(instance(a, 1, holder=other)))
    assert group_pool(left, "java", None, [other]) == {}
    assert sorted(group_pool(left, "python", None, [other])) == [1]
