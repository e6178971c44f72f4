"""What must hold at every moment of a chaos run: the watchdog's polls of consistent
snapshots, the audit of every deletion on a watch, and the I1 reports it excuses."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.chaos.config import ChaosConfig
from tests.chaos.faults import FaultInjector
from tests.chaos.history import History
from tests.chaos.hostile import HostileEdits
from tests.chaos.liveness import Liveness
from tests.chaos.operations import Operations
from tests.chaos.world import PinnedKube, World, live_name, snapshot, violations_in
from warmpool.kube import observe
from warmpool.kube.api import Gone, Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.decide import rightful_instance
from warmpool.pool.instances import is_session_ref, refs
from warmpool.pool.model import Session, parse_session
from warmpool.pool.parts import Part

#: A held instance, as the watchdog tracks it: (namespace, Session uid, instance id, the
#: last 12 characters of its external Service's name).
HeldKey = tuple[str, str, int, str]


class Watchdog:
    """Polls a consistent snapshot; records violations of what must hold at every moment."""

    AUDIT_WAIT = 10.0  # s: longer than the audit's wait for the proxy's record of a delete

    def __init__(self, kube: PinnedKube, namespaces: list[str], cfg: ChaosConfig,
                 history: History, faults: FaultInjector, ops: Operations,
                 hostile: HostileEdits | None = None) -> None:
        self.kube, self.namespaces, self.cfg = kube, namespaces, cfg
        self.history, self.faults, self.ops = history, faults, ops
        self.hostile = hostile
        self.liveness = Liveness(namespaces, cfg, history, faults, hostile, self.violate)
        self.violations: list[str] = []
        self.excusals = Excusals(ops, history)
        self.first_history: list[str] | None = None
        self.polls = 0
        self.poll_errors = 0
        self._pending: dict[str, float] = {}  # I1/I2 damage -> first seen
        self._reported: set[str] = set()
        # (ns, Session uid, k, AppDefinition uid12) -> {kind/name: (uid, has the Session's ref)}
        self._held: dict[HeldKey, dict[str, tuple[str, bool]]] = {}
        self._vanished: dict[str, float] = {}  # uid -> when first missing (AppDefinition gone)
        self._last: World | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def violate(self, text: str, detail: str = "") -> None:
        """Record a violation once (by `text`); the first one freezes the history, so what
        led to it is not pushed out by what followed."""
        if text in self._reported:
            return
        self._reported.add(text)
        if self.hostile is not None and "hostile edits" not in detail:
            detail += self.hostile.context(text, self.history.now())  # what a hand did
        self.violations.append(f"{self.history.now():8.2f}s {text}{detail}")
        self.history.add("VIOLATION", text + detail)
        if self.first_history is None:
            self.first_history = self.history.tail()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.poll):
            try:
                self.poll()
            except Exception as exc:  # the real API server is busy: next time
                self.poll_errors += 1
                if self.poll_errors % 20 == 1:
                    self.history.add("watchdog", f"poll failed: {exc!r}")

    def poll(self) -> World:
        world = snapshot(self.kube, self.namespaces)
        if self.hostile is not None:  # a hostile instance-id is a hint: read the truth
            world = self.hostile.mask(world)
        now = self.history.now()
        self.polls += 1
        current = violations_in(world, self.namespaces, quiet=False)
        damage = set()
        for text in current:
            if self.excusals.classify(text, world):
                continue
            if (": I3:" in text or ": I4:" in text) and not self._hostile_now(text, now):
                self.violate(text, self._context(text, now))
            else:
                damage.add(text)
        for text in damage:
            if text not in self._pending:
                self._pending[text] = now
                self.history.add("damage", text + self._before(text))
        for text in list(self._pending):
            if text not in damage:
                del self._pending[text]
            else:
                first = self._pending[text]
                effective = (now - first) - self.faults.blocked(first, now)
                if self.hostile is not None:  # an edit about it: not repairable meanwhile
                    effective -= self.hostile.covered(self.hostile.touching(text), first, now)
                if effective > self.cfg.missing_grace + self.faults.slack(first, now):
                    self.violate(text, f" (for {now - first:.1f}s, {effective:.1f}s of it "
                                 "fault-free)" + self._context(text, first))
        self._track_uids(world)
        self.liveness.poll(world, now)
        self._last = world
        return world

    def _hostile_now(self, text: str, now: float) -> bool:
        """Whether an I3/I4 report is about a hostile edit in effect or just over: such a
        report is the edit itself (a Session reference added by hand makes two holders, one
        removed by hand leaves no owner), so it is damage, which must clear within the grace
        once the edit is over, not a violation on sight."""
        if self.hostile is None:
            return False
        grace = self.cfg.missing_grace + self.faults.slack(now - self.cfg.missing_grace, now)
        return any(e.window(now)[1] >= now - grace for e in self.hostile.touching(text))

    def _context(self, text: str, first: float) -> str:
        return self.hostile.context(text, first) if self.hostile is not None else ""

    def _still_there(self, ns: str, name: str, uid: str) -> bool:
        """For an object a hostile edit took out of the pool's selector (its generation label
        removed): whether it still exists, unreplaced (then it was not deleted)."""
        if uid not in self.ops.hidden:
            return False
        kind, obj_name = name.split("/", 1)
        api_version = "apps/v1" if kind == "Deployment" else "v1"
        obj = self.kube.get(api_version, kind, ns, obj_name)
        return obj is not None and obj["metadata"].get("uid") == uid

    def _before(self, text: str) -> str:
        """For a held instance's damage: its objects and their owners one poll earlier."""
        m = re.match(r"^(\S+): I1: Session (\S+) holds instance (\d+) of (\S+) but", text)
        if not m or self._last is None:
            return ""
        ns, k = m[1], int(m[3])
        seen = []
        for obj in self._last.objects.get(ns, []):
            name = obj["metadata"]["name"]
            if naming.instance_id_from_name(name) == k:
                owners = ",".join(f"{r.get('kind')}/{r.get('name')}" for r in refs(obj))
                seen.append(f"{obj.get('kind')}/{name}<{owners}>")
        return f" [one poll earlier: {'; '.join(seen) or 'no objects'}]"

    def _track_uids(self, world: World) -> None:
        """From a claim's deciding write (the Session's reference on the external Service) or
        its annotation until the Session ends, no object of its instance is deleted or replaced
        unless the runner deleted it by hand. This covers the claim in flight too: a scale-down
        or refresh that slips in after the deciding write (no instance lease) is caught even if
        the claim then recreates what it deleted.

        After the AppDefinition went, the garbage collector may take an instance's objects: one
        that did not yet carry the Session's reference (a claim in flight), or one whose claim
        raced the GC's read (finding 8). Who deleted it is the deletion audit's call, made
        exactly from the watch and the proxy's record; the watchdog waits `AUDIT_WAIT` seconds
        for that verdict (`ops.gc_deleted`) before it reports the deletion."""
        seen: dict[HeldKey, dict[str, tuple[str, bool]]] = {}
        gone: set[HeldKey] = set()  # keys whose AppDefinition is gone
        for ns in self.namespaces:
            live = {s.uid: s for s in map(parse_session, world.sessions[ns]) if s.live}
            appdefs = {a["metadata"]["name"] for a in world.appdefs[ns]
                       if not a["metadata"].get("deletionTimestamp")}
            for key in self._held_keys(world, ns, live):
                seen[key] = _instance_objects(world, ns, key)
                if live[key[1]].appdef not in appdefs:
                    gone.add(key)
        for key, before in self._held.items():
            if key in seen:  # else released: the Session ended or holds this instance no more
                self._check_kept(world, key, before, seen[key], gone=key in gone)
        # Remember the last uid of each object (one that vanished stays remembered, so a
        # later recreation is compared against the deleted one's uid).
        merged = {}
        for key, now in seen.items():
            merged[key] = {**{n: e for n, e in self._held.get(key, {}).items()
                              if e[0] not in self.ops.hand_deleted}, **now}
        self._held = merged

    def _held_keys(self, world: World, ns: str, live: dict[str, Session]) -> set[HeldKey]:
        """(namespace, Session uid, instance id, the external Service's uid suffix) of each
        instance a live Session holds: its external Service references the Session, or the
        Session is still annotated with an instance held before (whose objects may be gone)."""
        keys: set[HeldKey] = set()
        for obj in world.objects[ns]:
            name = obj["metadata"]["name"]
            k = naming.instance_id_from_name(name)
            if k is None or observe.classify(obj) is not Part.EXTERNAL_SERVICE:
                continue
            for r in refs(obj):
                s = live.get(str(r.get("uid"))) if is_session_ref(r) else None
                if s is not None and of_its_pool(s.appdef, name[-12:], world.appdefs[ns]):
                    keys.add((ns, s.uid, k, name[-12:]))
        for key in self._held:  # still annotated with it: held even if objects vanished
            if key[0] == ns and key[1] in live and live[key[1]].instance_id == key[2]:
                keys.add(key)
        return keys

    def _check_kept(self, world: World, key: HeldKey, before: dict[str, tuple[str, bool]],
                    now: dict[str, tuple[str, bool]], *, gone: bool) -> None:
        """A violation for each object of held instance `key` deleted or replaced since the
        last poll (`before` -> `now`: name -> (uid, whether it referenced the holder)), but by
        the runner's hand, the garbage collector's (the audit's verdict, awaited while the
        AppDefinition is `gone`), or a hostile relabelling."""
        ns, suid, k, _ = key
        who = f"instance {k} held by Session {live_name(world, ns, suid)}"
        for name, (uid, had_ref) in before.items():
            if uid in self.ops.hand_deleted or uid in self.ops.gc_deleted:
                continue
            if name not in now:
                if self._still_there(ns, name, uid):
                    continue  # relabelled by a hostile hand, not deleted
                if not had_ref and gone:
                    continue
                if gone:
                    since = self._vanished.setdefault(uid, self.history.now())
                    if self.history.now() - since < self.AUDIT_WAIT:
                        continue  # the audit has not ruled on it yet
                self.violate(f"{ns}: {name} of {who} was deleted while held")
            elif now[name][0] != uid:
                self.violate(f"{ns}: {name} of {who} was replaced while held "
                             f"(uid {uid[:8]} -> {now[name][0][:8]})")


