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


@dataclass(frozen=True, slots=True)
class TimeoutKey:
    """A Session's deadlines (session-lifecycle §5): the key of the job that ends it past its
    limits and otherwise runs again at its next deadline (issue #29: time is a key)."""

    namespace: str
    session: str
    kind = "timeout"

    def __str__(self) -> str:
        return _SEP.join((self.kind, self.namespace, self.session))


@dataclass(frozen=True, slots=True)
class ProbeKey:
    """A claimed Session's URL probe (session-lifecycle §2): one attempt a run, the next one
    at the probe schedule's delay."""

    namespace: str
    session: str
    kind = "probe"

    def __str__(self) -> str:
        return _SEP.join((self.kind, self.namespace, self.session))


@dataclass(frozen=True, slots=True)
class SweepKey:
    """A namespace's pool objects that nothing owns: the key of the job that deletes those
    whose AppDefinition is gone and queues the instances of those whose AppDefinition lives
    (warmpool.controller.orphans). No other key reaches such an object: the scheduler maps a
    pool object's event by its owner references, and a resync by the AppDefinitions."""

    namespace: str
    kind = "sweep"

    def __str__(self) -> str:
        return _SEP.join((self.kind, self.namespace))


Key = InstanceKey | SessionKey | PoolKey | TimeoutKey | ProbeKey | SweepKey


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
            case ["timeout", ns, name] if ns and name:
                return TimeoutKey(ns, name)
            case ["probe", ns, name] if ns and name:
                return ProbeKey(ns, name)
            case ["sweep", ns] if ns:
                return SweepKey(ns)
    except ValueError:
        pass
    raise ValueError(f"not a warmpool work key: {text!r}")
