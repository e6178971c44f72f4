"""The worker supervisor's probes (workers.health): alive without Redis, ready with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.health import STALL, WorkerHealth


@dataclass
class Proc:
    pid: int | None
    alive: bool = True

    def is_alive(self) -> bool:
        return self.alive


@dataclass
class Pool:
    procs: list[Any] = field(default_factory=list)
    restarts: int = 0
    last_round: float = 100.0


def test_alive_while_the_loop_runs_and_a_worker_lives_whatever_redis_says() -> None:
    now = [100.0]
    pool = Pool([Proc(11, alive=False), Proc(12)])

    def down() -> bool:
        raise ConnectionError("Error 111 connecting to redis:6379")

    health = WorkerHealth(pool, down, clock=lambda: now[0])
    assert health.healthy()  # a Redis outage must not restart every worker
    assert not health.ready()
    assert health.status()["redis_error"] == "ConnectionError: Error 111 connecting to redis:6379"
    assert health.status()["alive"] == [12]
    pool.procs[1].alive = False
    assert not health.healthy()  # no worker process at all: wedged
    pool.procs[1].alive = True
    now[0] = 100.0 + STALL + 1
    assert not health.healthy()  # the supervisor's loop stopped


def test_ready_when_alive_and_redis_answers() -> None:
    pool = Pool([Proc(12), None])
    health = WorkerHealth(pool, lambda: True, clock=lambda: 101.0)
    assert health.ready() and health.status()["redis_error"] is None
    assert not WorkerHealth(Pool([None]), lambda: True, clock=lambda: 101.0).ready()
