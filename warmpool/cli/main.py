"""The `warmpool` command: one entry point, one sub-command group per role or tool."""

from __future__ import annotations

import click

from warmpool.errors import EXIT_CODES_HELP, HELP_OPTION_NAMES, FriendlyGroup


@click.group(cls=FriendlyGroup, context_settings={"help_option_names": list(HELP_OPTION_NAMES)},
             epilog=EXIT_CODES_HELP)
@click.version_option(package_name="warmpool", prog_name="warmpool",
                      message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """warmpool: keeps Theia Cloud's pool of prewarmed instances, scaled out over Redis.

    Configuration, for every command: flags, then the environment (KUBECONFIG,
    WARMPOOL_NAMESPACE, WARMPOOL_REDIS_URL, ...), then defaults; `warmpool config` shows the
    effective values, docs/configuration.md lists every setting. The Kubernetes commands
    take --kubeconfig, --context and -n/--namespace as kubectl does.

    Output: tables by default, each cell whole at any width (a key printed by one command
    pastes into another); -o wide adds columns, -o json and -o yaml print the document each
    command's --help describes (--json: the same as -o json).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    """Attach sub-commands; each lives in its own module so `--help` stays cheap to import."""
    from scheduler.cli import scheduler
    from warmpool.cli import cluster, demo, queue, scale, settings, status
    from workers.cli import worker

    cli.add_command(cluster.cluster)
    cli.add_command(settings.config)
    cli.add_command(demo.demo)
    cli.add_command(scheduler)
    cli.add_command(worker)
    cli.add_command(status.status)
    cli.add_command(scale.scale)
    cli.add_command(queue.queue)
    cli.add_command(queue.locks)
    cli.add_command(queue.workers)
    cli.add_command(queue.dead_letters)


def main(argv: list[str] | None = None, prog_name: str = "warmpool") -> None:
    """Run `warmpool` (argv: the arguments after the program name; None: sys.argv's)."""
    _register()
    cli(argv, prog_name=prog_name)
