"""`warmpool queue list|show`, `locks`, `workers`, `dead-letters`: the work queue in Redis.

Read-only except `dead-letters retry|purge`. Everything is read from the one Redis all hosts
share (the key layout is in warmpool/queue/README.md), so these show every worker on every
host. Ages are measured against the Redis server's clock where the queue stamps times with it.
Nothing here reads Redis itself: the `*_view` functions turn what `warmpool.queue.inspect`'s
`Inspector` (and `KeyedQueue`, for dead letters) return into the JSON documents, and the
commands render those.
"""

from __future__ import annotations

import sys
from typing import Any

import click
import redis

from warmpool.cli.output import (
    Column,
    Output,
    Table,
    age,
    joined,
    last_line,
    output_options,
    redact,
    rounded,
)
from warmpool.config import RedisConfig, redis_options
from warmpool.errors import BadValue, NotFound
from warmpool.keys import parse_key
from warmpool.queue.inspect import SCAN_CAP, Inspector
from warmpool.queue.keyed import MISSING, KeyedQueue
from warmpool.queue.settings import QueueSettings

# --- views (JSON documents): what the Inspector and the queue return, formatted -------------


def overview_view(client: redis.Redis, settings: QueueSettings, limit: int) -> dict[str, Any]:
    insp = Inspector(client, settings)
    stats = insp.stats()
    row = {
        "name": settings.queue_name,
        "ready": stats.ready,
        "rerun": stats.rerun,
        "delayed": stats.delayed,
        "in_flight": stats.running,
        "dead": stats.dead,
        "failing": stats.failing,
        "messages": stats.messages,  # both dramatiq queues: claims and bulk work
        "claim_messages": stats.claim_messages,
        "oldest_age_seconds": rounded(stats.oldest_wait_seconds),
    }
    return {
        "prefix": settings.prefix,
        "namespace": settings.namespace,
        "queues": [row],
        "workers_alive": stats.workers_alive,
        "pending": [{"key": k, "waiting_seconds": rounded(s)} for k, s in insp.pending(limit)],
        "rerun": [{"key": k, "holder": h} for k, h in insp.reruns(limit)],
        "delayed": [{"key": k, "due_in_seconds": rounded(s)}
                    for k, s in insp.delayed(limit)],
    }


def key_view(client: redis.Redis, settings: QueueSettings, key: str) -> dict[str, Any]:
    st = Inspector(client, settings).key(key)
    return {
        "key": st.key,
        "state": st.state,
        "waiting": st.waiting,
        "running": st.running,
        "rerun": st.rerun,
        "delayed_seconds": rounded(st.delayed_seconds),
        "dead": st.dead,
        "dead_letter_id": st.dead_letter_id,
        "failures": st.failures,
        "last_error": redact(st.last_error) if st.last_error else None,
        "holder": st.holder,
        "fence": st.fence,
        "lease_ttl_seconds": rounded(st.lease_ttl_seconds),
        "waiting_seconds": rounded(st.waiting_seconds),
    }


def locks_view(client: redis.Redis, settings: QueueSettings) -> dict[str, Any]:
    return {"locks": [{"key": lk.key, "kind": lk.kind, "holder": lk.holder, "fence": lk.fence,
                       "ttl_seconds": rounded(lk.ttl_seconds)}
                      for lk in Inspector(client, settings).locks()]}


def workers_view(client: redis.Redis, settings: QueueSettings) -> dict[str, Any]:
    insp = Inspector(client, settings)
    workers = [{"id": w.worker_id, "process": w.process,
                "heartbeat_age_seconds": rounded(w.last_seen_seconds),
                "alive": w.alive, "in_flight": w.unacked}
               for w in insp.workers()]
    workers.sort(key=lambda w: (not w["alive"], w["id"]))
    return {
        "heartbeat_timeout_seconds": settings.heartbeat_timeout,
        "workers": workers,
        "lease_holders": [{"process": proc, "leases": len(keys), "keys": keys}
                          for proc, keys in insp.lease_holders().items()],
    }


