"""`warmpool cluster ...`: build, start and stop the local Kubernetes control plane.

The heavy lifting is in warmpool.cluster.local; this module only maps it to commands. A
ClusterError becomes one readable line through the root group's error handling, like every
other command's failures (the evidence stays in the component logs, or `warmpool --debug`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from warmpool.cluster import local

F = TypeVar("F", bound=Callable[..., Any])


def _state_dir_option(func: F) -> F:
    return click.option(
        "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Where data, logs and kubeconfig live "
             "[default: ${WARMPOOL_STATE:-~/.local/state/warmpool}/cluster].",
    )(func)


@click.group()
def cluster() -> None:
    """Local Kubernetes v1.20 control plane (etcd, kube-apiserver, kube-controller-manager)."""


@cluster.command()
def build() -> None:
    """Build the binaries from Debian's source package (minutes when cold; reused after)."""
    local.build(progress=True)
    click.echo(f"binaries in {local.bin_dir()}")


@cluster.command()
@_state_dir_option
@click.option("--watch-cache/--no-watch-cache", default=None,
              help="kube-apiserver's watch cache; off makes compaction give 410 Gone to "
                   "watches [default: on, or $WARMPOOL_WATCH_CACHE].")
@click.option("--crds", type=click.Choice(local.CRD_SETS), default="warmpool",
              show_default=True,
              help="Theia Cloud's CRDs to install: warmpool's own (the EduIDE-Cloud fork's "
                   "versions, AppDefinition v1beta11) or upstream Theia Cloud's (v1beta10, "
                   "from its vendored chart). One set per state dir.")
def up(state_dir: Path | None, watch_cache: bool | None, crds: str) -> None:
    """Start the control plane (building it first if needed); does nothing if it runs."""
    info = local.up(state_dir, watch_cache=watch_cache, crds=crds)
    click.echo(f"cluster up: {info.server} (etcd {info.etcd_url})")
    click.echo(f"kubeconfig: {info.kubeconfig}")
    click.echo(f"use it:     eval \"$(warmpool cluster env"
               f"{'' if state_dir is None else f' --state-dir {state_dir}'})\"")


@cluster.command()
@_state_dir_option
def down(state_dir: Path | None) -> None:
    """Stop every component; data, kubeconfig and logs are kept."""
    stopped = local.down(state_dir)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@cluster.command()
@_state_dir_option
def env(state_dir: Path | None) -> None:
    """Print `export KUBECONFIG=...` for eval in a shell."""
    click.echo(local.env(state_dir), nl=False)


@cluster.command()
@_state_dir_option
def status(state_dir: Path | None) -> None:
    """Show each component's pid and whether the API server is ready; exit 1 if not ready."""
    st = local.status(state_dir)
    click.echo(f"state dir:  {st['state_dir']}")
    for name, comp in st["components"].items():
        state = "running" if comp["running"] else "stopped"
        pid = f"pid {comp['pid']}" if comp["pid"] else ""
        click.echo(f"  {name:<24} {state:<8} {pid}")
    if st["ready"]:
        click.echo(f"api server: ready at {st['server']}")
        click.echo(f"kubeconfig: {st['kubeconfig']}")
    else:
        click.echo("api server: not ready")
    if not local.binaries_present():
        click.echo(f"binaries:   not built ({local.bin_dir()}); `warmpool cluster build`")
    if not st["ready"]:
        click.get_current_context().exit(1)


__all__ = ["cluster"]
