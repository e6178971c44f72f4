"""Where a URL probe's state lives between the runs of its key: Redis, beside the queue.

A probe's key (``probe/<ns>/<session>``) may run its next attempt on any worker, so its
attempt number, readiness flag and due time (`warmpool.controller.availability.ProbeState`)
are kept in one small hash per probe, under the queue's prefix, written only by the run that
holds the key's lease (two runs of one key never overlap), and expiring once the schedule is
long over. Times are the Redis server's (`TIME`): the queue's delays are on the same clock.
A Redis that lost its data loses the state: the probe starts again at its first attempt (the
instance's next reconcile queues its key), as it did after a worker restart before.
"""

from __future__ import annotations

import redis

from warmpool.controller.availability import ProbeState
from warmpool.queue.replies import text

#: Bounds on what is read back: anything else is read as no state (the probe starts anew).
_MAX_ATTEMPT = 10**6
_MAX_MS = 10**15


class RedisProbeStates:
    """`ProbeStates` in Redis, one hash `<prefix>probe-state:<namespace>/<uid>` per probe."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _key(self, namespace: str, uid: str) -> str:
        return f"{self.prefix}probe-state:{namespace}/{uid}"

    def now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def get(self, namespace: str, uid: str) -> ProbeState | None:
        raw = {text(k): text(val) for k, val in self.client.hgetall(self._key(namespace,
                                                                              uid)).items()}
        attempt, primed, due = raw.get("attempt", ""), raw.get("primed", ""), raw.get("due", "")
        if not (attempt.isdigit() and due.isdigit() and primed in ("0", "1")):
            return None
        if not (1 <= int(attempt) <= _MAX_ATTEMPT and int(due) <= _MAX_MS):
            return None
        return ProbeState(int(attempt), primed == "1", int(due))

    def put(self, namespace: str, uid: str, state: ProbeState, ttl: float) -> None:
        key = self._key(namespace, uid)
        with self.client.pipeline(transaction=True) as p:
            p.hset(key, mapping={"attempt": state.attempt, "primed": int(state.primed),
                                 "due": state.due_ms})
            p.pexpire(key, max(1, int(ttl * 1000)))
            p.execute()

    def drop(self, namespace: str, uid: str) -> None:
        self.client.delete(self._key(namespace, uid))
