"""Every state change of a key, as one Lua script each, so no step is ever half done.

The scripts are files beside this module, `lua/<name>.lua` (each one's header says what it
does and what its ARGV are), read at import as dramatiq reads its own `dispatch.lua`; this
module registers them and is their typed Python side (`Scripts`: one method per script).

All scripts share `lua/lib.lua` (`LIB`). Every key name the scripts use is taken from `Layout`
(`KEY_NAMES`: the one definition of the names; no script derives one) and declared as a Lua
string constant by a head generated here for the layout, so a call passes no KEYS: each call
would otherwise send, and redis-py pack, the same twenty names again (two calls per job;
measured, 5-7 % of a worker's CPU per no-op job). The price is one registered copy of each
script per layout in Redis's script cache: one per deployment (the tests make many; a
`SCRIPT FLUSH` frees them, and a call that finds its script gone loads it again). Standalone
Redis and Sentinel only, as before: the per-key names (`lease:<k>`, ...) were never declared
either, which Redis Cluster would need, and as dramatiq's own `dispatch.lua` builds its names
from a namespace. NOW is read from the server's clock, so lease TTLs (PX), deadlines and ready
times all use one clock whatever host calls.

Two dramatiq queues: session keys (claims, `CLAIM_PREFIX`) go to `<queue>-claims`, every
other key to `<queue>`, so a claim never waits behind a bulk fan-out; `queue_of` in LIB is
the only place that chooses, and everything that reads or repairs a key's message asks it.
Dead letters of both live in the main queue's `.XQ`: one place for the tools.

Invariants the scripts keep:
  * a key in `dirty` is waiting; it has a queued message unless its lease is held (the
    holder queues it right after `done`: `done` reports that one is needed and `requeue`
    writes it, so no body is built unless it is) -- the audit repairs any other case,
    including a holder that died between the two;
  * a key is never both dirty and delayed (an immediate add supersedes a delayed one, and
    inherits its "run whatever" obligation as the `*` trigger);
  * the lease is released only by the token that took it (compare-and-delete), and a
    release that finds another token touches nothing of the new holder's;
  * every add records why in `trig:<k>` (what the run must see; `*` for "no particular
    version": resync, delay, retry, recovery, repair, redrive), even a deduplicated or
    rerun add; `start` hands the hash to the job and deletes it in the step that takes the
    lease, so adds during a run accumulate for the next one;
  * a delivery is skipped as "own" only if its key's triggers are non-empty, hold no `*`,
    and each is covered by `own:<k>` (versions the key's own guarded writes produced):
    missing data never skips a run.

Message bodies are built in Python (dramatiq's encoder) and passed in, because Lua cannot
encode with whatever encoder dramatiq is configured with; scripts that may need a body for a
key not known in advance (promotion, recovery, repair, the rerun after `done`) come as a
cheap "which keys?" step followed by a script that re-checks each key atomically.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis

from warmpool.queue.layout import Layout
from warmpool.queue.routing import CLAIM_PREFIX

log = logging.getLogger(__name__)

OWN_TTL_MS = 300_000  # how long a run's own-write record can still match a late trigger
#: The highest value a lift sets the fence counter to (`lift_fence.lua`), whatever an object
#: says: INCR then has more than 8 * 10^18 steps left before int64's end. The same bound as
#: `warmpool.pool.fence.FENCE_CEILING` (the pool's reading of the annotation; the queue may
#: not import the pool: tests/unit/test_fence_grammar.py checks that they agree).
FENCE_CEILING = 10**18 - 1
#: A counter above this is taken as unusable (deleted, as if Redis had lost it: the objects'
#: fences lift it back), so INCR never meets int64's end: 2.2 * 10^17 below it.
FENCE_SAFE = 9 * 10**18
UNTRIGGERED = "*"
GONE = "#gone"

#: Where the scripts live: `lua/<name>.lua` beside this module, shipped as package data.
LUA_FOLDER = "lua"
#: The shared library every script is prefixed with; every other file is one script.
LIB_NAME = "lib"


def _read_lua() -> dict[str, str]:
    """Every `lua/*.lua` of this package, by file name without `.lua`: read once, at import,
    as dramatiq's Redis broker reads its own `redis/*.lua` beside its module. Read through
    importlib.resources rather than a path, so an installed package (any loader) works."""
    folder = resources.files(__package__ or "warmpool.queue").joinpath(LUA_FOLDER)
    return {
        entry.name.removesuffix(".lua"): entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".lua") and entry.is_file()
    }


_SOURCES = _read_lua()
LIB = _SOURCES[LIB_NAME]
#: name -> body of each script (`Scripts` registers each one, `LIB` first).
BODIES = {name: body for name, body in _SOURCES.items() if name != LIB_NAME}

#: The names the scripts use: (Lua local, the `Layout` attribute that names the key). The
#: three prefixes are of per-key names (`lease:<k>`, `trig:<k>`, `own:<k>`), which the scripts
#: complete with the key as `Layout.lease` etc. do.
KEY_NAMES: tuple[tuple[str, str], ...] = (
    ("DIRTY", "dirty"),
    ("INFLIGHT", "inflight"),
    ("FAILURES", "failures"),
    ("DELAYED", "delayed"),
    ("ERRORS", "errors"),
    ("ADDED_AT", "added_at"),
    ("PENDING", "pending"),
    ("DEAD", "dead"),
    ("FENCE", "fence"),
    ("LEASE", "lease_prefix"),
    ("TRIG", "triggers_prefix"),
    ("OWN", "own_prefix"),
    ("WAIT", "waiters_prefix"),
    ("QUEUE", "messages_list"),
    ("QUEUE_MSGS", "messages"),
    ("CLAIMS", "claims_messages_list"),
    ("CLAIMS_MSGS", "claims_messages"),
    ("XQ", "xq"),
    ("XQ_MSGS", "xq_messages"),
    ("DOORBELL", "doorbell_channel"),
)


def _lua_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    if any(c in escaped for c in "\n\r\0"):
        raise ValueError(f"not a one-line constant: {text!r}")
    return f'"{escaped}"'


def head(layout: Layout) -> str:
    """The Lua declared before `LIB` for `layout`: its key names (`KEY_NAMES`), and the
    constants."""
    lines = ["-- generated by warmpool/queue/scripts.py: the layout's names (KEY_NAMES)"]
    lines += [f"local {name} = {_lua_string(name_of)}"
              for name, name_of in zip((n for n, _ in KEY_NAMES), script_keys(layout),
                                       strict=True)]
    lines.append(f"local CLAIM_PREFIX, OWN_TTL = {_lua_string(CLAIM_PREFIX)}, {OWN_TTL_MS}")
    # Decimal strings: the scripts compare fences as text (`rv_ge`), never as Lua numbers.
    lines.append(f'local FENCE_CEILING, FENCE_SAFE = "{FENCE_CEILING}", "{FENCE_SAFE}"')
    return "\n".join(lines) + "\n"


def library(layout: Layout) -> str:
    """What every script of `layout` starts with: its head, then `LIB`."""
    return head(layout) + LIB


def script_keys(layout: Layout) -> list[str]:
    """`layout`'s names the scripts use, in `KEY_NAMES` order."""
    return [str(getattr(layout, attr)) for _, attr in KEY_NAMES]


