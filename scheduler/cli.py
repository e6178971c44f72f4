"""`warmpool scheduler` (or `python -m scheduler`): watch the cluster, add work keys to the queue.

Run two or more for availability: they elect a leader with a Lease, only the leader adds keys,
and a standby takes over (with a full resync) when the leader's Lease lapses or is released.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from warmpool.pool.builders import PoolSettings

from scheduler.app import RESYNC_PERIOD, Scheduler, SchedulerConfig
from scheduler.leader import DEFAULT_LEASE_NAME, LeaderConfig, default_identity
from warmpool import logs
from warmpool.config import check_servers, queue_settings, require_redis_url
from warmpool.health import HealthServer
from warmpool.logs import DEFAULT_LEVEL, FORMATS, LOG_FORMAT_ENV, LOG_LEVEL_ENV


def parse_namespaces(values: tuple[str, ...]) -> list[str] | None:
    """Repeated and/or comma-separated names; none means every namespace."""
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    return list(dict.fromkeys(names)) or None


def schedules_served(kubeconfig: str | None) -> bool:
    """Whether the cluster has warmpool's PoolSchedule CRD; without it the scheduler watches
    no schedules (a watch of a kind not served never syncs) and says so once."""
    from warmpool.kube import kinds
    from warmpool.kube.api import Kube, connect

    served = Kube(connect(kubeconfig)).serves(*kinds.SCHEDULES[:2])
    if not served:
        logging.getLogger(__name__).warning(
            "no PoolSchedule CRD on this cluster: scheduled pool sizes are off (%s)",
            kinds.SCHEDULES[2])
    return served


def settled_routes(kubeconfig: str | None, pool: PoolSettings) -> PoolSettings:
    """`pool` with the routing the install has where WARMPOOL_ROUTES is unset (the fork:
    HTTPRoutes; upstream: the shared Ingress), stated in one log line at start."""
    from warmpool.kube import kinds
    from warmpool.kube.api import Kube, connect

    settled, said = kinds.settle_routes(Kube(connect(kubeconfig)), pool, os.environ)
    logging.getLogger(__name__).info("%s", said)
    return settled


@click.command("scheduler")
@click.option("--namespace", "-n", "namespaces", multiple=True, envvar="WARMPOOL_NAMESPACE",
              help="Namespace(s) to watch, comma-separated or repeated "
                   "[default: $WARMPOOL_NAMESPACE, else all namespaces].")
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
              help="Kubeconfig file [default: $KUBECONFIG, else in-cluster, else ~/.kube/config].")
@click.option("--redis-url", envvar="WARMPOOL_REDIS_URL", default=None,
              help="The work queue's Redis URL [env: WARMPOOL_REDIS_URL; required: without "
                   "it the scheduler exits 4].")
@click.option("--queue", "queue_name", default=None, help="Queue name (default: warmpool).")
@click.option("--resync-period", type=float, default=RESYNC_PERIOD, show_default=True,
              help="Seconds between full resyncs (a PoolKey per AppDefinition); a Redis that "
                   "lost its data is resynced at once (the epoch, every "
                   "WARMPOOL_QUEUE_EPOCH_PERIOD seconds).")
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True,
              help="Elect a leader with a Lease; without, this process always adds keys.")
@click.option("--lease-name", default=DEFAULT_LEASE_NAME, show_default=True)
@click.option("--lease-namespace", envvar="WARMPOOL_LEASE_NAMESPACE", default=None,
              help="[default: $WARMPOOL_LEASE_NAMESPACE, else the first watched namespace, "
                   "else default]")
@click.option("--lease-duration", type=float, default=15.0, show_default=True)
@click.option("--renew-deadline", type=float, default=10.0, show_default=True)
@click.option("--retry-period", type=float, default=2.0, show_default=True)
@click.option("--identity", default=None, help="Leader election identity [default: host_pid].")
@click.option("--watch-timeout", type=(float, float), default=(300.0, 600.0), show_default=True,
              help="Each watch asks the server to end it after a random time in this range (s).")
@click.option("--health-host", default="127.0.0.1", show_default=True)
@click.option("--health-port", type=int, default=8080, show_default=True,
              help="Port for /healthz, /readyz and /status; 0 picks a free one (printed).")
@click.option("--metrics/--no-metrics", "metrics_on", default=True, show_default=True,
              help="Serve Prometheus metrics: this scheduler's, and the queue and pool gauges "
                   "read from Redis (metrics/README.md).")
@click.option("--metrics-host", default="0.0.0.0", show_default=True)
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=9090,
              show_default=True,
              help="Port for /metrics; 0 picks a free one (printed). If the default port is "
                   "taken the scheduler runs without metrics (warning); a port given "
                   "explicitly must be free.")
@click.option("--log-level", default=None,
              help=f"[default: ${LOG_LEVEL_ENV}, else {DEFAULT_LEVEL}]")
@click.option("--log-format", type=click.Choice(FORMATS), default=None,
              help=f"text, or one JSON object a line [default: ${LOG_FORMAT_ENV}, else text]")
def scheduler(
    namespaces: tuple[str, ...], kubeconfig: str | None, redis_url: str | None,
    queue_name: str | None, resync_period: float, leader_elect: bool, lease_name: str,
    lease_namespace: str | None, lease_duration: float, renew_deadline: float,
    retry_period: float, identity: str | None, watch_timeout: tuple[float, float],
    health_host: str, health_port: int, metrics_on: bool, metrics_host: str, metrics_port: int,
    log_level: str | None, log_format: str | None,
) -> None:
    """Watch AppDefinitions, Sessions and pool objects; add the keys their changes need."""
    # First: nothing else is worth checking for keys nobody else would see.
    redis_url = require_redis_url(redis_url, "scheduler")
    try:
        logs.setup("scheduler", *logs.resolve(log_level, log_format))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    # A kubeconfig with insecure-skip-tls-verify (the local cluster) chose that: say it once.
    warnings.filterwarnings("once", message="Unverified HTTPS request")
    from warmpool.kube.api import Kube, connect
    from warmpool.queue.keyed import KeyedQueue

    ns_list = parse_namespaces(namespaces)
    if resync_period <= 0:
        raise click.BadParameter("must be > 0", param_hint="--resync-period")
    if not 0 < watch_timeout[0] <= watch_timeout[1]:
        raise click.BadParameter("need 0 < MIN <= MAX", param_hint="--watch-timeout")
    leader = None
    if leader_elect:
        try:
            leader = LeaderConfig(
                namespace=lease_namespace or (ns_list[0] if ns_list else "default"),
                name=lease_name, identity=identity or default_identity(),
                lease_duration=lease_duration, renew_deadline=renew_deadline,
                retry_period=retry_period)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--lease-duration/--renew-deadline/"
                                     "--retry-period") from None
    from metrics.collectors import AddCounter
    from warmpool.kube import kinds
    from warmpool.pool.builders import PoolSettings

    try:
        pool = PoolSettings.from_env(os.environ)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    settings = queue_settings(redis_url, queue_name=queue_name)
    check_servers(settings.redis_url, kube=True, kubeconfig=kubeconfig,
                  namespaces=[*(ns_list or ()), *([leader.namespace] if leader else [])],
                  kinds=kinds.theia())
    # Where WARMPOOL_ROUTES is unset, route as the install does (the fork: HTTPRoutes;
    # upstream: the shared Ingress), and say so; then check what that routing needs.
    pool = settled_routes(kubeconfig, pool)
    check_servers(None, kube=True, kubeconfig=kubeconfig, kinds=kinds.required(pool))
    schedules = schedules_served(kubeconfig)
    adds = AddCounter()
    producer = KeyedQueue.from_settings(settings, observer=adds)
    config = SchedulerConfig(namespaces=ns_list, resync_period=resync_period,
                             epoch_period=settings.epoch_period, watch_timeout=watch_timeout,
                             leader=leader, routes=pool.routing, ingresses=pool.ingress,
                             schedules=schedules)
    from warmpool.queue.epoch import Epoch

    epoch = Epoch(producer.client, producer.layout, create=True)
    app = Scheduler(lambda: Kube(connect(kubeconfig)), producer, config, epoch=epoch)
    try:
        health = HealthServer(app, health_host, health_port).start()
    except OSError as exc:
        raise click.ClickException(f"health port {health_host}:{health_port}: {exc}") from None
    metrics_url = "off"
    metrics_server = None
    if metrics_on:
        from metrics.exposition import scheduler_registry, serve

        explicit = (click.get_current_context().get_parameter_source("metrics_port")
                    is not click.core.ParameterSource.DEFAULT)
        registry = scheduler_registry(app, producer.client, producer.settings, adds)
        try:
            metrics_server = serve(registry, metrics_host, metrics_port, required=explicit)
        except OSError as exc:
            health.stop()
            raise click.ClickException(
                f"metrics port {metrics_host}:{metrics_port}: {exc}") from None
        metrics_url = metrics_server.url if metrics_server is not None else "unavailable"

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    host, port = health.address
    click.echo(f"scheduler pid={os.getpid()} identity={leader.identity if leader else '-'} "
               f"namespaces={','.join(ns_list) if ns_list else '*'} "
               f"queue={settings.queue_name} health=http://{host}:{port} "
               f"metrics={metrics_url}", nl=True)
    sys.stdout.flush()
    app.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        logging.getLogger(__name__).info("stopping: releasing the lease")
        app.stop()
        health.stop()
        if metrics_server is not None:
            metrics_server.stop()