def dead_view(client: redis.Redis, settings: QueueSettings, limit: int) -> dict[str, Any]:
    now = Inspector(client, settings).now_ms() / 1000  # dead letters are stamped with it
    letters = KeyedQueue(client, settings).list_dead(limit)
    return {"dead_letters": [
        {"id": d.message_id, "key": d.key, "actor": d.actor, "failures": d.failures,
         "dead_at": rounded(d.dead_at), "age_seconds": rounded(max(0.0, now - d.dead_at)),
         "error": redact(d.error)}
        for d in letters]}


# --- commands -------------------------------------------------------------------------------

def _limit_option(func: Any) -> Any:
    return click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
                        help="Most keys listed per section (the counts are exact).")(func)


@click.group("queue")
@redis_options
def queue(redis_config: RedisConfig) -> None:
    """The work queue on Redis: `list` its counts and keys, `show` one key.

    `warmpool queue --redis-url URL show KEY`: the group's --redis-url holds for the
    sub-command.
    """


@queue.command("list")
@redis_options
@_limit_option
@output_options
def queue_list(redis_config: RedisConfig, limit: int, out: Output) -> None:
    """Per queue the keys ready to run, delayed, in flight, dead and failing, and the oldest
    wait; then the pending keys (in the order they run), the keys that run once more after
    their current run (re-run), and the delayed ones. Keys of every namespace: one queue
    serves them all.

    \b
    -o wide: the queue's message counts too (both dramatiq queues, and the claims').
    -o json | -o yaml: {"redis", "prefix", "namespace", "queues": [{"name",
      "ready", "rerun", "delayed", "in_flight", "dead", "failing", "messages",
      "claim_messages", "oldest_age_seconds"}], "workers_alive",
      "pending": [{"key", "waiting_seconds"}], "rerun": [{"key", "holder"}],
      "delayed": [{"key", "due_in_seconds"}]}
    """
    client, settings, url = redis_config.connect()
    doc = {"redis": url, **overview_view(client, settings, limit)}
    if out.document(doc):
        return
    out.line(f"{url}  prefix {doc['prefix']}")
    t = Table("queue", "ready", "re-run", "delayed", "in-flight", "dead", "failing", "oldest",
              Column("messages", wide=True), Column("claim-messages", wide=True))
    for q in doc["queues"]:
        t.add_row(q["name"], q["ready"], q["rerun"], q["delayed"], q["in_flight"], q["dead"],
                  q["failing"], age(q["oldest_age_seconds"]), q["messages"],
                  q["claim_messages"])
    out.table(t)
    out.line(f"workers alive: {doc['workers_alive']}")
    if doc["pending"]:
        out.line()
        out.heading("pending, in the order they run")
        p = Table("key", "waiting")
        for item in doc["pending"]:
            p.add_row(item["key"], age(item["waiting_seconds"]))
        out.table(p)
    if doc["rerun"]:
        out.line()
        out.heading("re-run: running now, to run once more after")
        r = Table("key", "running-in")
        for item in doc["rerun"]:
            r.add_row(item["key"], item["holder"])
        out.table(r)
    if doc["delayed"]:
        out.line()
        out.heading("delayed (retry backoff or deferred)")
        d = Table("key", "due-in")
        for item in doc["delayed"]:
            d.add_row(item["key"], age(item["due_in_seconds"]))
        out.table(d)


