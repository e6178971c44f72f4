"""Which dramatiq actor runs a key: the message contract between producers and workers.

Producers build messages without importing worker code, so the kind -> actor-name table
lives here; `workers.runtime` declares actors under exactly these names.
"""

from __future__ import annotations

from collections.abc import Callable

from warmpool.keys import parse_key

ACTOR_FOR_KIND: dict[str, str] = {
    "instance": "reconcile_instance",
    "session": "claim_session",
    "pool": "resync_pool",
    "timeout": "session_timeout",
    "probe": "probe_url",
    "sweep": "sweep_orphans",
}

Router = Callable[[str], str]

#: Keys of this kind (claims) go to the claims queue, ahead of bulk work; the Lua scripts
#: test the same prefix (`queue_of` in `warmpool/queue/lua/lib.lua`).
CLAIM_KIND = "session"
CLAIM_PREFIX = CLAIM_KIND + "/"


def is_claim_key(key: str) -> bool:
    return key.startswith(CLAIM_PREFIX)


def actor_for_key(key: str) -> str:
    """The actor of a work key's kind; ValueError for text that is not a work key."""
    return ACTOR_FOR_KIND[parse_key(key).kind]