Triggers = Mapping[str, str]


def _s(value: Any) -> str:
    """A reply as text. Bytes that are not UTF-8 (someone else's, in a lease value, say) are
    replaced, never raised on: nothing of ours is compared equal to such a value anyway."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def flat_triggers(triggers: Triggers | None) -> list[str]:
    """[n, field, value, ...] as the scripts take a trigger (or own-write) map; n = 0 (no
    triggers) records `*` on an add."""
    if not triggers:
        return ["0"]
    out = [str(len(triggers))]
    for name, value in triggers.items():
        out += (name, str(value))
    return out


def merge_trigger(into: dict[str, str], name: str, value: str) -> None:
    """The scripts' merge rule, in Python: a version keeps the highest (numerically), a
    `#gone` uid or `*` the last."""
    old = into.get(name)
    if old is not None and name != UNTRIGGERED and not name.endswith(GONE):
        try:
            if int(old) >= int(value):
                return
        except ValueError:
            pass
    into[name] = value


def reply_int(value: Any, default: int = 0) -> int:
    """A number from a script's reply, bounded: an integer reply as it is, a decimal text of
    at most 19 ASCII digits (an optional "-") as its value, anything else `default`. The
    scripts check what they read from Redis before they reply with it; this is the Python
    side's guard, so one key's garbage can never raise out of a call every job makes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = _s(value) if isinstance(value, (bytes, str)) else ""
    digits = text[1:] if text.startswith("-") else text
    if 0 < len(digits) <= 19 and digits.isascii() and digits.isdigit():
        return int(text)
    return default


