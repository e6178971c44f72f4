"""`warmpool worker`: run the keyed-queue workers (N processes x T threads)."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import signal
import tempfile
import threading
from typing import TYPE_CHECKING

import click

from warmpool.cli.config import check_servers
from warmpool.cli.errors import BadValue
from warmpool.queue.settings import QueueSettings
from workers.process import DEFAULT_MODULES, MULTIPROC_ENV, WorkerPool

if TYPE_CHECKING:
    from metrics.exposition import MetricsServer


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
@click.option("--metrics/--no-metrics", "metrics_on", default=True, show_default=True,
              help="Serve this host's worker metrics, summed over its worker processes.")
@click.option("--metrics-host", default="0.0.0.0", show_default=True)
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=9091,
              show_default=True,
              help="Port for /metrics; 0 picks a free one (printed). If the default port is "
                   "taken the workers run without an endpoint (warning); a port given "
                   "explicitly must be free.")
@click.option("--metrics-dir", type=click.Path(file_okay=False), default=None,
              help="Where worker processes write their metrics; emptied at start "
                   f"[default: ${MULTIPROC_ENV}, else a temporary directory].")
@click.option("--log-level", default="WARNING", show_default=True)
def worker(
    processes: int,
    threads: int,
    redis_url: str | None,
    queue_name: str | None,
    modules: tuple[str, ...],
    metrics_on: bool,
    metrics_host: str,
    metrics_port: int,
    metrics_dir: str | None,
    log_level: str,
) -> None:
    """Run queue workers until SIGTERM/SIGINT; crashed worker processes are restarted."""
    level = getattr(logging, log_level.upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # This process writes no metric files: only its children do (WorkerPool hands them the
    # directory); it reads theirs.
    env_dir = os.environ.pop(MULTIPROC_ENV, None)
    metrics_dir = metrics_dir or env_dir or None
    # Fail here, with one line, not in a restart loop of crashing or retrying children.
    loaded = [importlib.import_module(name) for name in modules]
    for module in loaded:
        check = getattr(module, "check_settings", None)
        if check is not None:
            try:
                check()
            except ValueError as exc:  # a bad setting: one `error:` line, exit 2, as elsewhere
                raise BadValue(str(exc)) from None
    settings = QueueSettings.from_env(redis_url=redis_url, queue_name=queue_name)
    # The children find the API server through the same KUBECONFIG (or in-cluster config).
    check_servers(settings.redis_url,
                  kube=any(getattr(m, "NEEDS_KUBERNETES", False) for m in loaded),
                  kinds=[k for m in loaded for k in getattr(m, "required_kinds", list)()])
    embedded = None
    if settings.redis_url is None:
        from warmpool.queue.embedded import embedded_redis

        embedded = embedded_redis()
        settings = settings.replace(redis_url=embedded.url)
        click.echo(f"WARMPOOL_REDIS_URL unset: embedded valkey-server at {embedded.url}", err=True)
    temp_dir = None
    if metrics_on and metrics_dir is None:
        metrics_dir = temp_dir = tempfile.mkdtemp(prefix="warmpool-metrics-")
    pool = WorkerPool(
        settings, processes=processes, threads=threads, modules=modules, log_level=level,
        metrics_dir=metrics_dir if metrics_on else None,
    )
    server = None
    try:
        if metrics_on:
            assert metrics_dir is not None
            server = _serve_metrics(pool, metrics_dir, metrics_host, metrics_port)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        pool.start()
        url = server.url if server is not None else ("unavailable" if metrics_on else "off")
        click.echo(
            f"{processes} worker processes x {threads} threads on {settings.queue_name} "
            f"metrics={url}", err=True
        )
        pool.supervise(stop)
    finally:
        pool.stop()
        if server is not None:
            server.stop()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        if embedded is not None:
            embedded.stop()


def _serve_metrics(
    pool: WorkerPool, metrics_dir: str, host: str, port: int
) -> MetricsServer | None:
    """The host's endpoint, started before any worker: a port asked for must be free."""
    from metrics.exposition import host_registry, prepare_multiprocess_dir, serve

    prepare_multiprocess_dir(metrics_dir)
    explicit = (click.get_current_context().get_parameter_source("metrics_port")
                is not click.core.ParameterSource.DEFAULT)
    try:
        return serve(host_registry(metrics_dir, pool), host, port, required=explicit)
    except OSError as exc:
        raise click.ClickException(f"metrics port {host}:{port}: {exc}") from None