def of_its_pool(session_appdef: str, uid12: str, appdefs: list[dict[str, Any]]) -> bool:
    """Whether a Session of AppDefinition `session_appdef` can hold an instance whose names
    carry the AppDefinition uid suffix `uid12`. pool-spec §4's claimant is a live Session *of
    A*, as the controller's `HolderIndex` reads it: a reference to another AppDefinition's
    Session (a hostile edit's plausible owner: CI, stop 43, seed 25) holds nothing, and the
    controller rightly releases the instance, above minInstances by deleting it. With no
    AppDefinition of that name listed (deleted) the uid cannot be compared, and the Session
    is taken at its reference, as before."""
    uids = [str(a["metadata"].get("uid")) for a in appdefs
            if a["metadata"].get("name") == session_appdef]
    return not uids or any(naming.short_uid(u) == uid12 for u in uids)


def _instance_objects(world: World, ns: str, key: HeldKey) -> dict[str, tuple[str, bool]]:
    """The objects of held instance `key`: "<kind>/<name>" -> (uid, whether it references
    the holder)."""
    _, suid, k, uid12 = key
    objs = {}
    for obj in world.objects[ns]:
        name = obj["metadata"]["name"]
        if naming.instance_id_from_name(name) == k and uid12 in name:
            has_ref = any(is_session_ref(r) and r.get("uid") == suid for r in refs(obj))
            objs[f"{obj['kind']}/{name}"] = (obj["metadata"]["uid"], has_ref)
    return objs




