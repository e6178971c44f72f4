"""Whether a pool's pods start: its free instances split into warm, starting and failing, and
whether it may make more. Pure, like `decide`.

A pool whose image cannot be pulled, or whose containers crash, shows every instance as free
and keeps making new ones that never start (issue #28). So its instances' pods are counted
(`warmpool.pool.pods.warmth`): once `FAILURE_CAP` instances of the current template cannot
start their pod, the pool makes no new instance; the existing ones stay (the kubelet keeps
retrying their pods with its own backoff, up to five minutes between image pulls), and as soon
as fewer than the cap fail (the image appears, the registry answers again) the pool fills
again. A new template replaces the failing Deployments, whose new pods are counted afresh, so
a fixed AppDefinition is never held back by its predecessor's failures. The pool says so in
a condition on the AppDefinition's status, a Warning event when it starts, and a metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from warmpool.pool.pods import Warmth

#: Instances whose pod cannot start before the pool stops making more.
FAILURE_CAP = 3
#: The condition's type on the AppDefinition's status.
CONDITION = "WarmPoolPodsFailing"


@dataclass(frozen=True, slots=True)
class PoolHealth:
    """How many instances of a pool have a Ready pod, one being made, one that cannot start;
    `reasons`: the failure reasons seen (`pods.FAILURE_REASONS` only), sorted."""

    warm: int = 0
    starting: int = 0
    failing: int = 0
    reasons: tuple[str, ...] = ()

    @property
    def capped(self) -> bool:
        """Too many pods fail to start: no new instance is made."""
        return self.failing >= FAILURE_CAP


def pool_health(warmths: Iterable[tuple[str, str]]) -> PoolHealth:
    """From each instance's (`Warmth`, failure reason)."""
    counts = {Warmth.WARM: 0, Warmth.STARTING: 0, Warmth.FAILING: 0}
    reasons: set[str] = set()
    for state, reason in warmths:
        counts[state] = counts.get(state, 0) + 1
        if reason:
            reasons.add(reason)
    return PoolHealth(counts[Warmth.WARM], counts[Warmth.STARTING], counts[Warmth.FAILING],
                      tuple(sorted(reasons)))


def may_create(health: PoolHealth | None) -> bool:
    """Whether a missing instance may be made: unless too many fail (None: pods unknown)."""
    return health is None or not health.capped


def describe(health: PoolHealth) -> str:
    failing = (f"{health.failing} failing ({', '.join(health.reasons)})" if health.failing
               else "0 failing")
    return f"{health.warm} warm, {health.starting} starting, {failing}"


def condition(health: PoolHealth, generation: int, now: str,
              previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The pool's condition for `health` at the AppDefinition's `generation` (`now`: RFC 3339,
    the transition time when its status changes; kept from `previous` otherwise)."""
    status = "True" if health.capped else "False"
    since = now
    if previous is not None and previous.get("status") == status:
        kept = previous.get("lastTransitionTime")
        since = kept if isinstance(kept, str) and len(kept) <= 40 else now
    if health.capped:
        message = (f"{health.failing} instances cannot start their pod "
                   f"({', '.join(health.reasons)}): no new instance is made until fewer than "
                   f"{FAILURE_CAP} fail or the template changes; {describe(health)}")
    else:
        message = f"Pods start: {describe(health)}"
    return {"type": CONDITION, "status": status,
            "reason": health.reasons[0] if health.capped and health.reasons else
            ("PodsFailing" if health.capped else "PodsStarting"),
            "message": message, "observedGeneration": generation,
            "lastTransitionTime": since}


def find_condition(status: object) -> Mapping[str, Any] | None:
    """The pool's condition in an AppDefinition's status as read (anyone with `patch` on
    its status writes it: only a mapping of our type is taken)."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == CONDITION:
            return c
    return None


#: What a condition is compared by: its message's counts move with every pod, and a status
#: write wakes the pool's resync (an AppDefinition event), so they never cause one.
_COMPARED = ("type", "status", "reason", "observedGeneration")


def needs_write(previous: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether the condition changed in what it says (its status, reason, generation), not in
    its counts; a pool that never failed gets none (nothing is written for a healthy pool)."""
    if previous is None:
        return bool(wanted["status"] == "True")
    return any(previous.get(k) != wanted[k] for k in _COMPARED)


def starts_failing(previous: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """The pool just stopped making instances: the moment for one Warning event."""
    return wanted["status"] == "True" and (previous is None or previous.get("status") != "True")