def parse_lease(value: str) -> tuple[int, str] | None:
    """(fence, holder token) of a lease value "<fence>|<token>", or None when it is not one
    (someone else's text): the fence at most 19 ASCII digits, so `int()` is exact and cheap."""
    head, sep, token = value.partition("|")
    if not sep or not token or not (0 < len(head) <= 19 and head.isascii() and head.isdigit()):
        return None
    return int(head), token


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


@dataclass(frozen=True, slots=True)
class Started:
    value: str
    fence: int
    queued_ms: int | None
    failures: int
    triggers: dict[str, str] = field(default_factory=dict)  # as recorded, `*` included


@dataclass(frozen=True, slots=True)
class Busy:
    holder: str


class DoneOutcome(enum.StrEnum):
    """How `done` left a key (the script's reply, spelled as `done.lua` spells it)."""

    SUCCESS = "success"  # the run succeeded: failures and error cleared
    RETRY = "retry"  # the run failed: it runs again after `Done.delay_ms`
    DEAD = "dead"  # the run failed `max_failures` times in a row: dead-lettered
    RELEASED = "released"  # a lease given back without accounting (secondary, abandoned)
    LOST = "lost"  # the lease was no longer the caller's: nothing was touched


class Skip(enum.StrEnum):
    """Why a delivered message did not run (`start.lua`'s replies, and "busy")."""

    BUSY = "busy"  # another holder runs the key now: it runs again after that holder
    STALE = "stale"  # the key is not waiting: an earlier delivery already ran it
    OWN = "own"  # every trigger is a version the key's own runs wrote: nothing to see


@dataclass(frozen=True, slots=True)
class Done:
    outcome: DoneOutcome
    rerun: bool
    delay_ms: int | None
    failures: int
    message_needed: bool = False  # re-added with no message on its way: call `requeue`


def _repaired(key: str, repairs: Any) -> None:
    """Log what a script found unreadable in Redis on its way and repaired (lib.lua)."""
    text = _s(repairs) if repairs else ""
    if text:
        log.warning("%s: repaired Redis contents someone else wrote: %s", key, text)


def own_fence(key: str, value: str) -> int:
    """The fence of a lease value a script has just built from the counter's exact text."""
    parsed = parse_lease(value)
    if parsed is None:  # the scripts build "<digits>|<token>": only a bug gets here
        raise RuntimeError(f"{key}: the lease script returned {value[:60]!r}")
    return parsed[0]


