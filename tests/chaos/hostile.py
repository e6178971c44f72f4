"""The `hostile_edits` fault: foreign values written by hand into what the controller reads.

Anyone with `patch` on a namespace's Services, ConfigMaps, Deployments or Sessions (a person, a
tool that copies annotations) can write any label, annotation or owner reference there. The
fault does that during a run: it picks a live Session or a pool object (held or free), one of
the keys warmpool and Theia Cloud read from it (`warmpool.pool.vocabulary`: the fence, the
shape, claimed-for, the generation, app, service-type and template-purpose labels, the session
labels, the Session's instance-id and start-strategy annotations, the owner references), and a
value: huge, negative, non-ASCII, empty, over-long, removed, or plausible but wrong (a
neighbour's id, another Session's reference, a generation one off). Every choice comes from the
fault's seed (the targets are taken from the cluster as it is then, sorted by name, so two runs
of a seed pick alike as far as their clusters agree). A fault makes 2-5 edits, 0.3-1.5 s
apart; a run makes at most `ChaosConfig.hostile_max`.

Each edit is a resourceVersion-guarded merge patch on the real API server (not through the
fault proxy: the hand is not the controller). The API server refuses some (a label value that
is not a label value): recorded as refused, a trust boundary that held. Each edit then stays
in effect until the controller (or the garbage collector) overwrites it, or `hold` seconds
pass and the fault *heals* it: it restores the value it replaced, guarded so that it never
undoes what the controller wrote since (see `heal`). An edit is over when it is overwritten
or healed; from then on the checks judge the object like any other (see `Edit.window` and
docs/reliability.md, "Hostile edits").

How a check tells a refused hostile value from a real violation:

- The checks read the truth where the edited field is only a hint: a Session's instance-id
  annotation never makes a holder (pool-spec §4: the external Service's owner reference does),
  so while a hostile instance-id is in effect the checks see the value it replaced (`mask`).
  Owner references, the classifying labels and the generation label *are* what "held",
  "which object" and "which generation" mean, so they are not masked.
- A report about the edited object, its instance or its Sessions (`touches`) is damage while
  the edit is in effect, never a violation by itself; the edit's window does not count
  towards the damage grace or the liveness bound, and once the edit is over the report must
  clear within them like any other damage.
- Nothing else is excused: a report about any other object, instance or Session is judged as
  without the fault, so an edit that stops the queue (a fence that poisons the shared
  counter) shows up as Sessions elsewhere not served, with the edits named in the report.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tests.chaos.config import ChaosConfig
from tests.chaos.history import History
from tests.chaos.world import World
from warmpool.kube import observe
from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.pool import naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import is_appdef_ref, is_session_ref, refs
from warmpool.pool.meta import annotations_of, labels_of
from warmpool.pool.parts import Part

#: Outcomes of an edit (`Edit.outcome`).
REFUSED = "refused by the API server"
OVERWRITTEN = "overwritten (controller or garbage collector)"
HEALED = "healed by the fault"
GONE = "object gone"
LEFT = "left: written since by someone else, value plausible"

_OWNER_FIELD = "ownerReferences"
_SESSION_FIELDS = (("annotation", v.ANNOTATION_INSTANCE_ID, 4.0),
                   ("annotation", v.ANNOTATION_START_STRATEGY, 1.0))


def _pool_fields(part: Part) -> list[tuple[str, str, float]]:
    """(field, key, weight) a hostile hand may edit on a pool object of this part."""
    # The fence weighs most: one value there reaches the shared counter (issue 27, point 1).
    out = [("annotation", v.ANNOTATION_FENCE, 6.0), ("annotation", v.ANNOTATION_SHAPE, 1.0),
           ("label", v.LABEL_GENERATION, 2.0), (_OWNER_FIELD, "add", 1.5),
           (_OWNER_FIELD, "remove", 1.5)]
    if part.is_service:
        out += [("label", v.LABEL_SERVICE_TYPE, 1.0), ("label", v.LABEL_APP, 0.5)]
        out += [("label", k, 0.4) for k in v.SESSION_LABEL_KEYS]
    if part is Part.EXTERNAL_SERVICE:
        out.append(("annotation", v.ANNOTATION_CLAIMED_FOR, 1.5))
    if part in (Part.EMAIL_CONFIGMAP, Part.PROXY_CONFIGMAP):
        out.append(("label", v.LABEL_TEMPLATE_PURPOSE, 1.0))
    if part is Part.DEPLOYMENT:
        out.append(("label", v.LABEL_APP, 0.5))
    return out


Values = tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]

#: A hostile value for a key read as a number (fence, generation, instance id), whatever is there.
_NUMERIC: list[tuple[str, str | None]] = [
    ("huge", "99999999999999"), ("huge", "99999999999999999999"), ("huge", "1" + "0" * 20),
    ("huge", "1e+14"), ("negative", "-1"), ("negative", "-99999999999999"),
    ("non-ascii", "²"), ("non-ascii", "٣"), ("empty", ""), ("over-long", "9" * 5000),
    ("removed", None), ("plausible", "0"), ("plausible", " 1"), ("plausible", "01")]
#: ... for a key read as a word (a label, a strategy, a digest).
_TEXT: list[tuple[str, str | None]] = [
    ("empty", ""), ("non-ascii", "ÉAGER\u202e"), ("over-long", "x" * 300), ("removed", None),
    ("huge", "9" * 63)]


def _numeric(before: str | None, plausible: list[str]) -> Values:
    """The fixed hostile numbers, and the plausible ones this object suggests."""
    near = ([str(int(before) + 1), str(max(0, int(before) - 1))]
            if before is not None and before.isascii() and before.isdigit() else [])
    return _NUMERIC, [("plausible", p) for p in near + plausible]


def _text(plausible: list[str]) -> Values:
    return _TEXT, [("plausible", p) for p in plausible]


def _choose(values: Values, u: float) -> tuple[str, str | None]:
    """The value `u` in [0, 1) falls on: below 0.75 always the same fixed one (so the n-th
    edit of a seed writes the same value in every run), above it one this object suggests
    (or a fixed one again, when it suggests none)."""
    fixed, situational = values
    if u < 0.75:
        return fixed[int(u / 0.75 * len(fixed))]
    rest = situational or fixed
    return rest[min(len(rest) - 1, int((u - 0.75) / 0.25 * len(rest)))]


def _weighted(fields: list[tuple[str, str, float]], u: float) -> tuple[str, str]:
    """The (field, key) that `u` in [0, 1) falls on, each taking its weight's share."""
    total = sum(w for *_, w in fields)
    at = u * total
    for field, key, w in fields:
        if at < w:
            return field, key
        at -= w
    return fields[-1][0], fields[-1][1]