@queue.command("show")
@click.argument("key")
@redis_options
@output_options
def show(key: str, redis_config: RedisConfig, out: Output) -> None:
    """One work KEY (instance/NS/APPDEF/K, session/NS/NAME or pool/NS/APPDEF, as `warmpool
    locks` and `warmpool queue list` print them): its state (running, waiting, delayed, dead
    or idle), consecutive failed attempts, last error, and its lease: holder
    (host:pid:thread:token), TTL left and fence.

    \b
    -o wide: the same as the default.
    -o json | -o yaml: {"key", "state", "waiting", "running", "rerun",
      "delayed_seconds", "dead", "dead_letter_id", "failures", "last_error",
      "holder", "fence", "lease_ttl_seconds", "waiting_seconds"}
    """
    try:
        parse_key(key)
    except ValueError as exc:
        raise BadValue(f"{exc}; a key is instance/NS/APPDEF/K, session/NS/NAME or "
                       "pool/NS/APPDEF") from exc
    client, settings, _ = redis_config.connect()
    doc = key_view(client, settings, key)
    if out.document(doc):
        return
    out.line(f"{key}: {doc['state']}")
    t = Table("", "")
    t.show_header = False
    rows = [
        ("waiting", "yes" + (" (runs again after this run)" if doc["rerun"] else "")
         if doc["waiting"] else "no"),
        ("waiting for", age(doc["waiting_seconds"])),
        ("delayed, due in", age(doc["delayed_seconds"])),
        ("failed attempts", f"{doc['failures']} in a row"),
        ("dead letter", doc["dead_letter_id"] or "no"),
        ("lease holder", doc["holder"]),
        ("lease TTL left", age(doc["lease_ttl_seconds"])),
        ("fence", doc["fence"]),
        ("last error", last_line(doc["last_error"])),
    ]
    for name, value in rows:
        t.add_row(name, value)
    out.table(t)
    if doc["last_error"]:
        out.line()
        out.heading("last error, in full")
        for text in doc["last_error"].rstrip().splitlines():
            out.line(text)


@click.command("locks")
@redis_options
@output_options
def locks(redis_config: RedisConfig, out: Output) -> None:
    """The leases held now (one per key being worked on, on any host): key, holder process,
    TTL left and fence; and the short maintenance locks. Keys of every namespace: one queue
    serves them all. A key is printed whole, for `warmpool queue show KEY`.

    \b
    -o wide: the full holder (host:pid:thread:token) too.
    -o json | -o yaml: {"locks": [{"key", "kind": "lease"|"maintenance", "holder",
      "fence", "ttl_seconds"}]}
    """
    client, settings, _ = redis_config.connect()
    doc = locks_view(client, settings)
    if out.document(doc):
        return
    if not doc["locks"]:
        out.line("no locks held")
        return
    t = Table("key", "kind", "process", "ttl", "fence", Column("holder", wide=True))
    for lk in doc["locks"]:
        holder = lk["holder"] or ""
        t.add_row(lk["key"], lk["kind"], _process(holder), age(lk["ttl_seconds"]), lk["fence"],
                  holder)
    out.table(t)


def _process(holder: str) -> str:
    """host:pid of a lease holder host:pid:thread:token (a maintenance lock's holder as is)."""
    parts = holder.split(":")
    return ":".join(parts[:2]) if len(parts) == 4 else holder


@click.command("workers")
@redis_options
@output_options
def workers(redis_config: RedisConfig, out: Output) -> None:
    """Worker processes on every host: heartbeat age, alive (heard from within the heartbeat
    timeout), messages in flight (fetched, not yet acknowledged); then the leases each
    process (host:pid) holds.

    \b
    -o wide: each worker's full id, and every key a process holds (else its first 5).
    -o json | -o yaml: {"heartbeat_timeout_seconds", "workers": [{"id", "process",
      "heartbeat_age_seconds", "alive", "in_flight"}], "lease_holders": [{"process",
      "leases", "keys"}]}
    """
    client, settings, _ = redis_config.connect()
    doc = workers_view(client, settings)
    if out.document(doc):
        return
    if not doc["workers"]:
        out.line("no worker has sent a heartbeat")
    else:
        # The id is dramatiq's (a UUID: its first 8 characters, as a short git hash is shown;
        # whole with -o wide); the process is the host:pid the lease holders are named by.
        t = Table("worker", "process", "heartbeat", "alive", "in-flight")
        for w in doc["workers"]:
            t.add_row(w["id"] if out.wide else w["id"][:8], w["process"] or "?",
                      age(w["heartbeat_age_seconds"]) + " ago", "yes" if w["alive"] else "NO",
                      w["in_flight"])
        out.table(t)
    if doc["lease_holders"]:
        out.line()
        h = Table("process", "leases", "keys")
        for holder in doc["lease_holders"]:
            keys = holder["keys"] if out.wide else holder["keys"][:5]
            more = " …" if len(keys) < holder["leases"] else ""
            h.add_row(holder["process"], holder["leases"], joined(keys) + more)
        out.table(h)


