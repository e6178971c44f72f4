"""The metric vocabulary shared by every exporter: label values, buckets, and the one
function that turns a work key into a label (its kind, never the key itself).

Labels are limited to the job kind, the result and the AppDefinition: never an instance
id, a Session name or an e-mail address, so a series' cardinality does not grow with use.
"""

from __future__ import annotations

from warmpool.pool import vocabulary as v
from warmpool.pool.parts import POOL_KIND_NAMES
from warmpool.queue.scripts import Skip

KINDS = ("instance", "session", "pool", "timeout", "probe", "sweep")
OTHER_KIND = "other"  # a key of no known kind (never exported with the key itself)

# warmpool_reconcile_total{result}
SUCCESS, ERROR, REQUEUE, CONFLICT = "success", "error", "requeue", "conflict"
RESULTS = (SUCCESS, ERROR, REQUEUE, CONFLICT)

# warmpool_pool_instances{state}; "retired" instances are not in the pool (not exported)
POOL_STATES = ("free", "claimed", "outdated")

# warmpool_workqueue_skipped_total{result}: a delivered message that did not run
SKIP_RESULTS: tuple[str, ...] = tuple(Skip)

# warmpool_scheduler_*{kind}: the watched object kinds
WATCHED_KINDS = (v.APPDEF_KIND, v.SESSION_KIND, *POOL_KIND_NAMES)
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")
RESYNC_REASONS = ("startup", "new_leader", "periodic", "redis_lost")

# warmpool_refused_inputs_total{kind}
REFUSED_KINDS = ("session", "appdefinition")

# Seconds. Queue waits and job runs: milliseconds to minutes.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)
# Session created -> HANDLED: a fraction of a second (creationTimestamp has 1 s resolution)
# to the minutes a Session may wait for a free instance.
CLAIM_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# A job that found a lease it needs busy, until it got one: milliseconds, rarely seconds.
LEASE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def kind_of(key: str) -> str:
    """The kind of a work key ("instance/ns/app/3" -> "instance"), "other" if unknown."""
    kind = key.split("/", 1)[0]
    return kind if kind in KINDS else OTHER_KIND


def reason_label(reason: str) -> str:
    """A resync reason as a label value ("new leader" -> "new_leader")."""
    return "_".join(reason.split()) or "unknown"
