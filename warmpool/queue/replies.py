"""The Redis replies the queue reads, typed as what its clients get.

The queue's clients are bytes clients (`redis_conn.connect` never sets `decode_responses`):
every string reply is bytes, every `zrange(..., withscores=True)` reply (member, float score)
pairs. redis-py's annotations (8.x) type each reply as the union over every client
configuration (bytes or str, RESP2 or RESP3 shapes), so the readers here name the one shape a
bytes client gets. They are casts, in one place: nothing is converted or checked at run time,
and a str where bytes are expected fails exactly as before (no `decode` on str).
"""

from __future__ import annotations

from typing import cast


def raw(value: bytes | str) -> bytes:
    """A string reply (a message body, say), as the bytes it is."""
    return cast(bytes, value)


def text(value: bytes | str) -> str:
    """A string reply decoded, as `value.decode()`."""
    return cast(bytes, value).decode()


def members(reply: object) -> list[bytes]:
    """A `zrange` reply without scores: the members."""
    return cast(list[bytes], reply)


def scored(reply: object) -> list[tuple[bytes, float]]:
    """A `zrange(..., withscores=True)` reply: (member, score) pairs."""
    return cast(list[tuple[bytes, float]], reply)
