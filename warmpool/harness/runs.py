"""Reading the workers' run log (`workers.runlog`): every job's start and end, with its time.

The benchmarks count runs per key and time them from here; `quiet` reads the same lists to
tell when the work a change caused has run.
"""

from __future__ import annotations

from collections import Counter

import redis

from warmpool.queue.layout import Layout
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings


class RunLog:
    def __init__(self, client: redis.Redis, settings: QueueSettings) -> None:
        self.client = client
        self.layout = Layout.of(settings)

    def _entries(self, name: str) -> list[tuple[float, str, str]]:
        """(time, key, worker) of each entry ("<time> <key> <worker>"; an entry without a
        worker, from an older writer, has "")."""
        out = []
        for raw in self.client.lrange(name, 0, -1):
            t, key, worker = [*text(raw).split(" ", 2), ""][:3]
            out.append((float(t), key, worker))
        return out

    def _read(self, name: str) -> list[tuple[float, str]]:
        return [(t, key) for t, key, _ in self._entries(name)]

    def by_worker(self, kind: str) -> Counter[str]:
        """How many runs of `kind` keys (`kind/...`) each worker process (`<host>:<pid>`)
        started."""
        return Counter(worker for _, key, worker in self._entries(self.layout.runs_started)
                       if key.startswith(kind + "/"))

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