class Scripts:
    """Typed Python entry points to the scripts, bound to one client and layout.

    Each thread calls through its own single-connection client on the shared pool: a worker
    thread makes two script calls per job, and skipping the pool's per-command checkout
    (a lock and a poll() syscall to check the connection is clean) is a measured ~10 % of
    keyed throughput.
    """

    def __init__(self, client: redis.Redis, layout: Layout) -> None:
        self.client = client
        self.layout = layout
        lib = library(layout)
        self._scripts = {
            name: client.register_script(lib + body) for name, body in BODIES.items()
        }
        self._head = {name: self._head_of(s.sha) for name, s in self._scripts.items()}
        self._local = threading.local()

    def _thread_client(self) -> redis.Redis:
        conn: redis.Redis | None = getattr(self._local, "client", None)
        if conn is None:
            pool = self.client.connection_pool
            conn = redis.Redis(connection_pool=pool, single_connection_client=True)
            self._local.client = conn
        return conn

    def _call(self, name: str, *args: Any, client: Any = None) -> Any:
        script = self._scripts[name]
        if client is not None:  # a pipeline: it loads the script itself
            return script(keys=[], args=args, client=client)
        # EVALSHA straight through (no Script.__call__ layers), its constant head encoded
        # once: two of these per job, and redis-py packs every argument of every call.
        conn = self._thread_client()
        try:
            return conn.execute_command("EVALSHA", *self._head[name], *args)
        except redis.exceptions.NoScriptError:
            script.sha = conn.script_load(script.script)
            self._head[name] = self._head_of(script.sha)
            return conn.execute_command("EVALSHA", *self._head[name], *args)

    def _head_of(self, sha: str) -> tuple[bytes, ...]:
        return (sha.encode(), b"0")  # no KEYS: the names are in the script (`head`)

    def add(
        self,
        items: Sequence[tuple[str, str, bytes] | tuple[str, str, bytes, Triggers | None]],
        client: Any = None,
    ) -> list[str]:
        """(key, rid, body[, triggers]) per key; no triggers records `*`."""
        flat: list[Any] = []
        for item in items:
            flat += (item[0], item[1], item[2], *flat_triggers(item[3] if len(item) > 3 else None))
        result = self._call("add", *flat, client=client)
        return result if client is not None else [_s(r) for r in result]

    def add_after(self, key: str, delay_ms: int, triggers: Triggers | None = None) -> str:
        return _s(self._call("add_after", key, delay_ms, *flat_triggers(triggers)))

    def park(self, key: str, on: str, fallback_ms: int,
             triggers: Triggers | None = None) -> str:
        return _s(self._call("park", key, on, fallback_ms, *flat_triggers(triggers)))

    def start(
        self, key: str, token: str, ttl_ms: int, ack: tuple[str, str] = ("", "")
    ) -> Started | Busy | Skip:
        """`ack`: (dramatiq acks key or "", redis message id) of the delivery: acked here if
        it is skipped. A `Skip` is the reason of a skip with no holder: STALE or OWN."""
        r = self._call("start", key, token, ttl_ms, *ack)
        if not isinstance(r, list):
            return Skip(_s(r))  # stale | own
        if _s(r[0]) == Skip.BUSY:
            return Busy(_s(r[1]))
        if _s(r[0]) in (Skip.STALE, Skip.OWN):  # skipped, after repairing a lease key
            _repaired(key, r[1])
            return Skip(_s(r[0]))
        value = _s(r[1])
        _repaired(key, r[4])
        queued = reply_int(r[2], -1)
        trig = _pairs(r[5:]) if len(r) > 5 else {}
        return Started(value, own_fence(key, value), None if queued < 0 else queued,
                       reply_int(r[3]), trig)

    def acquire(self, key: str, token: str, ttl_ms: int) -> tuple[str, int] | Busy:
        r = self._call("acquire", key, token, ttl_ms)
        if _s(r[0]) == Skip.BUSY:
            return Busy(_s(r[1]))
        _repaired(key, r[3])
        value = _s(r[1])
        return value, own_fence(key, value)

    def renew(self, ttl_ms: int, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        if not pairs:
            return []
        flat = [x for p in pairs for x in p]
        return [bool(x) for x in self._call("renew", ttl_ms, *flat)]

    def done(
        self,
        key: str,
        value: str,
        mode: str,
        *,
        ack: tuple[str, str] = ("", ""),
        writes: Mapping[str, Triggers] | None = None,
        error: str = "",
        base_ms: int = 5,
        cap_ms: int = 60_000,
        max_failures: int = 8,
        dead: tuple[str, bytes] = ("", b""),
    ) -> Done:
        """`ack`: (dramatiq acks key, redis message id) of the delivered message to ack;
        `writes`: key -> own writes (field -> version or uid): this run's record for `key`
        (replaced on ok/fail, merged on release), merged for other keys."""
        if mode == "fail":
            extra: tuple[Any, ...] = (error, base_ms, cap_ms, max_failures, *dead)
        else:
            extra = ()
        groups = [(k, w) for k, w in (writes or {}).items() if w]
        own: list[Any] = [len(groups)]
        for target, fields in groups:
            own += (target, *flat_triggers(fields))
        r = self._call("done", key, value, mode, *ack, *own, *extra)
        if not isinstance(r, list):
            return Done(DoneOutcome(_s(r)), False, None, 0)
        delay = reply_int(r[2], -1)
        return Done(
            DoneOutcome(_s(r[0])), bool(reply_int(r[1])), None if delay < 0 else delay,
            reply_int(r[3]), bool(reply_int(r[4])),
        )

    def requeue(self, triples: Sequence[tuple[str, str, bytes]]) -> list[str]:
        flat = [x for t in triples for x in t]
        return [_s(r) for r in self._call("requeue", *flat)]

    def due(self, which: str, limit: int) -> list[str]:
        return [_s(k) for k in self._call("due", which, limit)]

    def promote(self, triples: Sequence[tuple[str, str, bytes]]) -> list[str]:
        flat = [x for t in triples for x in t]
        return [_s(r) for r in self._call("promote", *flat)]

    def recover(
        self, error: str, max_failures: int, items: Sequence[tuple[str, str, bytes, str, bytes]]
    ) -> list[str]:
        flat = [x for t in items for x in t]
        return [_s(r) for r in self._call("recover", error, max_failures, *flat)]

    def orphans(self, keys: Sequence[str]) -> list[str]:
        if not keys:
            return []
        return [_s(k) for k in self._call("orphans", *keys)]

    def repair(self, triples: Sequence[tuple[str, str, bytes]]) -> list[str]:
        flat = [x for t in triples for x in t]
        return [_s(r) for r in self._call("repair", *flat)]

    def redrive(self, dead_rid: str, key: str | None, rid: str, body: bytes) -> str:
        return _s(self._call("redrive", dead_rid, key or "", rid, body))

    def unexpiring(self, ttl_ms: int, keys: Sequence[str]) -> list[str]:
        """Repair the lease keys of `keys` that still have no expiry (`unexpiring.lua`):
        "expiring" (given `ttl_ms`: a run is in flight), "deleted" or "ok", per key."""
        if not keys:
            return []
        return [_s(r) for r in self._call("unexpiring", ttl_ms, *keys)]

    def lift_fence(self, seen: int) -> int:
        """Raise the fence counter to at least `seen`, capped at `FENCE_CEILING` (atomically;
        never lowers it); returns the counter, so the next acquisition's fence is above it.
        Sent and answered as exact decimal text (the script never makes it a Lua number)."""
        capped = min(max(0, int(seen)), FENCE_CEILING)
        return reply_int(self._call("lift_fence", str(capped)), capped)

    def nack(self, acks: str, rid: str, messages: str) -> bool:
        """Dead-letter a delivery dramatiq rejected, into the main queue's `.XQ`."""
        return bool(self._call("nack", acks, rid, messages))

    def reclaim(self, acks: str, queue: str, rids: Sequence[str]) -> int:
        """Put deliveries of `acks` (a live worker's, on dramatiq queue `queue`) that its
        consumer does not hold back on their queue, each only if still unacked."""
        if not rids:
            return 0
        layout = self.layout
        return int(self._call("reclaim", acks, layout.messages_list_of(queue),
                              layout.messages_of(queue), *rids))