@dataclass
class Edit:
    """One hostile edit and what became of it (times are the run's history times)."""

    n: int
    ns: str
    api_version: str
    kind: str
    name: str
    uid: str
    field: str  # "annotation", "label" or "ownerReferences"
    key: str  # the annotation or label key; "add" or "remove" for an owner reference
    category: str
    before: Any  # the value replaced (None: absent); for an owner reference, the reference
    after: Any  # the hostile value (None: removed); for an owner reference, the reference
    at: float
    tokens: tuple[str, ...]  # how a report names what the edit touched (see `touches`)
    pool: str = ""  # the AppDefinition of the edited object or Session, when known
    rv: str = ""  # the resourceVersion the edit produced
    ended: float | None = None
    outcome: str = ""

    def window(self, now: float) -> tuple[float, float]:
        """While the hostile value was (or is) in effect."""
        return self.at, self.ended if self.ended is not None else now

    def describe(self) -> str:
        def shown(x: Any) -> str:
            if isinstance(x, dict):
                return f"{x.get('kind')}/{x.get('name')}"
            text = repr(x)
            return text if len(text) <= 40 else f"{text[:30]}...({len(x)} chars)"
        ref = self.after if self.key == "add" else self.before
        what = (f"owner reference {self.key} {shown(ref)}" if self.field == _OWNER_FIELD else
                f"{self.field} {self.key}: {shown(self.before)} -> {shown(self.after)}")
        return (f"#{self.n} at {self.at:.1f}s {self.ns} {self.kind}/{self.name} {what} "
                f"({self.category})" + (f", {self.outcome}" if self.outcome else "")
                + (f" at {self.ended:.1f}s" if self.ended is not None else ""))

    def current(self, obj: dict[str, Any] | None) -> bool:
        """Whether `obj` (this edit's object as read now) still carries the hostile value."""
        if obj is None or obj["metadata"].get("uid") != self.uid:
            return False
        if self.field == _OWNER_FIELD:
            uid = (self.after if self.key == "add" else self.before)["uid"]
            present = any(r.get("uid") == uid for r in refs(obj))
            return present if self.key == "add" else not present
        values = labels_of(obj) if self.field == "label" else annotations_of(obj)
        return values.get(self.key) == self.after if self.after is not None else (
            self.key not in values)


