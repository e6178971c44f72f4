"""Reading the workers' run log (`workers.runlog`): every job's start and end, with its time.

The benchmarks count runs per key and time them from here; `quiet` reads the same lists to
tell when the work a change caused has run.
"""

from __future__ import annotations

import redis

from warmpool.queue.layout import Layout
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings


class RunLog:
    def __init__(self, client: redis.Redis, settings: QueueSettings) -> None:
        self.client = client
        self.layout = Layout.of(settings)

    def _read(self, name: str) -> list[tuple[float, str]]:
        out = []
        for raw in self.client.lrange(name, 0, -1):
            t, _, key = text(raw).partition(" ")
            out.append((float(t), key))
        return out

    def starts(self) -> list[tuple[float, str]]:
        """Every job start logged so far: (time.time() at the start, key), in order."""
        return self._read(self.layout.runs_started)

    def ends(self) -> list[tuple[float, str]]:
        """Every job end logged so far: (time.time() at the end, key), in order."""
        return self._read(self.layout.runs_ended)

    def durations(self, kind: str) -> list[float]:
        """Seconds each finished run of `kind` keys (`kind/...`) took: a key's runs never
        overlap while its lease holds, so its i-th end belongs to its i-th start."""
        starts: dict[str, list[float]] = {}
        for t, key in self.starts():
            starts.setdefault(key, []).append(t)
        ends: dict[str, list[float]] = {}
        for t, key in self.ends():
            ends.setdefault(key, []).append(t)
        return [e - s for key, es in ends.items() if key.startswith(kind + "/")
                for s, e in zip(starts.get(key, []), es, strict=False)]

    def clear(self) -> None:
        """Forget every run logged so far (a `Mark` taken before is void after this)."""
        self.client.delete(self.layout.runs_started, self.layout.runs_ended)
