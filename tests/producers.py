"""A test double for the scheduler's producer (its `KeyedQueue`): remembers every key added.

Was `scheduler.app.Recorder`; only tests use it, so it lives with them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.app import Producer


@dataclass
class Recorder:
    """A producer wrapper that remembers every key added, in order (to `inner` too, if
    given)."""

    inner: Producer | None = None
    added: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_many(self, keys: Iterable[str | tuple[str, Mapping[str, str]]]) -> Any:
        keys = list(keys)
        result = self.inner.add_many(keys) if self.inner is not None else None
        with self._lock:
            self.added.extend(k if isinstance(k, str) else k[0] for k in keys)
        return result

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self.added[mark:]

    def mark(self) -> int:
        with self._lock:
            return len(self.added)
