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

from warmpool import logs
from warmpool.config import check_servers, queue_settings, require_redis_url
from warmpool.errors import BadValue
from warmpool.logs import DEFAULT_LEVEL, FORMATS, LOG_FORMAT_ENV, LOG_LEVEL_ENV
from workers.process import DEFAULT_MODULES, MULTIPROC_ENV, WorkerPool

if TYPE_CHECKING:
    from metrics.exposition import MetricsServer
    from warmpool.health import HealthServer
    from warmpool.queue.settings import QueueSettings


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
    help="The work queue's Redis URL (redis://, rediss://, unix://, redis+sentinel://) "
         "[env: WARMPOOL_REDIS_URL; required: without it the worker exits 4].",
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
@click.option("--health/--no-health", "health_on", default=True, show_default=True,
              help="Serve /healthz (alive: live worker processes) and /readyz (and Redis "
                   "answers) for the kubelet's probes.")
@click.option("--health-host", default="127.0.0.1", show_default=True)
@click.option("--health-port", type=click.IntRange(min=0, max=65535), default=8081,
              show_default=True,
              help="Port for /healthz, /readyz and /status; 0 picks a free one (printed). If "
                   "the default port is taken the workers run without it (warning); a port "
                   "given explicitly must be free.")
@click.option("--log-level", default=None,
              help=f"[default: ${LOG_LEVEL_ENV}, else {DEFAULT_LEVEL}: claims and releases "
                   "are logged at INFO]")
@click.option("--log-format", type=click.Choice(FORMATS), default=None,
              help=f"text, or one JSON object a line [default: ${LOG_FORMAT_ENV}, else text]")
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
    health_on: bool,
    health_host: str,
    health_port: int,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """Run queue workers until SIGTERM/SIGINT; crashed worker processes are restarted."""
    # First: nothing else is worth checking on a queue nobody else would see.
    redis_url = require_redis_url(redis_url, "worker")
    try:
        level, fmt = logs.resolve(log_level, log_format)
    except ValueError as exc:
        raise BadValue(str(exc)) from None
    logs.setup("worker-supervisor", level, fmt)
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
    settings = queue_settings(redis_url, queue_name=queue_name)
    # The children find the API server through the same KUBECONFIG (or in-cluster config).
    check_servers(settings.redis_url,
                  kube=any(getattr(m, "NEEDS_KUBERNETES", False) for m in loaded),
                  kinds=[k for m in loaded for k in getattr(m, "required_kinds", list)()])
    for module in loaded:  # what the processes will run with, e.g. the routing the install has
        note = getattr(module, "start_note", None)
        if note is not None:
            click.echo(note(), err=True)
    temp_dir = None
    if metrics_on and metrics_dir is None:
        metrics_dir = temp_dir = tempfile.mkdtemp(prefix="warmpool-metrics-")
    pool = WorkerPool(
        settings, processes=processes, threads=threads, modules=modules, log_level=level,
        log_format=fmt,
        metrics_dir=metrics_dir if metrics_on else None,
    )
    server = None
    health = None
    try:
        if metrics_on:
            assert metrics_dir is not None
            server = _serve_metrics(pool, metrics_dir, metrics_host, metrics_port)
        if health_on:
            health = _serve_health(pool, settings, health_host, health_port)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        pool.start()
        url = server.url if server is not None else ("unavailable" if metrics_on else "off")
        health_url = (f"http://{_hostport(*health.address)}" if health is not None
                      else ("unavailable" if health_on else "off"))
        click.echo(
            f"{processes} worker processes x {threads} threads on {settings.queue_name} "
            f"metrics={url} health={health_url}", err=True
        )
        pool.supervise(stop)
    finally:
        pool.stop()
        if server is not None:
            server.stop()
        if health is not None:
            health.stop()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


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


def _serve_health(
    pool: WorkerPool, settings: QueueSettings, host: str, port: int
) -> HealthServer | None:
    """The supervisor's probe endpoint (`workers.health`). A port asked for must be free;
    the default one taken (a second `warmpool worker` on one host) is a warning."""
    from warmpool.health import HealthServer
    from workers.health import WorkerHealth, redis_ping

    assert settings.redis_url is not None
    explicit = (click.get_current_context().get_parameter_source("health_port")
                is not click.core.ParameterSource.DEFAULT)
    try:
        return HealthServer(WorkerHealth(pool, redis_ping(settings.redis_url)), host,
                            port).start()
    except OSError as exc:
        if explicit:
            raise click.ClickException(f"health port {host}:{port}: {exc}") from None
        logging.getLogger(__name__).warning("health endpoints not served: %s:%d: %s",
                                            host, port, exc)
        return None


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
