"""What happened in a chaos run, with times since its start."""

from __future__ import annotations

import threading
import time
from collections import deque


class History:
    """What happened, with times since the start (the last `size` lines are printed)."""

    def __init__(self, size: int) -> None:
        self.t0 = time.monotonic()
        self.lines: deque[str] = deque(maxlen=size)
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, kind: str, text: str) -> None:
        with self._lock:
            self.lines.append(f"{self.now():8.2f}s {kind:<9} {text}")

    def tail(self) -> list[str]:
        with self._lock:
            return list(self.lines)
