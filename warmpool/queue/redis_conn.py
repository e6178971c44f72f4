"""Redis connections: one place that turns a URL into a client with sane timeouts.

Every Redis client of warmpool (the keyed queue, the leases, the dramatiq broker, the metrics
collectors, the CLI) is made here, so a URL form accepted here is accepted everywhere. Besides
redis-py's own forms there is one for Redis Sentinel, which redis-py has no URL for; the
grammar is the one other Python projects use (Redis-Sentinel-Url, prefect-redis, redisvl)::

    redis+sentinel://[[user]:password@]host[:port][,host2[:port2]...]/service[/db][?options]
    rediss+sentinel://...   TLS to the data nodes and to the Sentinels

Sentinels default to port 26379. The user and password are the data nodes' (the primary's);
`sentinel_username` / `sentinel_password` in the query authenticate to the Sentinels (none
when absent); every other option is a redis-py URL option for the data-node connections.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

T = TypeVar("T")

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
SENTINEL_PORT = 26379

# How long a Sentinel client rides through a failover before a command fails: the primary's
# death is noticed after `down-after-milliseconds` (30 s by default in Sentinel, seconds in
# tuned setups) and the promotion takes a few seconds more. Commands block meanwhile instead
# of failing, so a worker's job resumes on the new primary rather than being counted failed
# against a queue that is itself unreachable.
FAILOVER_WAIT = 45.0

# How a Redis call on a path that went bad ends (a dead route, a host cut off, a proxy whose
# far side is gone), instead of hanging its thread:
# - COMMAND_TIMEOUT bounds each wait for a reply. No call the queue makes blocks server-side,
#   so a reply later than this is a path that answers nothing (even one that acknowledges:
#   a stalled proxy or NAT, which no TCP option sees). redis-py 8 made 5 s its default, and
#   earlier versions had none; it is set here so that the bound does not depend on the
#   version installed. (A timeout puts the socket in non-blocking mode, a poll() per read:
#   measured at ~15 % of worker throughput before redis-py paid it by default.)
# - Keep-alives (a probe after 10 s idle, every 5 s, given up after 3) and TCP_USER_TIMEOUT
#   (bytes unacknowledged for DEAD_PATH_SECONDS) close a dead connection that no call is
#   waiting on, so a pooled connection is not handed to the next call dead; the health
#   check re-validates one idle for 30 s.
# Then redis-py's retry reconnects (connect timeout 5 s) until the path heals, and the process
# carries on without a restart. Meanwhile it loses nothing: its leases lapse by its own clock
# (`LeaseBook`, before they can lapse in Redis), its jobs stop writing, and other workers take
# its keys once its heartbeat is `heartbeat_timeout` old.
COMMAND_TIMEOUT = 5.0
DEAD_PATH_SECONDS = 25
_KEEPALIVE = {
    opt: value
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", DEAD_PATH_SECONDS * 1000))
    if (opt := getattr(socket, name, None)) is not None
}

_DEFAULTS: dict[str, Any] = {
    "socket_keepalive": True,
    "socket_keepalive_options": _KEEPALIVE,
    "socket_connect_timeout": 5.0,
    "socket_timeout": COMMAND_TIMEOUT,
    "health_check_interval": 30,
}


def connect(url: str, *, failover_wait: float = FAILOVER_WAIT, **options: Any) -> redis.Redis:
    """A client for `url`: redis://[:password@]host[:port][/db], rediss:// (TLS, options such
    as ssl_cert_reqs in the query string), unix:///path/to/socket[?db=N], or
    redis+sentinel://host:26379,host2:26379/service[/db] (see the module docstring).

    Responses stay bytes: dramatiq stores encoded messages, and decoding is the caller's call.
    `failover_wait` is how long a Sentinel client's command waits for a new primary (other
    URLs have one server and ignore it).
    """
    if is_sentinel_url(url):
        return connect_sentinel(parse_sentinel_url(url), failover_wait=failover_wait,
                                **options)
    defaults = dict(_DEFAULTS)
    if url.startswith("unix:"):  # no TCP: keep-alive options do not apply
        defaults.pop("socket_keepalive")
        defaults.pop("socket_keepalive_options")
    return redis.Redis.from_url(url, **{**defaults, **options})


def is_sentinel_url(url: str) -> bool:
    """Only the scheme is looked at, case-insensitively (RFC 3986)."""
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed redis+sentinel:// URL: where the Sentinels are and what to ask them for."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    # redis-py connection options for the data nodes, parsed by redis-py from the query
    options: dict[str, Any] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelURL:
    """Split by hand: urllib refuses a netloc of several host:port pairs (it takes the
    commas for part of one host and the ports for an invalid one). Raises ValueError
    naming what is wrong, which the CLI reports as a bad URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError("a Sentinel URL starts with redis+sentinel:// or rediss+sentinel://")
    tls = SENTINEL_SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    sentinels = tuple(_host_port(h) for h in hosts.split(",") if h.strip())
    if not sentinels:
        raise ValueError("no Sentinel host:port in the URL")
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts:
        raise ValueError("no service name: redis+sentinel://host:26379/<service>[/<db>]")
    if len(parts) > 2:
        raise ValueError(f"too many path segments in {'/'.join(parts)!r}: expected "
                         "<service>[/<db>]")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(f"database {parts[1]!r} is not a number")
        db = int(parts[1])
    pairs = parse_qsl(query, keep_blank_values=True)
    sentinel_auth = {k: v for k, v in pairs if k in ("sentinel_username", "sentinel_password")}
    rest_query = urlencode([(k, v) for k, v in pairs if k not in sentinel_auth])
    # redis-py parses the remaining options as it would on a redis:// URL (types, bools)
    base = "rediss" if tls else "redis"
    options = redis.connection.parse_url(f"{base}://placeholder/?{rest_query}")
    for key in ("host", "port", "connection_class", "username", "password", "path"):
        options.pop(key, None)
    if "db" in options:  # a ?db= option wins over the path, as redis-py's own URLs have it
        db = int(options.pop("db"))
    return SentinelURL(sentinels=sentinels, service=parts[0], db=db, tls=tls,
                       username=username, password=password,
                       sentinel_username=sentinel_auth.get("sentinel_username") or None,
                       sentinel_password=sentinel_auth.get("sentinel_password") or None,
                       options=options)


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [IPv6]:port
        host, _, tail = item[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise ValueError(f"Sentinel {item!r} has no host")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"Sentinel {item!r} has no valid port")
    return host, int(port_text)


