"""What people and Theia Cloud do to the cluster during a chaos run, seeded."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.config import ChaosConfig
from tests.chaos.history import History
from warmpool.kube import observe
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import is_session_ref, refs
from warmpool.pool.model import parse_session
from warmpool.testing.world import USERS, create_appdef, create_session


@dataclass
class Model:
    """What the runner created (names never reused, so a name means one object)."""

    appdefs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    sessions: dict[tuple[str, str], str] = field(default_factory=dict)  # live -> appdef name
    deleted_appdefs: list[tuple[str, str]] = field(default_factory=list)
    counter: int = 0

    def next(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


OP_WEIGHTS = {
    "create_session": 30, "delete_session": 18, "flash_session": 6, "scale": 12,
    "race_claim_scale": 4,
    "spec_change": 5, "delete_object": 6, "create_appdef": 3, "delete_appdef": 1.5,
    "invalid_session": 2,
    # session-lifecycle: a holder's route deleted by hand (restored), a Session re-created
    # under its name at once (a new uid: released, then claimed again, its route renamed)
    "delete_route": 3, "recreate_session": 3,
}
BAD_USERS = ["", "two@example.com\nlines@example.com", "a@example.com,b@example.com",
             " spaced@example.com", "not-an-address"]


class Operations:
    def __init__(self, kube: Kube, namespaces: list[str], rng: random.Random, cfg: ChaosConfig,
                 history: History) -> None:
        self.kube, self.namespaces, self.rng, self.cfg = kube, namespaces, rng, cfg
        self.history = history
        self.model = Model()
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.hand_deleted: set[str] = set()  # uids of objects the runner deleted
        # uids of objects the deletion audit found taken by the garbage collector, racing a
        # claim, after their AppDefinition went (not the controller's doing)
        self.gc_deleted: set[str] = set()
        # (namespace, Session) whose held instance lost an object to the runner's hand
        self.damaged: set[tuple[str, str]] = set()
        # (namespace, Session) whose held instance lost an object to the garbage collector
        # racing its claim after the AppDefinition went (the deletion audit's verdict)
        self.gc_damaged: set[tuple[str, str]] = set()
        # set by the `redis_flush_race` fault: the next operation is a race with this flush
        # between its claims and its scale-down, then sets the event
        self.flush_race: tuple[Callable[[], None], threading.Event] | None = None
        self.race_next = False  # set by `worker_stop`: the next operation is a race
        # uids of pool objects a hostile edit took out of the pool's selector (generation label
        # removed): a watch by the selector reports them DELETED while they still exist
        self.hidden: set[str] = set()

    def setup(self) -> None:
        for ns in self.namespaces:
            for _ in range(2):
                self.create_appdef(ns)

    def live_appdefs(self, ns: str | None = None) -> list[tuple[str, str]]:
        return [k for k in self.model.appdefs if ns is None or k[0] == ns]

    def step(self) -> str:
        ops = dict(OP_WEIGHTS)
        if len(self.model.sessions) >= self.cfg.max_sessions:
            ops["create_session"] = ops["flash_session"] = 0
        if not self.model.sessions:
            ops["delete_session"] = ops["recreate_session"] = 0
        if len(self.live_appdefs()) <= 2:
            ops["delete_appdef"] = 0
        if not self.live_appdefs():
            ops["scale"] = ops["spec_change"] = ops["race_claim_scale"] = 0
        name = self.rng.choices(list(ops), list(ops.values()))[0]
        race = self.flush_race
        if race is not None and self.live_appdefs():
            self.flush_race, name = None, "race_claim_flush_scale"
        elif self.race_next and ops["race_claim_scale"]:
            self.race_next, name = False, "race_claim_scale"
        try:
            if race is not None and name == "race_claim_flush_scale":
                try:
                    text = self.race_claim_scale(flush=race[0])
                finally:
                    race[1].set()
            else:
                text = getattr(self, name)()
            self.done[name] += 1
            self.history.add("op", f"{name} {text}")
        except Exception as exc:  # e.g. 404: the GC or a release got there first
            self.failed[name] += 1
            self.history.add("op", f"{name} failed: {type(exc).__name__}: {str(exc)[:120]}")
        return name

    # --- the operations ---------------------------------------------------------------------

    def create_appdef(self, ns: str | None = None) -> str:
        ns = ns or self.rng.choice(self.namespaces)
        if len(self.live_appdefs(ns)) >= self.cfg.max_appdefs_per_namespace:
            return self.scale()
        name = self.model.next("app")
        lo = self.rng.randint(0, 3)
        hi = self.rng.randint(max(lo, 2), 5)
        create_appdef(self.kube, ns, name, min_instances=lo, max_instances=hi, spec_name=name)
        self.model.appdefs[(ns, name)] = {"max": hi, "min": lo, "gen": 0}
        return f"{ns}/{name} min={lo} max={hi}"

    def delete_appdef(self) -> str:
        # Prefer one with live Sessions: that is the interesting case.
        with_sessions = [k for k in self.live_appdefs()
                         if any(s[0] == k[0] and a == k[1] for s, a in self.model.sessions.items())]
        ns, name = self.rng.choice(with_sessions or self.live_appdefs())
        self.kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name)
        del self.model.appdefs[(ns, name)]
        self.model.deleted_appdefs.append((ns, name))
        live = sum(1 for s, a in self.model.sessions.items() if s[0] == ns and a == name)
        return f"{ns}/{name} with {live} live Sessions"

    def _new_session(self, appdef: tuple[str, str], user: str | None = None) -> tuple[str, str]:
        ns, app = appdef
        name = self.model.next("s")
        user = user if user is not None else USERS[self.rng.randrange(50)]
        create_session(self.kube, ns, name, user, appdef=app)
        self.model.sessions[(ns, name)] = app
        return ns, name

    def create_session(self) -> str:
        pick = self.live_appdefs()
        if self.model.deleted_appdefs and (not pick or self.rng.random() < 0.08):
            target = self.rng.choice(self.model.deleted_appdefs)  # an unknown AppDefinition
        else:
            target = self.rng.choice(pick)
        ns, name = self._new_session(target)
        return f"{ns}/{name} -> {target[1]}"

    def flash_session(self) -> str:
        """A Session deleted again at once: its claim is in flight or not even started."""
        if not self.live_appdefs():
            return "no AppDefinition"
        ns, name = self._new_session(self.rng.choice(self.live_appdefs()))
        wait = self.rng.uniform(0, 0.3)
        time.sleep(wait)  # stimulus: deleted 0-300 ms after its creation, mid-claim
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        del self.model.sessions[(ns, name)]
        return f"{ns}/{name} deleted after {wait * 1000:.0f} ms"

    def invalid_session(self) -> str:
        if self.rng.random() < 0.3 or not self.live_appdefs():
            ns = self.rng.choice(self.namespaces)
            target, user = (ns, "no-such-app"), USERS[0]
        else:
            target, user = self.rng.choice(self.live_appdefs()), self.rng.choice(BAD_USERS)
        ns, name = self._new_session(target, user=user)
        return f"{ns}/{name} -> {target[1]} user={user!r}"

    def delete_session(self) -> str:
        ns, name = self.rng.choice(sorted(self.model.sessions))
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        del self.model.sessions[(ns, name)]
        return f"{ns}/{name}"

    def recreate_session(self) -> str:
        """Deleted and created again under the same name at once: the new uid holds nothing
        (pool-spec §4), so the old one is released and the new one claims like any other."""
        ns, name = self.rng.choice(sorted(self.model.sessions))
        old = self.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        if old is None:
            return f"{ns}/{name}: already gone"
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                         uid=old["metadata"]["uid"])
        wait_gone = time.monotonic() + 10
        while (self.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name) is not None
               and time.monotonic() < wait_gone):
            time.sleep(0.02)  # the delete is asynchronous only while a finalizer holds it
        spec = old.get("spec") or {}
        create_session(self.kube, ns, name, str(spec.get("user") or USERS[0]),
                       appdef=str(spec.get("appDefinition") or ""))
        return f"{ns}/{name} (was uid {old['metadata']['uid'][:8]})"

    def delete_route(self) -> str:
        ns = self.rng.choice(self.namespaces)
        found = observe.list_session_routes(self.kube, ns)
        if not found:
            return f"{ns}: no session route"
        route = self.rng.choice(found)
        meta = route["metadata"]
        self.kube.delete(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, meta["name"], uid=meta["uid"])
        return f"{ns} HTTPRoute/{meta['name']}"

    def _held_ids(self, ns: str, app: str) -> list[int]:
        items, _ = self.kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
        out = []
        for s in map(parse_session, items):
            if s.appdef == app and s.instance_id is not None:
                out.append(s.instance_id)
        return sorted(out)

    def scale(self) -> str:
        ns, app = self.rng.choice(self.live_appdefs())
        info = self.model.appdefs[(ns, app)]
        held = self._held_ids(ns, app)
        roll = self.rng.random()
        if roll < 0.15:
            new = 0
        elif roll < 0.45 and held and max(held) > 1:
            new = self.rng.randrange(0, max(held))  # below a claimed id
        else:
            new = self.rng.randint(0, info["max"])
        self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                              {"spec": {"minInstances": new}})
        before, info["min"] = info["min"], new
        return f"{ns}/{app} minInstances {before} -> {new} (held ids {held})"

    def race_claim_scale(self, flush: Callable[[], None] | None = None) -> str:
        """pool-spec S3: claims and a scale-down of the same instances issued at once.

        With `flush` (the `redis_flush_race` fault), Redis is emptied between the claims and
        the scale-down, whatever the pool: that is the case the fault is for."""
        if flush is not None:
            # A pool with free instances to scale down is the race; any pool will do else.
            ready = [k for k in self.live_appdefs() if self.model.appdefs[k]["min"] > 0]
            ns, app = self.rng.choice(ready or self.live_appdefs())
        else:
            ns, app = self.rng.choice(self.live_appdefs())
        info = self.model.appdefs[(ns, app)]
        if flush is None and (info["min"] == 0
                              or len(self.model.sessions) >= self.cfg.max_sessions):
            return self.scale()
        names = []
        for _ in range(self.rng.randint(1, 3)):
            names.append(self._new_session((ns, app))[1])
        wait = self.rng.uniform(0, 0.03)
        time.sleep(wait)  # the stimulus: 0-30 ms between the claims and the scale-down
        if flush is not None:
            flush()
        if info["min"] == 0:
            return f"{ns}/{app}: Sessions {names}, Redis emptied, no instance to scale down"
        new = self.rng.randrange(0, info["min"])
        self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                              {"spec": {"minInstances": new}})
        before, info["min"] = info["min"], new
        return (f"{ns}/{app}: Sessions {names}, then after {wait * 1000:.0f} ms minInstances "
                f"{before} -> {new}")

    def spec_change(self) -> str:
        ns, app = self.rng.choice(self.live_appdefs())
        info = self.model.appdefs[(ns, app)]
        info["gen"] += 1
        image = f"theiacloud/theia-cloud-demo:1.{info['gen']}"
        self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                              {"spec": {"image": image}})
        return f"{ns}/{app} image {image}"

    def delete_object(self) -> str:
        ns = self.rng.choice(self.namespaces)
        objects = observe.list_pool_objects(self.kube, ns)
        if not objects:
            return f"{ns}: no pool object"
        claimed = [o for o in objects if any(is_session_ref(r) for r in refs(o))]
        pool = claimed if claimed and self.rng.random() < 0.6 else objects
        obj = self.rng.choice(pool)
        meta = obj["metadata"]
        self.hand_deleted.add(meta["uid"])
        for r in refs(obj):
            if is_session_ref(r):
                self.damaged.add((ns, str(r.get("name"))))
        self.kube.delete(obj["apiVersion"], obj["kind"], ns, meta["name"], uid=meta["uid"])
        held = "held" if obj in claimed else "free"
        return f"{ns} {obj['kind']}/{meta['name']} ({held})"
