"""A pool's schedule, kept by the pool's own job (issue #29): no timer outside the queue.

The pool's job (`resync_pool`, key ``pool/<ns>/<appdef>``) calls `keep_schedules` on every
run: it writes each PoolSchedule's status where it differs (``effectiveTarget``,
``nextChange``, ``message``) and returns how long until the pool's target next changes. The
job returns that as its `requeue_after`, so the queue's delayed key, not a thread of the
leader, wakes the pool at the edge: the work runs on whichever worker takes the key, under
its lease, and a Redis that lost the key gets it back from the scheduler's resync (which
queues every pool, whose run derives the edge again). The target itself needs nothing here:
the readers apply the schedules to every AppDefinition they hand a decision (their `now()`
is the API server's clock, never this host's), so a run at or after the edge sizes the pool
to the new target.
"""

from __future__ import annotations

import logging
from typing import Any

from warmpool.kube.api import Kube, KubeError
from warmpool.kube.reader import Reader
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import name_of, resource_version_of, uid_of
from warmpool.pool.model import AppDefinition, Invalid
from warmpool.pool.schedule import timetable

log = logging.getLogger(__name__)

#: The least a pool waits for its next edge. The cluster's clock as read lags the server's by
#: up to a second (its Date header is truncated): a run that comes a moment before the edge
#: on that reading looks again this much later, instead of at once.
MIN_WAIT = 0.1


def keep_schedules(
    reader: Reader, kube: Kube, namespace: str, name: str,
    appdef: AppDefinition | Invalid | None,
) -> float | None:
    """Write the status of each PoolSchedule naming `name` where it differs from the read;
    return the seconds until the pool's target next changes (None: no change ahead).

    `appdef`: the AppDefinition as specified (`reader.appdef(..., as_specified=True)`)."""
    objects = reader.schedules(namespace)
    if not objects:
        return None
    now = reader.now()
    table = timetable(name, appdef, objects, now)
    for obj, status in table.statuses:
        _write_status(reader, kube, namespace, obj, status)
    if table.next_change is None:
        return None
    return max(MIN_WAIT, (table.next_change - now).total_seconds())


def _write_status(reader: Reader, kube: Kube, namespace: str, obj: Any,
                  status: dict[str, Any]) -> bool:
    """JSON-patch the schedule's status unless the read already shows it; whether it wrote.

    Safe on a stale read: the patch first tests the uid and the resourceVersion the status
    was computed from, so a schedule re-created under the name since is not told its
    predecessor's target, and one whose spec (or status) changed since is not given a
    verdict on the old spec (a 422; the change's event queues the pool, whose next run
    decides on it). The status is wholly ours, so it is set whole. Two runs of the pool
    cannot interleave (the pool's key runs in one worker at a time)."""
    shown = obj.get("status") or {}
    if all(shown.get(k) == value for k, value in status.items()):
        return False
    name = name_of(obj)
    rv = resource_version_of(obj)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": uid_of(obj)},
        *([{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []),
        {"op": "add", "path": "/status", "value": {**shown, **status}}]
    try:
        written = kube.json_patch(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, namespace, name,
                                  ops, status=True)
    except KubeError as exc:
        if exc.status not in (404, 422):
            raise
        log.info("PoolSchedule %s/%s changed or went away since it was read: its status is "
                 "the next run's", namespace, name)
        return False
    if isinstance(written, dict):
        written.setdefault("kind", v.SCHEDULE_KIND)
        reader.wrote(written)  # the next run reads it, not the status before it
    return True