class HostileEdits:
    """Makes, watches and heals the hostile edits of a run; answers the checks' questions."""

    POLL = 0.2  # s between two looks at the edits in effect (the fault's own loop)

    def __init__(self, kube: Kube, namespaces: list[str], cfg: ChaosConfig,
                 history: History, hidden: set[str] | None = None) -> None:
        self.kube, self.namespaces, self.cfg, self.history = kube, namespaces, cfg, history
        self.edits: list[Edit] = []
        self.outcomes: Counter[str] = Counter()
        self.categories: Counter[str] = Counter()
        # uids of objects whose generation label an edit removed: they leave every watch and
        # list by the pool's selector without being deleted (the audits ask the server)
        self.hidden: set[str] = hidden if hidden is not None else set()
        self._lock = threading.Lock()

    # --- the fault ------------------------------------------------------------------------

    def run(self, edits: int, gap: float, hold: float, seed: int) -> None:
        """Make up to `edits` edits `gap` s apart, each healed `hold` s after it at the latest;
        returns when every one is over. If the fault itself fails, its edits still in effect
        are healed (best effort) and ended all the same: an edit never stays "in effect" for
        the checks past its fault."""
        rng = random.Random(seed)  # what is edited: three draws an edit, whatever the cluster
        picks = random.Random(seed + 1)  # which object: as many draws as the cluster asks
        active: list[Edit] = []
        try:
            for i in range(edits):
                if len(self.edits) >= self.cfg.hostile_max:
                    self.history.add("hostile", f"run-wide cap of {self.cfg.hostile_max} "
                                     "edits reached")
                    break
                edit = self._edit(rng, picks)
                if edit is not None and edit.ended is None:
                    active.append(edit)
                self._watch(active, hold)
                if i < edits - 1:
                    time.sleep(gap)  # the stimulus: the pace of the hand
            while active:
                self._watch(active, hold)
                if active:
                    time.sleep(self.POLL)  # poll interval of a loop bounded by `hold`
        finally:
            for edit in active:
                try:
                    outcome = self._heal(edit)
                except Exception as exc:  # the fault failed: say so, end the edit anyway
                    outcome = f"not healed ({exc!r})"
                self._end(edit, outcome, self.history.now())

    def _watch(self, active: list[Edit], hold: float) -> None:
        """End the edits the controller overwrote; heal those older than `hold`."""
        for edit in list(active):
            obj = self.kube.get(edit.api_version, edit.kind, edit.ns, edit.name)
            now = self.history.now()
            if obj is None or obj["metadata"].get("uid") != edit.uid:
                self._end(edit, GONE, now)
            elif not edit.current(obj):
                self._end(edit, OVERWRITTEN, now)
            elif now - edit.at >= hold:
                self._end(edit, self._heal(edit), self.history.now())
            else:
                continue
            active.remove(edit)

    def _end(self, edit: Edit, outcome: str, at: float) -> None:
        edit.ended, edit.outcome = at, outcome
        self.outcomes[outcome] += 1
        self.history.add("hostile", f"over: {edit.describe()}")

    def _targets(self, ns: str) -> list[dict[str, Any]]:
        sessions, _ = self.kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
        for s in sessions:
            s.setdefault("kind", v.SESSION_KIND)
            s.setdefault("apiVersion", v.SESSION_API_VERSION)
        live = [s for s in sessions if not s["metadata"].get("deletionTimestamp")]
        objects = [o for o in observe.list_pool_objects(self.kube, ns)
                   if observe.classify(o) is not None]
        return sorted(live + objects, key=lambda o: (o["kind"], o["metadata"]["name"]))

    def _edit(self, rng: random.Random, picks: random.Random) -> Edit | None:
        """One edit. Its namespace, Session or pool object, key and value come from exactly
        four draws of `rng` (each mapped onto what it picks from), so the n-th edit of a seed
        is the same kind of edit in every run (a fence of 99999999999999 on a pool object,
        say) even where the clusters differ; which object, from `picks`."""
        u_ns, u_target, u_field, u_value = (rng.random() for _ in range(4))
        ns = self.namespaces[int(u_ns * len(self.namespaces))]
        targets = self._targets(ns)
        if not targets:
            self.history.add("hostile", f"{ns}: nothing to edit")
            return None
        # A Session one edit in five, else a pool object, a held one's more often than not.
        sessions = [o for o in targets if o["kind"] == v.SESSION_KIND]
        objects = [o for o in targets if o["kind"] != v.SESSION_KIND]
        if sessions and (u_target < 0.2 or not objects):
            obj = picks.choice(sessions)
        else:
            held = [o for o in objects if any(is_session_ref(r) for r in refs(o))]
            obj = picks.choice(held if held and picks.random() < 0.6 else objects)
        part = observe.classify(obj) if obj["kind"] != v.SESSION_KIND else None
        fields = [f for f in (_SESSION_FIELDS if part is None else _pool_fields(part))
                  if f[1] not in self.cfg.hostile_skip]
        if not fields:
            return None
        field, key = _weighted(fields, u_field)
        for attempt in range(5):
            if attempt:
                fresh = self.kube.get(obj["apiVersion"], obj["kind"], ns, obj["metadata"]["name"])
                if fresh is None:
                    return None
                fresh.setdefault("kind", obj["kind"])
                fresh.setdefault("apiVersion", obj["apiVersion"])
                obj = fresh
            edit = self._plan(u_value, picks, ns, obj, field, key, sessions, targets)
            if edit is None:
                self.history.add("hostile", f"{ns} {obj['kind']}/{obj['metadata']['name']}: "
                                 f"no {field} {key} to edit")
                return None
            # Taking the generation label away takes the object out of the pool's selector:
            # a watch by it says DELETED. Marked before the patch is sent, since that event
            # may reach the watchdog before the patch's answer reaches this thread (seed 7
            # once judged a still-present Service deleted in that gap).
            hides = (field == "label" and key == v.LABEL_GENERATION and edit.after is None
                     and edit.uid not in self.hidden)
            if hides:
                self.hidden.add(edit.uid)
            try:
                written = self.kube.merge_patch(
                    edit.api_version, edit.kind, ns, edit.name, self._patch(edit, obj),
                    resource_version=obj["metadata"]["resourceVersion"])
            except Conflict:
                if hides:
                    self.hidden.discard(edit.uid)
                continue  # written meanwhile: read again, edit what is there now
            except KubeError as exc:
                if hides:
                    self.hidden.discard(edit.uid)
                if exc.status == 404:
                    return None
                self._record(edit)
                self._end(edit, f"{REFUSED} ({exc.status})", self.history.now())
                return edit
            edit.rv = str(written["metadata"].get("resourceVersion") or "")
            self._record(edit)
            return edit
        return None

    def _record(self, edit: Edit) -> None:
        with self._lock:
            self.edits.append(edit)
        self.categories[edit.category] += 1
        self.history.add("hostile", edit.describe())

    def _plan(self, u_value: float, picks: random.Random, ns: str, obj: dict[str, Any],
              field: str, key: str,
              sessions: list[dict[str, Any]], targets: list[dict[str, Any]]) -> Edit | None:
        meta = obj["metadata"]
        name = meta["name"]
        others = [s for s in sessions if s["metadata"]["uid"] != meta["uid"]]
        pool, k, holders = self._context(obj, sessions)
        before: Any
        after: Any
        if field == _OWNER_FIELD:
            ref, category = self._ref_change(picks, obj, key, others, targets)
            if ref is None:
                return None
            after = ref if key == "add" else None
            before = ref if key == "remove" else None
        else:
            present = labels_of(obj) if field == "label" else annotations_of(obj)
            before = present.get(key)
            category, after = _choose(self._values(key, before, obj, others, targets), u_value)
            if after == before:
                category, after = "removed", None
            if after is None and before is None:
                category, after = "empty", ""
        tokens = [name] + ([f"instance {k} of {pool}"] if k is not None and pool else [])
        for s_name, s_uid in holders:
            tokens += [f"Session {s_name}", f"'{s_name}'", routes.route_name(s_uid)]
        return Edit(n=len(self.edits) + 1, ns=ns, api_version=obj["apiVersion"],
                    kind=obj["kind"], name=name, uid=meta["uid"], field=field, key=key,
                    category=category, before=before, after=after, at=self.history.now(),
                    tokens=tuple(tokens), pool=pool)

    def _context(self, obj: dict[str, Any], sessions: list[dict[str, Any]]
                 ) -> tuple[str, int | None, list[tuple[str, str]]]:
        """(pool, instance id, [(Session name, uid)]) the edited object or Session belongs to."""
        if obj["kind"] == v.SESSION_KIND:
            spec = obj.get("spec") or {}
            raw = annotations_of(obj).get(v.ANNOTATION_INSTANCE_ID, "")
            k = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else None
            return (str(spec.get("appDefinition") or ""), k,
                    [(obj["metadata"]["name"], obj["metadata"]["uid"])])
        k = naming.instance_id_from_name(obj["metadata"]["name"])
        pool = next((str(r.get("name")) for r in refs(obj) if is_appdef_ref(r)), "")
        by_uid = {s["metadata"]["uid"]: s for s in sessions}
        holders = [(str(r.get("name")), str(r.get("uid"))) for r in refs(obj)
                   if is_session_ref(r)]
        if not pool:
            pool = next((str((by_uid[u].get("spec") or {}).get("appDefinition") or "")
                         for _, u in holders if u in by_uid), "")
        return pool, k, holders

    def _values(self, key: str, before: str | None, obj: dict[str, Any],
                others: list[dict[str, Any]], targets: list[dict[str, Any]]
                ) -> Values:
        """The fixed hostile values of `key`'s kind, and the plausible ones it suggests."""
        other_uids = [s["metadata"]["uid"] for s in others]
        match key:
            case v.ANNOTATION_FENCE | v.LABEL_GENERATION:
                return _numeric(before, [])
            case v.ANNOTATION_INSTANCE_ID:
                # Plausible: an id another Session of the same pool is annotated with.
                app = (obj.get("spec") or {}).get("appDefinition")
                ids = sorted({annotations_of(s).get(v.ANNOTATION_INSTANCE_ID) or ""
                              for s in others
                              if (s.get("spec") or {}).get("appDefinition") == app} - {""})
                return _numeric(before, ids[:3])
            case v.ANNOTATION_CLAIMED_FOR:
                uid = obj["metadata"]["uid"]
                holder = next((str(r.get("uid")) for r in refs(obj) if is_session_ref(r)), uid)
                wrong = [f"{holder}/0000000000000000"]
                wrong += [naming.claimed_for(u, "someone@example.com") for u in other_uids[:1]]
                return _text(wrong)
            case v.ANNOTATION_SHAPE:
                return _text(["0" * 16, (before or "")[::-1]])
            case v.ANNOTATION_START_STRATEGY:
                return _text(["lazy", "EAGER"])
            case v.LABEL_SERVICE_TYPE:
                return _text(["internal", "external"])
            case v.LABEL_TEMPLATE_PURPOSE:
                return _text([v.PURPOSE_PROXY, v.PURPOSE_EMAILS])
            case v.LABEL_APP:
                apps = sorted({labels_of(o).get(v.LABEL_APP) or "" for o in targets} - {""})
                return _text(apps[:3])
            case v.LABEL_SESSION | v.LABEL_SESSION_UUID | v.LABEL_USER:
                names = [naming.label_value(s["metadata"]["name"]) for s in others[:2]]
                return _text(names + other_uids[:2])
        return _text([])

    def _ref_change(self, rng: random.Random, obj: dict[str, Any], key: str,
                    others: list[dict[str, Any]], targets: list[dict[str, Any]]
                    ) -> tuple[dict[str, Any] | None, str]:
        """The reference to add or remove, and the edit's category."""
        if key == "remove":
            current = refs(obj)
            if not current:
                return None, ""
            return rng.choice(current), "removed"
        choices: list[tuple[str, dict[str, Any]]] = [
            ("foreign", {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
                         "name": "nobody",
                         "uid": f"00000000-0000-4000-8000-{rng.randrange(10**12):012d}"})]
        for s in others[:5]:  # plausible: another live Session of the namespace
            choices.append(("plausible", {"apiVersion": v.SESSION_API_VERSION,
                                          "kind": v.SESSION_KIND, "name": s["metadata"]["name"],
                                          "uid": s["metadata"]["uid"]}))
        cms = [o for o in targets if o["kind"] == "ConfigMap" and o is not obj]
        if cms:
            cm = rng.choice(cms)
            choices.append(("foreign", {"apiVersion": "v1", "kind": "ConfigMap",
                                        "name": cm["metadata"]["name"],
                                        "uid": cm["metadata"]["uid"]}))
        category, ref = rng.choice(choices)
        if any(r.get("uid") == ref["uid"] for r in refs(obj)):
            return None, ""
        return ref, category

    @staticmethod
    def _patch(edit: Edit, obj: dict[str, Any]) -> dict[str, Any]:
        if edit.field == _OWNER_FIELD:
            current = [dict(r) for r in refs(obj)]
            if edit.key == "add":
                new = [*current, edit.after]
            else:
                new = [r for r in current if r.get("uid") != edit.before["uid"]]
            return {"metadata": {"ownerReferences": new}}
        section = "labels" if edit.field == "label" else "annotations"
        return {"metadata": {section: {edit.key: edit.after}}}

    def _heal(self, edit: Edit) -> str:
        """Put back what the edit replaced, never over what someone wrote since.

        Unwritten since the edit (its resourceVersion): the exact inverse. Written since (by
        the controller, which left the hostile value in place): a value no one would choose
        (huge, negative, non-ASCII, empty, over-long, a foreign owner) is put back all the
        same, guarded by the resourceVersion just read; a plausible one, or a removed owner
        reference, is left, since the writer may have meant it: the checks then judge it."""
        for _ in range(5):
            obj = self.kube.get(edit.api_version, edit.kind, edit.ns, edit.name)
            if obj is None or obj["metadata"].get("uid") != edit.uid:
                return GONE
            if not edit.current(obj):
                return OVERWRITTEN
            rv = obj["metadata"]["resourceVersion"]
            untouched = rv == edit.rv
            if not untouched and (edit.category == "plausible" or (
                    edit.field == _OWNER_FIELD and edit.key == "remove")):
                return LEFT
            if edit.field == _OWNER_FIELD:
                current = [dict(r) for r in refs(obj)]
                new = ([r for r in current if r.get("uid") != edit.after["uid"]]
                       if edit.key == "add" else [*current, edit.before])
                patch: dict[str, Any] = {"metadata": {"ownerReferences": new}}
            else:
                section = "labels" if edit.field == "label" else "annotations"
                patch = {"metadata": {section: {edit.key: edit.before}}}
            try:
                self.kube.merge_patch(edit.api_version, edit.kind, edit.ns, edit.name, patch,
                                      resource_version=rv)
            except Conflict:
                continue
            except KubeError as exc:
                if exc.status == 404:
                    return GONE
                raise
            return HEALED
        return LEFT

    # --- for the checks -------------------------------------------------------------------

    def snapshot(self) -> list[Edit]:
        with self._lock:
            return list(self.edits)

    def in_effect(self, now: float) -> list[Edit]:
        return [e for e in self.snapshot() if e.ended is None and e.at <= now]

    def mask(self, world: World) -> World:
        """The world with every hostile instance-id annotation still in effect on a Session
        replaced by the value it replaced (that annotation is a hint, never a holder)."""
        edits = [e for e in self.snapshot() if e.ended is None and e.kind == v.SESSION_KIND
                 and e.key == v.ANNOTATION_INSTANCE_ID]
        if not edits:
            return world
        sessions = dict(world.sessions)
        for e in edits:
            items = []
            for s in sessions.get(e.ns, []):
                if s["metadata"].get("uid") == e.uid and e.current(s):
                    meta = dict(s["metadata"])
                    ann = dict(meta.get("annotations") or {})
                    if e.before is None:
                        ann.pop(e.key, None)
                    else:
                        ann[e.key] = e.before
                    meta["annotations"] = ann
                    s = {**s, "metadata": meta}
                items.append(s)
            sessions[e.ns] = items
        return World(world.rv, world.appdefs, sessions, world.objects, world.routes)

    def touching(self, text: str) -> list[Edit]:
        """The edits a check's report is about: same namespace, and it names the edited
        object, its instance, or a Session that held it or was edited."""
        out = []
        for e in self.snapshot():
            if not text.startswith(f"{e.ns}:"):
                continue
            if any(re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text) for t in e.tokens):
                out.append(e)
        return out

    def covered(self, edits: list[Edit], t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which one of `edits` was in effect."""
        now = self.history.now()
        spans = sorted((max(s, t0), min(e, t1)) for s, e in (x.window(now) for x in edits))
        total, end = 0.0, t0
        for s, e in spans:
            s = max(s, end)
            if e > s:
                total += e - s
                end = e
        return total

    def recent(self, before: float, ns: str | None = None, count: int = 3) -> list[Edit]:
        """The last `count` edits made before `before` (in `ns`, when given)."""
        return [e for e in self.snapshot() if e.at <= before
                and (ns is None or e.ns == ns)][-count:]

    def context(self, text: str, first: float) -> str:
        """For a violation's report: the edits about it, and those in effect or just made
        when it began (an edit that stalls the queue is about nothing it stops)."""
        about = self.touching(text)
        then = {e.n: e for e in self.snapshot()
                if e.at <= first and (e.ended is None or e.ended >= first)}
        then.update({e.n: e for e in self.recent(first)})
        around = [then[n] for n in sorted(then) if then[n] not in about][-8:]
        parts = []
        if about:
            parts.append("hostile edits about it: " + "; ".join(e.describe() for e in about[-3:]))
        if around:
            parts.append("hostile edits in effect or just made when it began: "
                         + "; ".join(e.describe() for e in around))
        return " [" + " | ".join(parts) + "]" if parts else ""

    def summary(self) -> str:
        return (f"{len(self.edits)} edits, by category {dict(self.categories)}, outcomes "
                f"{dict(self.outcomes)}")