@click.group("dead-letters")
def dead_letters() -> None:
    """Keys that failed too often in a row (WARMPOOL_QUEUE_MAX_FAILURES, 20 by default) and
    were parked; the periodic resync adds their work again anyway."""


@dead_letters.command("list")
@redis_options
@_limit_option
@output_options
def dead_list(redis_config: RedisConfig, limit: int, out: Output) -> None:
    """The dead letters, oldest first: key, failures, age and the last error. Keys of every
    namespace: one queue serves them all.

    \b
    -o wide: the dead letter's id and actor too.
    -o json | -o yaml: {"dead_letters": [{"id", "key", "actor", "failures",
      "dead_at", "age_seconds", "error"}]} (error: the full traceback; dead_at:
      unix seconds)
    """
    client, settings, _ = redis_config.connect()
    doc = dead_view(client, settings, limit)
    if out.document(doc):
        return
    if not doc["dead_letters"]:
        out.line("no dead letters")
        return
    t = Table("key", "failures", "age", Column("id", wide=True), Column("actor", wide=True),
              "last-error")
    for d in doc["dead_letters"]:
        t.add_row(d["key"] or f"({d['actor']} {d['id']})", d["failures"],
                  age(d["age_seconds"]), d["id"], d["actor"], last_line(d["error"]))
    out.table(t)


@dead_letters.command("retry")
@click.argument("key", required=False)
@click.option("--all", "retry_all", is_flag=True, help="Retry every dead letter.")
@redis_options
@output_options
def dead_retry(key: str | None, retry_all: bool, redis_config: RedisConfig,
               out: Output) -> None:
    """Run KEY (a work key, or a dead letter's id) again with its failures reset, or every
    dead letter with --all. Exit 3 if KEY has no dead letter.

    \b
    -o json | -o yaml: {"retried": [{"key", "id", "result"}]}
      (result: enqueued | rerun | deduplicated | delayed | missing)
    """
    if (key is None) == (not retry_all):
        raise BadValue("give either KEY or --all (see 'warmpool dead-letters list')")
    client, settings, _ = redis_config.connect()
    q = KeyedQueue(client, settings)
    if retry_all:
        results = [{"key": d.key, "id": d.message_id, "result": q.retry_dead(d.message_id)}
                   for d in q.list_dead(SCAN_CAP)]
    else:
        assert key is not None
        result = q.retry_dead(key)
        if result == MISSING:
            raise NotFound(f"no dead letter for {key!r}; 'warmpool dead-letters list' shows "
                           "them")
        results = [{"key": key, "id": None, "result": result}]
    if out.document({"retried": results}):
        return
    if not results:
        out.line("no dead letters")
    for r in results:
        out.line(f"{r['key'] or r['id']}: {r['result']}")


@dead_letters.command("purge")
@click.option("--yes", is_flag=True, help="Do not ask (needed when not on a terminal).")
@redis_options
@output_options
def dead_purge(yes: bool, redis_config: RedisConfig, out: Output) -> None:
    """Drop every dead letter for good (their keys stay runnable: any add runs them).

    \b
    -o json | -o yaml: {"purged": N}
    """
    client, settings, _ = redis_config.connect()
    count = Inspector(client, settings).stats().dead
    if count and not yes:
        if not sys.stdin.isatty():
            raise BadValue(f"refusing to drop {count} dead letters without --yes")
        click.confirm(f"Drop {count} dead letters for good?", abort=True)
    purged = KeyedQueue(client, settings).purge_dead() if count else 0
    if not out.document({"purged": purged}):
        out.line(f"purged {purged} dead letters" if purged else "no dead letters")
