"""Work-queue keys: the unit of serialization.

A key names what a job converges, so two jobs with the same key must never run at once and
a key added many times while it waits runs once. Instance keys are the heart of it: every change
to instance k of an AppDefinition (reconcile, release, the deciding write of a claim) happens
while holding k's key. A claim starts keyed by its Session, because it does not know its instance
yet, and then takes the instance key of the id it tries.

The string form is stable (it is stored in Redis and shown by the queue tools), so parse and
format live together here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

_SEP = "/"


@dataclass(frozen=True, slots=True)
class InstanceKey:
    """Instance `id` of the AppDefinition named `appdef` (metadata.name) in `namespace`."""

    namespace: str
    appdef: str
    id: int
    kind = "instance"

    def __str__(self) -> str:
        return _SEP.join((self.kind, self.namespace, self.appdef, str(self.id)))


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A Session waiting for (or holding) an instance: the key of its claim job."""

    namespace: str
    session: str
    kind = "session"

    def __str__(self) -> str:
        return _SEP.join((self.kind, self.namespace, self.session))


@dataclass(frozen=True, slots=True)
class PoolKey:
    """A whole pool (one AppDefinition): the key of a resync job that fans out to instances."""

    namespace: str
    appdef: str
    kind = "pool"

    def __str__(self) -> str:
        return _SEP.join((self.kind, self.namespace, self.appdef))


Key = InstanceKey | SessionKey | PoolKey


def parse_key(text: str) -> Key:
    """Inverse of ``str(key)``; raises ValueError with the offending text on anything else."""
    parts = text.split(_SEP)
    try:
        match parts:
            case ["instance", ns, appdef, k] if ns and appdef and k.isdigit() and int(k) > 0:
                return InstanceKey(ns, appdef, int(k))
            case ["session", ns, name] if ns and name:
                return SessionKey(ns, name)
            case ["pool", ns, appdef] if ns and appdef:
                return PoolKey(ns, appdef)
    except ValueError:
        pass
    raise ValueError(f"not a warmpool work key: {text!r}")
