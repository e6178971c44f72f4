"""Redis connections: one place that turns a URL into a client with sane timeouts."""

from __future__ import annotations

import socket
from typing import Any

import redis

# TCP keep-alives (probe after 10 s idle, every 5 s, give up after 3) find a dead server or
# path in ~25 s, and the health check re-validates idle connections. There is deliberately
# no per-call socket timeout: a timeout puts the socket in non-blocking mode, which costs a
# poll() per read -- measured at ~15 % of worker throughput -- and no call the queue makes
# blocks server-side anyway. A worker wedged on a dead connection loses nothing: its leases
# lapse and other workers take its keys.
_KEEPALIVE = {
    opt: value
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if (opt := getattr(socket, name, None)) is not None
}

_DEFAULTS: dict[str, Any] = {
    "socket_keepalive": True,
    "socket_keepalive_options": _KEEPALIVE,
    "socket_connect_timeout": 5.0,
    "health_check_interval": 30,
}


def connect(url: str, **options: Any) -> redis.Redis:
    """A client for `url`: redis://[:password@]host[:port][/db], rediss:// (TLS, options such
    as ssl_cert_reqs in the query string), or unix:///path/to/socket[?db=N].

    Responses stay bytes: dramatiq stores encoded messages, and decoding is the caller's call.
    """
    defaults = dict(_DEFAULTS)
    if url.startswith("unix:"):  # no TCP: keep-alive options do not apply
        defaults.pop("socket_keepalive")
        defaults.pop("socket_keepalive_options")
    return redis.Redis.from_url(url, **{**defaults, **options})
