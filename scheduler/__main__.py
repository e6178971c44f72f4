"""`python -m scheduler`: the same command as `warmpool scheduler`, with its one-line errors.

The `warmpool` command's root group is the CLI's (warmpool/cli/main.py, above the roles); this
is a root of the same kind (`FriendlyGroup`: every failure one line and its exit code) holding
the scheduler's command alone, so the role imports no tool and loads no other command.
"""

import sys

import click

from scheduler.cli import scheduler
from warmpool.errors import HELP_OPTION_NAMES, FriendlyGroup


@click.group(cls=FriendlyGroup, context_settings={"help_option_names": list(HELP_OPTION_NAMES)})
def _root() -> None:
    """The root `python -m scheduler` runs `scheduler` under."""


_root.add_command(scheduler)
_root(["scheduler", *sys.argv[1:]], prog_name="python -m")
