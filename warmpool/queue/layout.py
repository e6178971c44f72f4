"""Where everything lives in Redis: the project's keys next to dramatiq's standard ones.

Project keys (prefix `warmpool:` by default):
  dirty      set   keys waiting to run (client-go's `dirty`)
  lease:<k>  str   "<fence>|<holder token>", PX ttl: holding it is "processing k"
  fence      str   one counter INCRed on every lease acquisition, so each key's fences grow
  inflight   zset  k -> lease deadline (ms), for recovering keys whose holder died
  delayed    zset  k -> ready time (ms); never holds a dirty key
  failures   hash  k -> consecutive failures
  errors     hash  k -> last error text
  added_at   hash  k -> first-add time (ms) of the current wait, for queue-duration metrics
  pending    hash  k -> dramatiq message id of k's queued message, for the orphan audit
  dead       hash  k -> dramatiq message id of k's dead letter in `.XQ`
  trig:<k>   hash  what k's next run must see, merged over its adds: "Kind/name" -> highest
                   resourceVersion, "Kind/name#gone" -> uid of a seen deletion, "*" -> an
                   add that names no version (resync, delay, retry, recovery, repair);
                   handed to the job and deleted when it starts
  own:<k>    hash  the same fields for the writes k's last run made itself (PX 300 s): a
                   start whose every trigger is in here is skipped ("own")
  wait:<k>   set   keys parked until k's lease is released (a claim that found k busy):
                   `done` makes each due at once; PX the parker's fallback, which is also
                   each parked key's own delayed run, so a holder that dies wakes them too
  maintenance:<task>  str  short NX lock: one process at a time runs recovery / audit
  epoch      str   a random value the scheduler creates (no TTL); missing or changed means
                   Redis lost its data (see `epoch`)
  worker:<id>  str  `host:pid` of a dramatiq worker, with its heartbeat (see `middleware`)
  pool:state, pool:waiting, metrics:contended:<k>  the metrics' pool state (written by the
                   jobs, read by the collectors: see `metrics.poolstate`)
  doorbell   pub/sub channel (not a key): every enqueue publishes the dramatiq list it wrote,
                   every delayed add its ready time (ms), for idle workers (see `doorbell`)
  runlog:starts, runlog:ends  lists: "<time> <key>" per job start / end, written only by
                   workers that import `workers.runlog` (benchmarks, `warmpool.harness`)

dramatiq keys (namespace `dramatiq`): `<ns>:<queue>` (list of message ids), `<queue>.msgs`,
`<queue>.XQ` / `.XQ.msgs` (dead letters), `__acks__.<worker>.<queue>`, `__heartbeats__`; the
same for the claims queue `<queue>-claims` (session keys, consumed first), except dead letters:
both queues' go to the main queue's `.XQ`.

This class is the one definition of these names: the Lua scripts get theirs from a head
generated from it (`warmpool.queue.scripts.KEY_NAMES` says which attribute is which local)
and spell none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmpool.queue.routing import is_claim_key
from warmpool.queue.settings import QueueSettings, claims_queue_name


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: str
    namespace: str
    queue: str

    @classmethod
    def of(cls, settings: QueueSettings) -> Layout:
        return cls(settings.prefix, settings.namespace, settings.queue_name)

    def _p(self, name: str) -> str:
        return self.prefix + name

    @property
    def dirty(self) -> str:
        return self._p("dirty")

    @property
    def inflight(self) -> str:
        return self._p("inflight")

    @property
    def failures(self) -> str:
        return self._p("failures")

    @property
    def delayed(self) -> str:
        return self._p("delayed")

    @property
    def errors(self) -> str:
        return self._p("errors")

    @property
    def added_at(self) -> str:
        return self._p("added_at")

    @property
    def pending(self) -> str:
        return self._p("pending")

    @property
    def dead(self) -> str:
        return self._p("dead")

    @property
    def fence(self) -> str:
        return self._p("fence")

    @property
    def epoch(self) -> str:
        return self._p("epoch")

    @property
    def doorbell_channel(self) -> str:
        """The pub/sub channel the scripts ring on every enqueue and delayed add (one per
        prefix: a worker process subscribes once for both queues and the delayed set)."""
        return self._p("doorbell")

    @property
    def triggers_prefix(self) -> str:
        return self._p("trig:")

    def triggers(self, key: str) -> str:
        return self.triggers_prefix + key

    @property
    def own_prefix(self) -> str:
        return self._p("own:")

    def own(self, key: str) -> str:
        return self.own_prefix + key

    @property
    def waiters_prefix(self) -> str:
        return self._p("wait:")

    def waiters(self, key: str) -> str:
        return self.waiters_prefix + key

    def worker(self, worker_id: str) -> str:
        """`host:pid` of a dramatiq worker id, refreshed with its heartbeat, expiring after."""
        return self._p(f"worker:{worker_id}")

    @property
    def lease_prefix(self) -> str:
        return self._p("lease:")

    def lease(self, key: str) -> str:
        return self.lease_prefix + key

    @property
    def lease_pattern(self) -> str:
        """A SCAN MATCH pattern for every lease key (the prefix's glob characters escaped)."""
        return re.sub(r"([*?\[\]\\])", r"\\\1", self.lease_prefix) + "*"

    def maintenance_lock(self, task: str) -> str:
        return self._p(f"maintenance:{task}")

    # the metrics' keys (metrics.poolstate): not the queue's, but under its prefix
    @property
    def pool_state(self) -> str:
        return self._p("pool:state")

    @property
    def pool_waiting(self) -> str:
        return self._p("pool:waiting")

    @property
    def contended_prefix(self) -> str:
        return self._p("metrics:contended:")

    def contended(self, key: str) -> str:
        return self.contended_prefix + key

    # the run log's lists (workers.runlog): not the queue's either, under its prefix
    @property
    def runs_started(self) -> str:
        return self._p("runlog:starts")

    @property
    def runs_ended(self) -> str:
        return self._p("runlog:ends")

    # dramatiq's layout (see dramatiq/brokers/redis/dispatch.lua)
    def _d(self, name: str) -> str:
        return f"{self.namespace}:{name}"

    @property
    def messages_list(self) -> str:
        return self._d(self.queue)

    @property
    def messages(self) -> str:
        return self._d(self.queue + ".msgs")

    @property
    def claims_queue(self) -> str:
        """The dramatiq queue of session keys (claims), so they never wait behind bulk work."""
        return claims_queue_name(self.queue)

    @property
    def claims_messages_list(self) -> str:
        return self._d(self.claims_queue)

    @property
    def claims_messages(self) -> str:
        return self._d(self.claims_queue + ".msgs")

    @property
    def queues(self) -> tuple[str, str]:
        """Both dramatiq queue names, claims first (the order work is taken in)."""
        return (self.claims_queue, self.queue)

    def queue_of(self, key: str) -> str:
        """The dramatiq queue `key`'s messages go to (the scripts' `queue_of`)."""
        return self.claims_queue if is_claim_key(key) else self.queue

    def messages_list_of(self, queue: str) -> str:
        return self._d(queue)

    def messages_of(self, queue: str) -> str:
        return self._d(queue + ".msgs")

    @property
    def xq(self) -> str:
        return self._d(self.queue + ".XQ")

    @property
    def xq_messages(self) -> str:
        return self._d(self.queue + ".XQ.msgs")

    @property
    def heartbeats(self) -> str:
        return self._d("__heartbeats__")

    def acks(self, worker_id: str, queue: str | None = None) -> str:
        return self._d(f"__acks__.{worker_id}.{queue or self.queue}")
