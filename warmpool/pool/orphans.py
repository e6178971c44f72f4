"""Pool objects that nothing owns: which to delete, which to hand to their instance's job.

Every pool object has an owner: its AppDefinition while free, its Session while held (I4).
The garbage collector deletes an object once all its owners are gone, and ignores an object
that has none. One can be left with none when a foreign owner reference (added by hand, or by
another tool) kept it alive through its AppDefinition's deletion and was then removed: the
garbage collector had stripped the dangling AppDefinition reference meanwhile, as it must
(reliability.md, finding 18). Or a reference was removed by hand while the AppDefinition
lives. Nothing else would ever look at such an object again: the scheduler maps a pool
object's events by its owner references, and a resync by the AppDefinitions that exist.

The decision here is pure; `warmpool.controller.orphans` reads and writes. Which pool an
object belongs to is read from its name, which the controller chose at creation and nobody
can change: it ends in the last 12 characters of its AppDefinition's uid (`naming`), and a
uid never comes back, so "no AppDefinition has that uid" is final. Labels and annotations
anyone may write are read only to keep an object (never to delete one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Delete
from warmpool.pool.meta import annotations_of, labels_of, meta_of, owner_refs
from warmpool.pool.model import Session
from warmpool.pool.parts import Part

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class OrphanPlan:
    """What the sweep does: `deletes` (each on the object's uid and resourceVersion),
    `instances` (AppDefinition name, id) whose own job puts the owner back, and `kept` (name,
    why) that a live Session may still hold, reported and left."""

    deletes: list[Delete] = field(default_factory=list)
    instances: list[tuple[str, int]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)


def ownerless(objects: Iterable[tuple[Part, Obj]]) -> list[tuple[Part, Obj]]:
    """The pool objects (one of the five, by name) without any owner reference."""
    return [(part, obj) for part, obj in objects
            if not owner_refs(obj)
            and naming.instance_id_from_name(str(meta_of(obj).get("name") or "")) is not None]


def _has_uid_segment(name: str, uid: str) -> bool:
    """Whether `name` carries `uid`'s short form as one of its `-`-separated segments (the
    segment `naming.create_name` and `create_name_with_suffix` put there)."""
    short = naming.short_uid(uid)
    return bool(short) and re.search(rf"-{re.escape(short)}(?:-|$)", name) is not None


def _claimed_by(obj: Obj) -> set[str]:
    """The Session uids an object's own labels and annotations name (anyone may write these:
    read only to keep an object)."""
    out = {str(labels_of(obj).get(v.LABEL_SESSION_UUID) or "")}
    claimed_for = str(annotations_of(obj).get(v.ANNOTATION_CLAIMED_FOR) or "")
    out.add(claimed_for.partition("/")[0])
    return out - {""}


def decide_orphans(
    candidates: Iterable[tuple[Part, Obj]],
    appdefs: Sequence[Obj],
    sessions: Sequence[Session],
) -> OrphanPlan:
    """The plan for ownerless pool objects, given the namespace's AppDefinitions and
    Sessions as the server has them (the caller reads both from the server: see
    `warmpool.controller.orphans` for why a cache's answer is not enough here).

    - An object whose name carries a living AppDefinition's uid is that instance's: its job
      puts the missing reference back (or retires the instance).
    - Otherwise its AppDefinition is gone for good. It is deleted, unless a live Session may
      hold it: a live Session's uid in its labels or claimed-for annotation, or a live
      Session annotated with its id whose AppDefinition does not exist either (an instance
      of a deleted AppDefinition stays with its holder until the Session ends). Those are
      kept, and said.
    """
    living = [(str(meta_of(a).get("name") or ""), str(meta_of(a).get("uid") or ""))
              for a in appdefs]
    existing = {name for name, _ in living}
    live = [s for s in sessions if s.live]
    plan = OrphanPlan()
    for part, obj in ownerless(candidates):
        meta = meta_of(obj)
        name = str(meta.get("name") or "")
        k = naming.instance_id_from_name(name)
        assert k is not None  # ownerless() keeps only names of ours
        owner = next((a for a, uid in living if uid and _has_uid_segment(name, uid)), None)
        if owner is not None:
            plan.instances.append((owner, k))
            continue
        named = _claimed_by(obj)
        holder = next((s for s in live if s.uid in named
                       or (s.instance_id == k and s.appdef not in existing)), None)
        if holder is not None:
            plan.kept.append((name, f"Session {holder.name} may hold it"))
            continue
        plan.deletes.append(Delete(
            part, name, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""),
            "it has no owner and its AppDefinition is gone"))
    return plan
