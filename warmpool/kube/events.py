"""Aggregated core/v1 Events: one Event per cause, its `count` raised each time it recurs.

A resync reports the same problem (an invalid AppDefinition, a foreign owner) every time it
runs; an Event created each time buried the namespace's events under copies and made
`kubectl get events` useless. client-go's EventCorrelator aggregates in memory and loses the
count on a restart; here the Event's name is derived from its cause (the object it regards,
its reason, its type, its source), so any process, before or after a restart, finds the one
Event of a cause on the server and raises its count. The number of Events is then bounded by
the number of causes (objects times reasons), never by the number of job runs.

The decision (`plan_event`) is pure; `warmpool.kube.api.Kube.event` decides and writes. The
count is raised by a merge patch carrying the resourceVersion it was read at, so two
processes raising it at once cannot both write the same count: the loser re-reads. What this
process last wrote of each Event is remembered (`Recorded`, bounded), so a recurrence costs
one PATCH and a new cause one POST; only a conflict (another writer, an expired Event) costs
a GET.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmpool.pool.meta import meta_of

#: The server refuses a longer message; a longer one is cut here.
MESSAGE_LIMIT = 1024
#: An Event's name is a DNS subdomain (at most 253 characters): the object's name, cut to
#: leave room for the dot and the cause's digest.
_NAME_ROOM = 253 - 1 - 16


@dataclass(frozen=True)
class Cause:
    """What makes two Events the same Event: who reports what about which object."""

    namespace: str
    regarding: Mapping[str, str]
    reason: str
    warning: bool
    component: str = "warmpool"

    @property
    def type(self) -> str:
        return "Warning" if self.warning else "Normal"


def event_name(cause: Cause) -> str:
    """The deterministic name of a cause's Event: `<object name>.<digest of the cause>`.

    The uid of the object is part of the cause when known, so an object re-created under the
    same name starts its own Event, as kubectl's `describe` expects (it matches by uid)."""
    reg = cause.regarding
    key = "\x00".join((cause.namespace, reg.get("apiVersion", ""), reg.get("kind", ""),
                       reg.get("name", ""), reg.get("uid", ""), cause.reason, cause.type,
                       cause.component))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    base = (reg.get("name") or "warmpool")[:_NAME_ROOM].rstrip(".-")
    return f"{base}.{digest}"


@dataclass(frozen=True)
class CreateEvent:
    """No Event of this cause yet (or it expired): create it with count 1."""

    body: dict[str, Any]


@dataclass(frozen=True)
class BumpEvent:
    """The cause's Event exists at `resource_version`: raise its count by this merge patch."""

    name: str
    resource_version: str
    patch: dict[str, Any]


EventWrite = CreateEvent | BumpEvent


def plan_event(
    cause: Cause, message: str, now: str, existing: Mapping[str, Any] | None,
) -> EventWrite:
    """The write that records one more occurrence of `cause` at `now` (RFC 3339).

    `existing`: the Event named `event_name(cause)` as read (None: there is none). Its count
    is raised and its message and lastTimestamp replaced by the newest; an Event without a
    resourceVersion (never from the server) is created again rather than written unguarded."""
    name = event_name(cause)
    text = message[:MESSAGE_LIMIT]
    rv = str(meta_of(existing).get("resourceVersion") or "")
    if existing is not None and rv:
        count = existing.get("count")
        previous = count if isinstance(count, int) and count > 0 else 1
        return BumpEvent(name, rv, {"count": previous + 1, "lastTimestamp": now,
                                    "message": text})
    return CreateEvent({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": cause.namespace},
        "involvedObject": {**cause.regarding, "namespace": cause.namespace},
        "reason": cause.reason, "message": text, "type": cause.type,
        "source": {"component": cause.component},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    })


class Recorded:
    """The Events this process last wrote, by name: their resourceVersion and count, as the
    server answered (at most `size`, the least recently written forgotten first: a
    forgotten one is created, found to exist, and read once)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._seen.get(name)

    def wrote(self, name: str, event: Mapping[str, Any]) -> None:
        stub = {"metadata": {"resourceVersion": meta_of(event).get("resourceVersion")},
                "count": event.get("count")}
        with self._lock:
            self._seen[name] = stub
            self._seen.move_to_end(name)
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)

    def forget(self, name: str) -> None:
        with self._lock:
            self._seen.pop(name, None)
