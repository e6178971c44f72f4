"""`warmpool worker`: run the keyed-queue workers (N processes x T threads)."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading

import click

from warmpool.queue.settings import QueueSettings
from workers.process import DEFAULT_MODULES, WorkerPool


@click.command("worker")
@click.option(
    "--processes",
    "-p",
    type=int,
    default=os.cpu_count() or 1,
    show_default=True,
    help="Worker processes.",
)
@click.option("--threads", "-t", type=int, default=8, show_default=True, help="Threads each.")
@click.option(
    "--redis-url",
    envvar="WARMPOOL_REDIS_URL",
    default=None,
    help="Redis URL (redis://, rediss://, unix://); unset: an embedded valkey-server.",
)
@click.option("--queue", "queue_name", default=None, help="Queue name (default: warmpool).")
@click.option(
    "--module",
    "-m",
    "modules",
    multiple=True,
    default=DEFAULT_MODULES,
    show_default=True,
    help="Modules that register handlers (repeatable).",
)
@click.option("--log-level", default="WARNING", show_default=True)
def worker(
    processes: int,
    threads: int,
    redis_url: str | None,
    queue_name: str | None,
    modules: tuple[str, ...],
    log_level: str,
) -> None:
    """Run queue workers until SIGTERM/SIGINT; crashed worker processes are restarted."""
    level = getattr(logging, log_level.upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in modules:  # fail here, not in a restart loop of crashing children
        importlib.import_module(name)
    settings = QueueSettings.from_env(redis_url=redis_url, queue_name=queue_name)
    embedded = None
    if settings.redis_url is None:
        from warmpool.queue.embedded import embedded_redis

        embedded = embedded_redis()
        settings = settings.replace(redis_url=embedded.url)
        click.echo(f"WARMPOOL_REDIS_URL unset: embedded valkey-server at {embedded.url}", err=True)
    pool = WorkerPool(
        settings, processes=processes, threads=threads, modules=modules, log_level=level
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pool.start()
    click.echo(
        f"{processes} worker processes x {threads} threads on {settings.queue_name}", err=True
    )
    try:
        pool.supervise(stop)
    finally:
        pool.stop()
        if embedded is not None:
            embedded.stop()
