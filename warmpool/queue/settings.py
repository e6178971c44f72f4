"""Queue settings: one frozen dataclass shared by producers, workers and tools.

Every process that touches the queue must agree on the key layout (prefix, namespace, queue
name) and on the lease and backoff numbers, so they travel together as one picklable value
(it is handed to spawned worker processes as is).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_URL = "WARMPOOL_REDIS_URL"
ENV_PREFIX = "WARMPOOL_QUEUE_"
CLAIMS_SUFFIX = "-claims"
#: The longest prefix, namespace or queue name the settings take (each is in every key name).
NAME_LIMIT = 200


def claims_queue_name(queue_name: str) -> str:
    """The dramatiq queue claims (session keys) go to, next to `queue_name`."""
    return queue_name + CLAIMS_SUFFIX


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Numbers are seconds unless the name says otherwise.

    redis_url: None means "resolve one" (see `warmpool.queue.embedded.resolve_redis_url`).
    queue_name: dramatiq's queue for bulk work; claims go to `<queue_name>-claims`.
    prefix: prefix of the project's own keys (`warmpool:dirty`, `warmpool:lease:<key>`, ...).
    namespace: dramatiq's key namespace; keep `dramatiq` so dramatiq's tools read the queue.
    lease_ttl: a held key whose holder stops renewing is free again after this long.
    backoff_base/backoff_cap: per-key retry delay is base * 2**(failures-1), capped.
    max_failures: consecutive failures after which a key is dead-lettered.
    maintenance_period: how often each worker process promotes due delayed keys (without the
        doorbell; with it, the promoter sleeps until the earliest ready time, and this is
        the shortest time between two promotions).
    recovery_period: how often (cluster-wide, one process at a time) crashed holders' keys
        and dead workers' unacked messages are recovered.
    audit_period: how often dirty keys that lost their message are repaired.
    heartbeat_timeout: a worker process silent for this long is dead; its unacked messages
        are requeued (dramatiq's own default is 60 s and only on 0.1 % of calls).
    poll_timeout: the longest an idle consumer sleeps between fetches. An idle worker's
        first claim waits up to this long before anyone fetches it (dramatiq backs off to
        it after empty fetches), so it is part of a claim's latency; 20 ms costs each
        idle process about a hundred one-script fetches a second. With the doorbell
        listening (see `idle_poll_timeout`) it applies only while the doorbell is down, or
        to a delay queue's consumer holding messages for their eta (a consumer whose
        prefetch is full waits for an ack instead).
    idle_poll_timeout: with the doorbell (`warmpool.queue.doorbell`), how long an idle
        consumer, and the promoter of delayed keys, sleeps at most when no notification
        comes: what a lost notification (a reconnect, a failover) costs, at most. At or
        below `poll_timeout` there is no doorbell: idle consumers poll every `poll_timeout`
        and the promoter every `maintenance_period`, as before it.
    drain_timeout: how long a stopping worker waits for running jobs.
    batch: how many keys one maintenance script call handles.
    epoch_period: how often schedulers and worker processes read the Redis epoch (one GET),
        so a Redis that lost its data is noticed in seconds (see `warmpool.queue.epoch`).
    """

    redis_url: str | None = None
    queue_name: str = "warmpool"
    prefix: str = "warmpool:"
    namespace: str = "dramatiq"
    lease_ttl: float = 10.0
    backoff_base: float = 0.005
    backoff_cap: float = 60.0
    # 5 ms doubling reaches the 60 s cap at the 15th failure: 20 failures is about eight
    # minutes of consecutive errors (an API server outage outlasts that only rarely) before a
    # key is parked as a dead letter; the periodic resync re-adds it anyway.
    max_failures: int = 20
    maintenance_period: float = 0.02
    recovery_period: float = 1.0
    audit_period: float = 10.0
    heartbeat_timeout: float = 5.0
    poll_timeout: float = 0.02
    # On by default since issue #28's churn runs (12 Sessions/s during 1,000 -> 100, the same
    # code and machine one after the other): the doorbell cut the workers' CPU per served
    # Session 56 -> 49 ms and Redis's 9 -> 7 ms, with claims no slower. (Before the full
    # consumer waited for an ack, `_Consumer._wait_for_room`, it measured 2x slower.) At or
    # below `poll_timeout` it is off: consumers poll, as before it.
    idle_poll_timeout: float = 1.0
    drain_timeout: float = 30.0
    batch: int = 200
    epoch_period: float = 2.0

    def __post_init__(self) -> None:
        positive = (
            "lease_ttl",
            "backoff_base",
            "backoff_cap",
            "maintenance_period",
            "recovery_period",
            "audit_period",
            "heartbeat_timeout",
            "poll_timeout",
            "idle_poll_timeout",
            "epoch_period",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"queue setting {name} must be > 0, got {getattr(self, name)!r}")
        if self.max_failures < 1 or self.batch < 1:
            raise ValueError("queue settings max_failures and batch must be >= 1")
        if not self.queue_name or self.queue_name.endswith((".DQ", ".XQ")):
            raise ValueError(f"bad queue name {self.queue_name!r}")
        # The names become Lua string constants in the scripts (`scripts.head`): one line of
        # printable text, bounded, or a precise error here rather than a failed registration.
        for name in ("prefix", "namespace", "queue_name"):
            text = getattr(self, name)
            if len(text) > NAME_LIMIT or not text.isprintable():
                raise ValueError(f"queue setting {name} must be printable text of at most "
                                 f"{NAME_LIMIT} characters, got {text[:60]!r}")

    @property
    def claims_queue_name(self) -> str:
        return claims_queue_name(self.queue_name)

    @property
    def doorbell(self) -> bool:
        """Whether idle workers wait for the doorbell (else they poll, as before it)."""
        return self.idle_poll_timeout > self.poll_timeout

    @property
    def lease_ttl_ms(self) -> int:
        return int(self.lease_ttl * 1000)

    @property
    def renew_period(self) -> float:
        """Leases and the worker heartbeat are refreshed three times per the shorter timeout,
        so one lost round trip never lets either lapse."""
        return min(self.lease_ttl, self.heartbeat_timeout) / 3

    def replace(self, **changes: Any) -> QueueSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> QueueSettings:
        """`WARMPOOL_REDIS_URL`, and `WARMPOOL_QUEUE_<FIELD>` for any other field
        (e.g. `WARMPOOL_QUEUE_LEASE_TTL=15`); explicit overrides win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if env.get(ENV_URL):
            values["redis_url"] = env[ENV_URL]
        for field in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is None or field.name == "redis_url":
                continue
            # a str, int, float or bool (or None): its type parses the variable's text
            default: Any = field.default
            try:
                values[field.name] = type(default)(raw) if default is not None else raw
            except ValueError:  # float("abc"): say which variable, as the other settings do
                raise ValueError(f"{ENV_PREFIX}{field.name.upper()} must be "
                                 f"{'an integer' if type(default) is int else 'a number'}, "
                                 f"got {raw!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