_UID12 = re.compile(r"-([0-9a-f]{12})(?:-int)?$")


class DeletionAudit:
    """Watches pool objects on the real API server and checks every deletion exactly, against
    the cluster one etcd revision before it: an object of an instance whose external Service
    carried a live Session's reference must not be deleted, except by the runner's hand, or by
    the garbage collector after its AppDefinition went (for an object the claim in flight had
    not yet given the Session's reference). Polling can miss a deletion that a claim repairs
    within the same second (a scale-down slipping in after the deciding write); a watch does
    not. A watch that loses its resourceVersion (410) relists and notes the gap.
    """

    KINDS = (("v1", "Service"), ("apps/v1", "Deployment"), ("v1", "ConfigMap"))

    PLURALS = {"Service": "services", "ConfigMap": "configmaps", "Deployment": "deployments"}

    def __init__(self, kube: Kube, pinned: PinnedKube, namespaces: list[str],
                 ops: Operations, history: History, violate: Callable[[str], None],
                 deleted_by_controller: Callable[[str, str], bool]) -> None:
        self.kube, self.pinned, self.namespaces = kube, pinned, namespaces
        self.ops, self.history, self.violate = ops, history, violate
        self.deleted_by_controller = deleted_by_controller  # (API path, uid) -> by the proxy?
        self.audited = 0
        self.gaps = 0
        self.gc_races = 0
        self.double_claims = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the pinned client is not shared between threads
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for ns in self.namespaces:
            for api_version, kind in self.KINDS:
                t = threading.Thread(target=self._watch, args=(ns, api_version, kind),
                                     name=f"audit-{kind}@{ns}", daemon=True)
                t.start()
                self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, ns: str, api_version: str, kind: str) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    _, rv = self.kube.list(api_version, kind, ns,
                                           label_selector=observe.POOL_SELECTOR)
                for event in self.kube.watch(api_version, kind, ns, resource_version=rv,
                                             label_selector=observe.POOL_SELECTOR,
                                             timeout_seconds=30):
                    if self._stop.is_set():
                        return
                    obj = event["object"]
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event["type"] == "DELETED":
                        obj.setdefault("kind", kind)
                        self._check(ns, obj)
            except Gone:
                self.gaps += 1
                self.history.add("audit", f"{kind}@{ns}: watch expired, relisting (a gap)")
                rv = None
            except Exception as exc:  # the real server is busy: resume shortly
                if not self._stop.wait(0.5):
                    self.history.add("audit", f"{kind}@{ns}: {exc!r}; resuming")

    def _by_controller(self, ns: str, obj: dict[str, Any]) -> bool:
        """Whether the controller (whose every request goes through the fault proxy) deleted
        `obj`; the proxy notes a delete when the server answers it, which may come a moment
        after the watch event."""
        api = "/apis/apps/v1" if obj["kind"] == "Deployment" else "/api/v1"
        path = (f"{api}/namespaces/{ns}/{self.PLURALS[obj['kind']]}/"
                f"{obj['metadata']['name']}")
        deadline = time.monotonic() + 2.0
        while not self.deleted_by_controller(path, obj["metadata"]["uid"]):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # the poll interval of a deadline loop
        return True

    def _check(self, ns: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        if meta["uid"] in self.ops.hand_deleted:
            return
        if meta["uid"] in self.ops.hidden:
            # A hostile edit removed its generation label: the watch by the pool's selector
            # says DELETED, the server may still hold it. Judged only if it is really gone.
            there = self.kube.get(obj.get("apiVersion") or ("apps/v1" if obj["kind"] ==
                                  "Deployment" else "v1"), obj["kind"], ns, name)
            if there is not None and there["metadata"].get("uid") == meta["uid"]:
                return
        k = naming.instance_id_from_name(name)
        m = _UID12.search(name)
        if k is None or m is None:
            return
        uid12 = m.group(1)
        before = str(int(meta["resourceVersion"]) - 1)
        with self._lock:
            self.pinned.rv = before
            sessions, _ = self.pinned.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
            services, _ = self.pinned.list("v1", "Service", ns,
                                           label_selector=observe.POOL_SELECTOR)
            appdefs, _ = self.pinned.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns)
        self.audited += 1
        live = {o["metadata"]["uid"]: o for o in sessions
                if not o["metadata"].get("deletionTimestamp")}
        holders = []
        for svc in services:
            svc.setdefault("kind", "Service")
            sname = svc["metadata"]["name"]
            if (naming.instance_id_from_name(sname) == k and uid12 in sname
                    and observe.classify(svc) is Part.EXTERNAL_SERVICE):
                holders += [s for r in refs(svc)
                            if is_session_ref(r) and (s := live.get(r.get("uid"))) is not None
                            and of_its_pool(str((s.get("spec") or {}).get("appDefinition")),
                                            uid12, appdefs)]
        if not holders:
            return
        holder = holders[0]
        # A double claim (a claim whose deciding write's answer was lost, retried on another
        # instance) is settled by releasing every instance but the Session's rightful one,
        # as the controller decides it: an instance above minInstances then goes. Excused
        # only when the server's own state, just before this deletion, made another
        # instance the rightful one.
        session = parse_session(holder)
        referencing = frozenset(
            i for svc in services
            if observe.classify(svc) is Part.EXTERNAL_SERVICE
            and uid12 in svc["metadata"]["name"]
            and (i := naming.instance_id_from_name(svc["metadata"]["name"])) is not None
            and any(is_session_ref(r) and r.get("uid") == holder["metadata"]["uid"]
                    for r in refs(svc)))
        if rightful_instance(session, referencing, k) != k:
            self.double_claims += 1
            self.history.add("audit", f"{ns}: {obj['kind']}/{name} of instance {k} deleted: "
                             f"a double claim of {holder['metadata']['name']} (it rightfully "
                             f"holds instance {rightful_instance(session, referencing, k)})")
            return
        had_ref = any(is_session_ref(r) and r.get("uid") == holder["metadata"]["uid"]
                      for r in refs(obj))
        app = (holder.get("spec") or {}).get("appDefinition")
        app_there = any(a["metadata"]["name"] == app and not a["metadata"].get(
            "deletionTimestamp") for a in appdefs)
        if not had_ref and not app_there:
            return  # the GC took a claim-in-flight's object after its AppDefinition went
        if not app_there and not self._by_controller(ns, obj):
            # The garbage collector, cascading the AppDefinition's deletion: it reads an object,
            # finds only dangling owners and deletes it on a uid precondition alone (Kubernetes
            # 1.20), so a claim's deciding write landing between its read and its delete is
            # lost with the object. Not the controller's doing; counted and reported.
            self.gc_races += 1
            self.ops.gc_deleted.add(meta["uid"])
            self.ops.gc_damaged.add((ns, str(holder["metadata"]["name"])))
            self.history.add("audit", f"{ns}: {obj['kind']}/{name} of instance {k} (holder "
                             f"{holder['metadata']['name']}) deleted by the garbage collector "
                             "after its AppDefinition went (a claim racing the deletion)")
            return
        self.violate(f"{ns}: {obj['kind']}/{name} of instance {k}, held by Session "
                     f"{holder['metadata']['name']}, was deleted (not by the runner) at "
                     f"resourceVersion {meta['resourceVersion']}")


