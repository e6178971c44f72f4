"""Imported first by a worker process that must run on a host whose wall clock is off:
`WARMPOOL_TEST_CLOCK_SKEW` seconds (negative: behind) are added to every `time.time()` of
the process, which is what dramatiq and anything else reading the wall clock sees there.
The monotonic clock is left alone, as a host's is. With `WARMPOOL_TEST_NO_RECOVERY` set, the
process also never takes the queue's recovery pass (so that a test knows whose pass it is)."""

from __future__ import annotations

import os
import time

SKEW = float(os.environ.get("WARMPOOL_TEST_CLOCK_SKEW", "0"))

if SKEW:
    _real = time.time

    def _skewed() -> float:
        return _real() + SKEW

    time.time = _skewed
    # dramatiq bound `time` by name (`from time import time`): its clock is shifted too.
    import dramatiq.common

    dramatiq.common.time = _skewed  # type: ignore[attr-defined]

if os.environ.get("WARMPOOL_TEST_NO_RECOVERY"):
    # This process never takes the recovery pass (another process of the test does: the one
    # whose judgement is under test). Patched at import, before the worker's maintenance runs.
    from warmpool.queue.maintenance import Maintenance

    _once = Maintenance._once

    def _no_recovery(self: Maintenance, name: str, period: float) -> bool:
        return False if name == "recovery" else _once(self, name, period)

    Maintenance._once = _no_recovery  # type: ignore[method-assign]
