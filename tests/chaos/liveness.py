"""What must happen soon, not only eventually: valid Sessions served, ended ones revoked.

The quiet checks (checks.py) say where the system must end up; the invariants (watchdog.py)
what must never be seen. Neither notices a system that stalls while the operations go on (a
queue whose every job raises, a pool that refuses every claim): the settle phase would, but
only after `settle_timeout`, and without saying since when or why. This check does, at every
watchdog poll, for three obligations:

- serve: a live, valid Session of a valid AppDefinition (not being deleted) whose pool has room
  (fewer of its instances held by live Sessions than maxInstances: a claim past the free
  instances makes one) holds an instance;
- revoke the allow-list: an instance that no live Session holds (its holder ended, or its
  user changed) has an empty allow-list, so the ended user's login no longer passes its proxy;
- revoke the route: a Session's HTTPRoute exists only while that Session holds an instance.

"Holds" is read as the invariant checker reads it (`HolderIndex`: the external Service's
owner reference, the claimed-for annotation), from the same consistent snapshot, with a hostile
instance-id annotation masked (tests/chaos/hostile.py). Each obligation must be met within
L = `ChaosConfig.liveness_bound` seconds of fault-free time from when it arose: the time a
blocking fault (an outage, a dead leader, an emptied Redis, and their tails) made progress
impossible does not count, nor the time a hostile edit about that Session, instance or pool
was in effect (`HostileEdits.touching`); the delay of a lagging worker's watches is added to L
while it lasts. Hostile edits elsewhere do not stop the clock: an edit that stalls every job
(a fence that poisons the shared counter) is reported here, with the edits before it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from tests.chaos.config import ChaosConfig
from tests.chaos.history import History
from tests.chaos.world import World
from warmpool.kube import observe
from warmpool.pool import routes
from warmpool.pool.instances import HolderIndex, emails_of
from warmpool.pool.model import AppDefinition, parse_session, session_error
from warmpool.pool.parts import Part
from warmpool.pool.validate import validate_appdefinition

if TYPE_CHECKING:
    from tests.chaos.faults import FaultInjector
    from tests.chaos.hostile import Edit, HostileEdits

Key = tuple[str, str, str]  # (namespace, obligation, what)


def obligations(world: World, namespaces: list[str]) -> dict[Key, tuple[str, str]]:
    """Every obligation not met in `world`: key -> (report text, pool)."""
    out: dict[Key, tuple[str, str]] = {}
    for ns in namespaces:
        items = world.appdefs[ns]
        appdefs: dict[str, AppDefinition | None] = {}
        for item in items:
            parsed = validate_appdefinition(item, items)
            appdefs[item["metadata"]["name"]] = (parsed if isinstance(parsed, AppDefinition)
                                                 else None)
        sessions = [parse_session(o) for o in world.sessions[ns]]
        names = set(appdefs) | {s.appdef for s in sessions if s.appdef}
        held: set[str] = set()  # uids of the live Sessions that hold an instance
        for name in sorted(names):
            appdef = appdefs.get(name)
            mine = [s for s in sessions if s.appdef == name]
            index = HolderIndex(name, mine)
            held_here = 0
            for k, inst in sorted(observe.group_pool(world.objects[ns], name, appdef,
                                                     mine).items()):
                top = index.of(inst)
                if top:
                    held.add(top[0].uid)
                    held_here += 1
                    continue
                email = inst.get(Part.EMAIL_CONFIGMAP)
                if email is not None and emails_of(email).strip():
                    cm = email["metadata"]["name"]
                    out[(ns, "revoke", cm)] = (
                        f"{ns}: liveness: allow-list {cm} of instance {k} of {name} still "
                        "names a user while no live Session holds the instance", name)
            if appdef is None or appdef.deleting:
                continue
            for s in mine:
                if (s.live and s.uid not in held and session_error(s) is None
                        and held_here < appdef.max_instances):
                    out[(ns, "serve", s.uid)] = (
                        f"{ns}: liveness: Session {s.name} of {name} is not served while "
                        f"{held_here} of its maxInstances={appdef.max_instances} are held", name)
        by_uid = {s.uid: s for s in sessions}
        for route in world.routes[ns]:
            if not routes.is_session_route(route):
                continue
            uid = routes.session_uid_of(route)
            if uid not in held:
                rname = route["metadata"]["name"]
                ended = by_uid.get(uid)
                who = (f"Session {ended.name}" if ended is not None
                       else f"a deleted Session ({uid[:8]})")
                out[(ns, "route", rname)] = (
                    f"{ns}: liveness: route {rname} of {who} still exists while that Session "
                    "holds no instance", ended.appdef if ended is not None else "")
    return out


class Liveness:
    """Tracks the obligations poll to poll; reports one not met within L fault-free seconds."""

    def __init__(self, namespaces: list[str], cfg: ChaosConfig, history: History,
                 faults: FaultInjector, hostile: HostileEdits | None,
                 violate: Callable[[str, str], None]) -> None:
        self.namespaces, self.cfg, self.history = namespaces, cfg, history
        self.faults, self.hostile, self.violate = faults, hostile, violate
        self.pending: dict[Key, tuple[float, str, str]] = {}  # key -> (first seen, text, pool)
        self.met: Counter[str] = Counter()  # obligations met, by kind
        self.longest: dict[str, float] = {}  # kind -> longest fault-free wait until met
        self._reported: set[Key] = set()

    def _excused(self, key: Key, text: str, pool: str) -> list[Edit]:
        """The hostile edits whose windows do not count for this obligation: those about its
        Session, instance or route, and for a Session waiting, any about its pool."""
        if self.hostile is None:
            return []
        about = self.hostile.touching(text)
        if key[1] == "serve" and pool:
            about += [e for e in self.hostile.snapshot()
                      if e.ns == key[0] and e.pool == pool and e not in about]
        return about

    def _fault_free(self, key: Key, first: float, now: float, text: str, pool: str) -> float:
        took = (now - first) - self.faults.blocked(first, now)
        if self.hostile is not None:
            took -= self.hostile.covered(self._excused(key, text, pool), first, now)
        return max(0.0, took)

    def poll(self, world: World, now: float) -> None:
        current = obligations(world, self.namespaces)
        for key, (text, pool) in current.items():
            self.pending.setdefault(key, (now, text, pool))
        for key in list(self.pending):
            first, text, pool = self.pending[key]
            took = self._fault_free(key, first, now, text, pool)
            if key not in current:
                del self.pending[key]
                self.met[key[1]] += 1
                self.longest[key[1]] = max(self.longest.get(key[1], 0.0), took)
                continue
            bound = self.cfg.liveness_bound + self.faults.slack(first, now)
            if took > bound and key not in self._reported:
                self._reported.add(key)
                context = self.hostile.context(text, first) if self.hostile else ""
                self.violate(text, f" (for {now - first:.1f}s, {took:.1f}s of it fault-free; "
                             f"bound {bound:g}s){context}")

    def summary(self) -> str:
        kinds = ("serve", "revoke", "route")
        return ("obligations met: " + ", ".join(f"{k} {self.met[k]}" for k in kinds)
                + "; longest fault-free wait: " + ", ".join(
                    f"{k} {self.longest.get(k, 0.0):.1f}s" for k in kinds)
                + f" (bound L = {self.cfg.liveness_bound:g}s); unmet now: {len(self.pending)}")
