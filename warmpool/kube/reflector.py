"""List, then watch one kind in one namespace (or all), like client-go's reflector.

The one list-watch of the project: the scheduler's watches (keys from events) and the workers'
caches (decisions from memory) both run on it.

- LIST in pages (``page_size`` items each, as client-go's reflector does: a pool of thousands
  of objects is never one response held in memory at once), then WATCH from the list's
  resourceVersion with bookmarks; every watch asks the server to end it after a random
  5-10 min (``timeout_range``), and the next one resumes from the last resourceVersion seen
  (an event's or a bookmark's), so nothing is listed again.
- A dropped connection or any other error: wait (``Backoff``, 0.8 s doubling to 30 s with
  jitter, reset after 2 min without failures) and resume the watch from the last
  resourceVersion; after ``relist_after_errors`` failures in a row without an event in
  between (a resourceVersion the server will not serve, for one), LIST again instead.
- 410 Gone (the resourceVersion was compacted away): LIST again and compare with the cache:
  new objects are reported ADDED, changed ones MODIFIED, and objects that vanished meanwhile
  DELETED, with the stub the cache kept as their last state.

The cache maps (namespace, name) to ``summarize(kind, obj)``: what its reader keeps of an
object (the scheduler a stub for its mapping, a worker the fields its decisions read), so
nothing else of the object outlives its decoding. Events go to `handler(event_type, obj,
old)` where `old` is the cached summary (None if unknown). The first LIST of a reflector is
silent unless ``report_first_list`` (the scheduler's startup resync covers what it holds; a
worker cache indexes it); every later LIST reports differences.

`hold()` / `resume()` park the loop between two watches (tests: disconnect the watch, change
and compact, then resume from a compacted resourceVersion).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warmpool.kube.api import Gone, Kube, as_kind
from warmpool.pool.meta import name_of, namespace_of, resource_version_of, uid_of

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
EVENT_TYPES = (ADDED, MODIFIED, DELETED)

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]
Summarize = Callable[[str, dict[str, Any]], dict[str, Any]]
CacheKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Watched:
    """What to watch: a kind, its apiVersion, and an optional label selector.

    For Theia Cloud's AppDefinition and Session the apiVersion names the kind's group; the
    version listed and watched is the cluster's (`Kube.served_api_version`), and the items
    come with it (`Kube.list_pages`). `metadata_only`: list and watch the objects' metadata
    alone (`warmpool.kube.api.METADATA_ONLY`), for a reader that keeps nothing else of them:
    the server encodes, and this process decodes, a fraction of each object. Built-in kinds
    only: their objects are typed with `api_version` as given (a Theia Cloud kind's is the
    cluster's line, and its readers keep its spec anyway)."""

    kind: str
    api_version: str
    label_selector: str | None = None
    field_selector: str | None = None
    metadata_only: bool = False


class Backoff:
    """client-go's reflector backoff: initial 0.8 s, x2 per failure, cap 30 s, jitter 1.0
    (a delay d becomes d + random * d, capped), reset after 2 min without a failure."""

    def __init__(
        self, initial: float = 0.8, cap: float = 30.0, factor: float = 2.0, jitter: float = 1.0,
        reset_after: float = 120.0, *, clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial, self.cap, self.factor, self.jitter = initial, cap, factor, jitter
        self.reset_after = reset_after
        self.clock, self.rand = clock, rand
        self._delay = 0.0
        self._last = -float("inf")

    def next(self) -> float:
        now = self.clock()
        if now - self._last > self.reset_after:
            self._delay = 0.0
        self._last = now
        self._delay = self.initial if self._delay == 0 else min(self.cap, self._delay * self.factor)
        return min(self.cap, self._delay * (1 + self.jitter * self.rand()))

    def reset(self) -> None:
        self._delay = 0.0


def is_gone(exc: BaseException) -> bool:
    """410 from the API server: ``Gone`` from ``Kube``, or the client's own ApiException that
    its Watch raises on an ERROR event when a timeout is set (``Kube.watch`` misses that)."""
    return isinstance(exc, Gone) or getattr(exc, "status", None) == 410


def _cache_key(obj: dict[str, Any]) -> CacheKey:
    return (namespace_of(obj), name_of(obj))


def rv_number(raw: str | None) -> int:
    """A resourceVersion as a number: etcd's revision, an int64, so at most 19 ASCII digits;
    0 for anything else (missing, empty, too long, or digits `int` would refuse, such as
    non-ASCII ones `str.isdigit` accepts). The one place a version is parsed."""
    if not raw or len(raw) > 19 or not (raw.isascii() and raw.isdigit()):
        return 0
    return int(raw)


def rv_int(obj: dict[str, Any] | None) -> int:
    """An object's resourceVersion as a number (`rv_number`)."""
    return rv_number(resource_version_of(obj))


#: A watch open at least this long (or that brought events) before it failed worked: its end
#: is not counted towards the backoff (client-go calls a shorter one without events a "very
#: short watch", an error).
WORKING_WATCH_SECONDS = 1.0

@dataclass
class ReflectorStats:
    lists: int = 0
    relists_after_gone: int = 0
    watches: int = 0
    errors: int = 0
    events: int = 0
    last_error: str | None = None
    synced_at: float | None = None


@dataclass
class Reflector:
    kube: Kube
    watched: Watched
    namespace: str | None
    handler: Handler
    summarize: Summarize
    timeout_range: tuple[float, float] = (300.0, 600.0)
    backoff: Backoff = field(default_factory=Backoff)
    stats: ReflectorStats = field(default_factory=ReflectorStats)
    relist_after_errors: int = 3
    stuck_grace: float = 120.0  # a watch still open this long after its timeout is stuck
    report_first_list: bool = False
    page_size: int = 500

    def __post_init__(self) -> None:
        self.cache: dict[CacheKey, dict[str, Any]] = {}
        self.last_rv: str | None = None
        # The cache is the server's state as of this version (set with each change, under
        # the lock; `last_rv` moves only after the handlers): what `offer` compares against.
        self._applied_rv = 0
        self.synced = threading.Event()
        self._lock = threading.Lock()
        self._need_list = True
        self._failures = 0  # consecutive, without an event or a clean end of watch between
        self._watch_deadline: float | None = None  # monotonic; set while a watch is open
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._parked = threading.Event()

    @property
    def name(self) -> str:
        return f"{self.watched.kind}@{self.namespace or '*'}"

    # --- life cycle -------------------------------------------------------------------------

    def start(self, stop: threading.Event | None = None) -> threading.Thread:
        if stop is not None:
            self._stop = stop
        self._thread = threading.Thread(target=self.run, name=f"reflector-{self.name}",
                                        daemon=True)
        self._thread.start()
        return self._thread

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stuck(self) -> bool:
        """A watch the server should have ended long ago is still open: the connection is
        half-open (no client-side read timeout reaches through the client's Watch), so
        events would silently stop. /healthz reports it, so the process gets restarted."""
        deadline = self._watch_deadline
        return deadline is not None and time.monotonic() > deadline

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def hold(self, wait: float | None = None) -> bool:
        """Start no new watch after the current one ends; with `wait`, wait up to that long
        until the loop is parked (no watch open). Returns whether it is parked."""
        self._go.clear()
        if wait is None:
            return self._parked.is_set()
        return self._parked.wait(wait)

    def resume(self) -> None:
        self._go.set()

    # --- cache ------------------------------------------------------------------------------

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.cache.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.cache.get((namespace, name))

    def offer(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Keep `obj` (a write's response, or a direct read) if it is newer than the cached
        version; returns its summary then, else None.

        client-go's mutation cache does the same for a controller that must read its own
        writes before the watch delivers them. When the watch then brings that version it
        finds it already cached and reports nothing; anything newer replaces it as usual.
        resourceVersions are compared as integers, as that cache does: etcd's revisions.

        An object the cache does not hold, at a version the cache already reflects, is
        refused: the watch brought that version (or the list held it), so its absence means
        a deletion (or its labels leaving the selector) came after it. Kept, a write's answer
        or a direct read that was sent before the deletion and offered after its event
        brought the object back for good: no later event would remove it, the instance's
        decisions would see an object that is gone, and a resync would find nothing to do
        (the chaos tier's seed 2 once: a held instance's deleted allow-list never rebuilt).
        """
        obj.setdefault("kind", self.watched.kind)
        obj.setdefault("apiVersion", self.watched.api_version)
        key = _cache_key(obj)
        with self._lock:
            old = self.cache.get(key)
            if old is None and 0 < rv_int(obj) <= self._applied_rv:
                return None
            if old is not None and rv_int(old) >= rv_int(obj):
                return None
            summary = self.summarize(self.watched.kind, obj)
            self.cache[key] = summary
        return summary

    def offer_gone(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """Forget the object `uid` at (namespace, name) that a delete (or a 404) says is gone;
        returns the summary dropped. Another uid under that name is a newer object: kept."""
        with self._lock:
            old = self.cache.get((namespace, name))
            if old is None or (uid and uid_of(old) != uid):
                return None
            return self.cache.pop((namespace, name))

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        stop = self._stop
        while not stop.is_set():
            self._wait_for_go()
            if stop.is_set():
                break
            began, events_before = time.monotonic(), self.stats.events
            try:
                if self._need_list:
                    self.list_and_sync()
                self.watch_once()
                self._failures = 0
            except Exception as exc:
                if stop.is_set():
                    break
                if self._worked_then_cut(began, events_before):
                    # A watch that brought events, or stayed open a while, and was then cut:
                    # the server answers, so watch again after the first step of the backoff,
                    # not after the doubled delay of earlier failures. Otherwise a flapping
                    # link leaves the backoff at its 30 s cap, and once the link is healthy
                    # again the cache still misses every event for up to 30 s (the chaos
                    # long tier, seed 26: a held instance's deleted Service was seen only
                    # by the next resync, 25 s later). client-go's "very short watch" rule
                    # (under 1 s, no events) still decides what counts as a failure.
                    self.backoff.reset()
                if is_gone(exc):
                    # The resourceVersion is compacted away: list again, at once.
                    log.info("%s: watch from %s is gone (%s); relisting",
                             self.name, self.last_rv, exc)
                    self.stats.relists_after_gone += 1
                    self._need_list = True
                    continue
                self.stats.errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self._failures += 1
                if self._failures >= self.relist_after_errors:
                    self._need_list = True
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs from resourceVersion %s",
                            self.name, self.stats.last_error, delay, self.last_rv)
                stop.wait(delay)

    def _worked_then_cut(self, began: float, events_before: int) -> bool:
        return (self.stats.events > events_before
                or time.monotonic() - began >= WORKING_WATCH_SECONDS)

    def _wait_for_go(self) -> None:
        if self._go.is_set():
            return
        self._parked.set()
        try:
            while not self._go.wait(0.1) and not self._stop.is_set():
                pass
        finally:
            self._parked.clear()

    def list_and_sync(self) -> None:
        """LIST, replace the cache, report the differences (silently on the first list)."""
        w = self.watched
        fresh: dict[CacheKey, dict[str, Any]] = {}
        rv = ""
        for items, page_rv in self.kube.list_pages(w.api_version, w.kind, self.namespace,
                                                   label_selector=w.label_selector,
                                                   field_selector=w.field_selector,
                                                   page_size=self.page_size,
                                                   metadata_only=w.metadata_only):
            rv = page_rv
            for item in items:
                self._type(item)
                fresh[_cache_key(item)] = self.summarize(w.kind, item)
        self.stats.lists += 1
        report = self.synced.is_set() or self.report_first_list
        with self._lock:
            old_cache = self.cache
            self.cache = fresh
            self._applied_rv = rv_number(rv)
        self._need_list = False
        if report:
            for key, obj in fresh.items():
                old = old_cache.get(key)
                if old is None:
                    self._emit(ADDED, obj, None)
                elif resource_version_of(old) != resource_version_of(obj):
                    self._emit(MODIFIED, obj, old)
            for key, old in old_cache.items():
                if key not in fresh:
                    # Deleted while we were not watching: the stub is its last known state.
                    self._emit(DELETED, old, old)
        self.last_rv = rv  # after the handlers, as for a watch event
        self.stats.synced_at = time.time()
        self.synced.set()

    def watch_once(self) -> None:
        """One watch from the last resourceVersion until the server ends it (or stop)."""
        w = self.watched
        lo, hi = self.timeout_range
        timeout = max(1, round(random.uniform(lo, hi)))
        self.stats.watches += 1
        assert self.last_rv is not None
        self._watch_deadline = time.monotonic() + timeout + self.stuck_grace
        try:
            for event in self.kube.watch(w.api_version, w.kind, self.namespace,
                                         resource_version=self.last_rv,
                                         label_selector=w.label_selector,
                                         field_selector=w.field_selector,
                                         timeout_seconds=timeout,
                                         metadata_only=w.metadata_only):
                if self._stop.is_set():
                    return
                self._on_event(event)
        finally:
            self._watch_deadline = None

    def _on_event(self, event: dict[str, Any]) -> None:
        etype = event.get("type")
        obj = event.get("object") or {}
        rv = resource_version_of(obj)
        if etype == "BOOKMARK":
            if rv:
                with self._lock:
                    self._applied_rv = max(self._applied_rv, rv_int(obj))
                self.last_rv = rv
            return
        if etype not in EVENT_TYPES:
            log.debug("%s: ignoring event type %s", self.name, etype)
            return
        self._type(obj)
        key = _cache_key(obj)
        with self._lock:
            self._applied_rv = max(self._applied_rv, rv_int(obj))
            old = self.cache.get(key)
            if (etype != DELETED and old is not None and rv_int(old) > rv_int(obj)
                    and uid_of(old) == uid_of(obj)):
                # An offered write is newer than this event: the watch brings it later.
                if rv:
                    self.last_rv = rv
                return
            if etype == DELETED:
                self.cache.pop(key, None)
            else:
                self.cache[key] = self.summarize(self.watched.kind, obj)
        self._failures = 0
        self.stats.events += 1
        if etype != DELETED and old is not None and resource_version_of(old) == rv:
            if rv:
                self.last_rv = rv
            return  # seen already (a resumed watch may repeat the last event)
        if etype == ADDED and old is not None:
            etype = MODIFIED
        self._emit(etype, obj, old)
        # After the handler: `last_rv` says "everything up to here is in the cache and its
        # indexes" (ClusterCache.fresh reads it).
        if rv:
            self.last_rv = rv

    def _type(self, obj: dict[str, Any]) -> None:
        """Say the watched kind on `obj`: a list's items and a watch's objects of a built-in
        kind may leave it out; a metadata-only list's and watch's say PartialObjectMetadata
        (`Kube` hands both over as the server sent them; `as_kind` types them)."""
        w = self.watched
        if w.metadata_only:
            as_kind(obj, w.api_version, w.kind)
        else:
            obj.setdefault("kind", w.kind)
            obj.setdefault("apiVersion", w.api_version)

    def _emit(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        try:
            self.handler(etype, obj, old)
        except Exception:
            log.exception("%s: handler failed on %s %s", self.name, etype, _cache_key(obj))