# --- checks at quiescence ---------------------------------------------------------------------


_MISSING = re.compile(r"^(?P<ns>\S+): I1: Session (?P<s>\S+) holds instance (?P<k>\d+) of "
                      r"(?P<app>\S+) but its (?P<part>\w+) is missing$")


class Excusals:
    """I1 reports about held instances of a deleted AppDefinition, sorted out from violations.

    An object that really is missing is excused only when the runner deleted it by hand after
    the AppDefinition was gone, or the deletion audit saw the garbage collector take it from a
    claim racing that deletion (`Operations.gc_damaged`): the controller cannot rebuild an
    instance whose AppDefinition is gone (pool-spec §4 keeps what exists), so I1 stays broken
    until the Session ends (counted as `unrebuildable`). Any other missing object is a
    violation, and the uid tracking catches any object of a held instance that someone other
    than the runner deleted.

    (Earlier, objects of such an instance that had lost the AppDefinition's reference to the
    garbage collector were invisible to the checker and the controller, and were excused here
    as `blind`; `observe.group_pool` now finds them by the holder's reference, so an I1 report
    about them is a violation like any other.)
    """

    def __init__(self, ops: Operations, history: History) -> None:
        self.ops, self.history = ops, history
        self.unrebuildable: set[str] = set()

    def classify(self, text: str, world: World) -> bool:
        m = _MISSING.match(text)
        if not m:
            return False
        ns, session, app = m["ns"], m["s"], m["app"]
        if any(a["metadata"]["name"] == app for a in world.appdefs.get(ns, [])):
            return False
        if (ns, session) in self.ops.damaged:
            self._note(self.unrebuildable, text, "deleted by hand, AppDefinition gone: not "
                       "rebuildable")
            return True
        if (ns, session) in self.ops.gc_damaged:
            # The same as by hand: the deletion audit saw the garbage collector take the
            # object from a claim racing the AppDefinition's deletion (Kubernetes 1.20 deletes
            # on a uid precondition alone, finding 8); nothing can rebuild it.
            self._note(self.unrebuildable, text, "taken by the garbage collector from a claim "
                       "racing its AppDefinition's deletion: not rebuildable")
            return True
        return False

    def _note(self, bucket: set[str], text: str, why: str) -> None:
        if text not in bucket:
            bucket.add(text)
            self.history.add("excused", f"{text} ({why})")
