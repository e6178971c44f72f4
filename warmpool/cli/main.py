"""The `warmpool` command: one entry point, one sub-command group per role or tool."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """warmpool: keeps Theia Cloud's pool of prewarmed instances, scaled out over Redis."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    """Attach sub-commands; each lives in its own module so `--help` stays cheap to import."""
    from scheduler.cli import scheduler
    from warmpool.cli import cluster, demo
    from workers.cli import worker

    cli.add_command(cluster.cluster)
    cli.add_command(demo.demo)
    cli.add_command(scheduler)
    cli.add_command(worker)


def main() -> None:
    _register()
    cli(prog_name="warmpool")
