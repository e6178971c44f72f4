"""Polling with a deadline: the one way tests (and the chaos runner, the benchmarks, the test
world's verbs) wait for something asynchronous.

Controllers, the garbage collector and the fake kubelet all act some time after a write.
A fixed sleep is either too short (flaky) or too long (slow); polling a predicate until a
deadline is neither, and the failure message says what was awaited and what was last seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """Raised when the predicate did not hold before the deadline (an assertion failure)."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.2,
    message: str | Callable[[], str] = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `predicate` until it returns something truthy and return that value.

    `ignore` lists exception types that count as "not yet" (for example ApiException while an
    object does not exist yet); any other exception propagates at once. On timeout, raises
    WaitTimeout with `message` (a string, or a callable evaluated then, for current state),
    plus the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except ignore as exc:
            last = exc
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            name = getattr(predicate, "__name__", repr(predicate))
            raise WaitTimeout(
                f"timed out after {timeout:.1f} s waiting for {text or name}; last: {last!r}"
            )
        time.sleep(interval)