class FailoverRetry(Retry):
    """Retry a command on connection errors until `budget` seconds have passed since its
    first failure, whatever the count.

    A Sentinel-managed connection asks the Sentinels for the primary on every (re)connect,
    and turns a ReadOnlyError (it is talking to a demoted primary) into a ConnectionError
    after disconnecting; so retrying on ConnectionError is what carries a command over to
    the new primary. A count of retries fits a failover badly: a refused connection fails in
    microseconds, an unreachable host only after the connect timeout. The same Retry also
    wraps each reconnect inside a command's retry, so a command waits at most about twice
    the budget.
    """

    def __init__(self, budget: float, cap: float = 0.5, base: float = 0.02) -> None:
        super().__init__(ExponentialBackoff(cap=cap, base=base), retries=-1)
        self.budget = budget

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, FailoverRetry) and self.budget == other.budget

    __hash__ = Retry.__hash__

    def get_retries(self) -> int:
        # redis-py compares a failure count against this to decide whether to close the
        # connection before the next attempt; "unbounded" must mean yes.
        return 1 << 30

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        self._backoff.reset()
        failures = 0
        deadline: float | None = None
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.budget
                if now >= deadline:
                    raise error
                time.sleep(min(self._backoff.compute(failures), max(0.0, deadline - now)))


class _SentinelConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that asks the Sentinels again on every reconnect.

    redis-py 8.1's `send_packed_command` reconnects a dropped socket with
    `connect_check_health`, which reuses the host and port of the last connect: a connection
    that is never returned to the pool (the queue's per-thread single-connection clients)
    kept dialing the dead primary after a failover until its retries ran out. Going through
    `connect()` looks the primary up first.
    """

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()
        # unannotated in redis-py (its connection classes are), so: the one ignore here
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class _SentinelSSLConnection(_SentinelConnection, SentinelManagedSSLConnection):
    pass


def connect_sentinel(spec: SentinelURL, *, failover_wait: float = FAILOVER_WAIT,
                     **options: Any) -> redis.Redis:
    """A client on the primary of `spec.service` as the Sentinels name it now and after any
    failover: the same client object (and the clients sharing its pool, such as the queue's
    per-thread script clients) reconnects to the new primary by itself, no restart needed.

    The Sentinels get the connect timeout and keep-alives but no password of the data nodes;
    `options` (the caller's, e.g. the CLI's short timeouts) apply to both.
    """
    conn: dict[str, Any] = {**_DEFAULTS, **spec.options, **options}
    conn.setdefault("retry", FailoverRetry(failover_wait))
    conn["db"] = spec.db
    if spec.username is not None:
        conn["username"] = spec.username
    if spec.password is not None:
        conn["password"] = spec.password
    sentinel_kwargs: dict[str, Any] = {
        k: v for k, v in conn.items() if k.startswith("socket_") or k.startswith("ssl")
    }
    # a Sentinel that does not answer is skipped at once for the next one: no retries there
    sentinel_kwargs["retry"] = Retry(ExponentialBackoff(), 0)
    if spec.sentinel_username is not None:
        sentinel_kwargs["username"] = spec.sentinel_username
    if spec.sentinel_password is not None:
        sentinel_kwargs["password"] = spec.sentinel_password
    if spec.tls:
        sentinel_kwargs["ssl"] = True
    conn.pop("ssl", None)
    manager = Sentinel(list(spec.sentinels), sentinel_kwargs=sentinel_kwargs, **conn)
    connection_class = _SentinelSSLConnection if spec.tls else _SentinelConnection
    client: redis.Redis = manager.master_for(spec.service, connection_class=connection_class)
    return client
