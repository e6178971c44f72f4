"""A pool whose pods cannot start (issue #28): its condition, its Warning, and the gate that
stops it making more. The decisions are `warmpool.pool.health`'s; this reads and writes."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from warmpool.controller.guard import Unguarded
from warmpool.kube.api import Kube, KubeError
from warmpool.kube.executor import Executor
from warmpool.kube.reader import Reader
from warmpool.pool import health
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.health import PoolHealth
from warmpool.pool.meta import meta_of, resource_version_of
from warmpool.pool.model import AppDefinition

log = logging.getLogger(__name__)


def report_pool_health(reader: Reader, kube: Kube, appdef: AppDefinition) -> PoolHealth | None:
    """The pool's health (None where the reader does not know its pods), and its condition
    on the AppDefinition's status brought up to date, with a Warning when it starts failing.

    Safe on a stale read: the status write tests the AppDefinition's resourceVersion and
    generation as read (a JSON patch of the status subresource: its `test` operations are
    the preconditions there), so a condition about an older template, or decided on a
    status someone changed since, is refused (422) and left to the next resync, which reads
    again. The condition says what the pods were; it decides nothing (the gate reads the
    pods themselves, `may_create`)."""
    found = reader.pool_health(appdef.namespace, appdef)
    if found is None:
        return None
    obj = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, appdef.namespace, appdef.name)
    if obj is None or meta_of(obj).get("generation") != appdef.generation:
        return found  # gone, or another template since: the next resync reads it
    status = obj.get("status")
    previous = health.find_condition(status)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    wanted = health.condition(found, appdef.generation, now, previous)
    if not health.needs_write(previous, wanted):
        return found
    try:
        kube.json_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, appdef.namespace, appdef.name,
                        _condition_ops(obj, wanted), status=True)
    except KubeError as exc:
        if exc.status not in (404, 409, 422):
            raise
        log.info("AppDefinition %s changed before its pool condition was written (%s): the "
                 "next resync writes it", appdef.name, exc.status)
        return found
    if health.starts_failing(previous, wanted):
        Executor(kube, appdef.namespace, Unguarded()).apply([health_report(appdef, wanted)])
    return found


def health_report(appdef: AppDefinition, wanted: dict[str, Any]) -> Report:
    """The Warning on the AppDefinition when its pool stops making instances."""
    return Report("PodsFailing", f"AppDefinition {appdef.name}: {wanted['message']}",
                  regarding={"kind": v.APPDEF_KIND, "name": appdef.name,
                             "apiVersion": v.APPDEF_API_VERSION})


def _condition_ops(obj: dict[str, Any], wanted: dict[str, Any]) -> list[dict[str, Any]]:
    """Test the version and generation read; then put our condition in the status, keeping
    every other condition (and the rest of the status) as read."""
    meta = meta_of(obj)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version_of(obj)},
        {"op": "test", "path": "/metadata/generation", "value": meta.get("generation")}]
    status = obj.get("status")
    if not isinstance(status, dict):
        return [*ops, {"op": "add", "path": "/status", "value": {"conditions": [wanted]}}]
    conditions = status.get("conditions")
    kept = [c for c in conditions if not (isinstance(c, dict)
                                          and c.get("type") == health.CONDITION)
            ] if isinstance(conditions, list) else []
    return [*ops, {"op": "add", "path": "/status/conditions", "value": [*kept, wanted]}]


def may_create_instances(reader: Reader, appdef: AppDefinition) -> bool:
    """Whether the pool may make a missing instance now (`health.may_create`)."""
    return health.may_create(reader.pool_health(appdef.namespace, appdef))
