"""Every `warmpool ...` command a runbook names exists: an operator paged at night pastes it.

The alert rules once told operators to run `warmpool queue dead` and `warmpool queue locks`,
which never existed (issue #31). Each command in backticks in the runbooks is parsed by the
real CLI with `--help` appended: a command, sub-command or option that does not exist is a
usage error (exit 2), so a wrong name fails here. Placeholders (KEY, N) are positional
arguments, which `--help` does not check; `[...]` marks optional parts, which are checked too,
and `a|b` alternatives are checked one by one.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmpool.cli.main import _register, cli

ROOT = Path(__file__).resolve().parents[2]
#: The runbooks: the alert rules' descriptions and the metrics guide.
RUNBOOKS = (ROOT / "metrics" / "alerts.yml", ROOT / "metrics" / "README.md")
_COMMAND = re.compile(r"`(warmpool [^`]+)`")


def named_commands(text: str) -> list[str]:
    """The `warmpool ...` commands in backticks in `text` (markdown's `\\|` unescaped)."""
    return [m.replace("\\|", "|") for m in _COMMAND.findall(text)]


def variants(command: str) -> list[list[str]]:
    """The argument lists a command stands for: brackets dropped, each `a|b` alternative."""
    words = shlex.split(command.replace("[", " ").replace("]", " "))[1:]
    return [list(choice) for choice in itertools.product(*(w.split("|") for w in words))]


CASES = sorted({(path.name, command) for path in RUNBOOKS
                for command in named_commands(path.read_text())})


def test_the_runbooks_name_commands() -> None:
    assert len(CASES) >= 4, CASES  # the extraction finds them (not a vacuous pass)
    assert named_commands("see `warmpool a\\|b` and `warmpool_x` and `kubectl x`") == [
        "warmpool a|b"]
    assert variants("warmpool a [--x N] b|c") == [["a", "--x", "N", "b"],
                                                   ["a", "--x", "N", "c"]]


@pytest.mark.parametrize(("runbook", "command"), CASES)
def test_each_command_a_runbook_names_parses(runbook: str, command: str) -> None:
    _register()
    for args in variants(command):
        result = CliRunner().invoke(cli, [*args, "--help"])
        assert result.exit_code == 0, f"{runbook}: `{command}` ({args}): {result.output}"


def test_a_command_that_does_not_exist_is_caught() -> None:
    _register()
    for wrong in ("warmpool queue dead", "warmpool queue locks", "warmpool locks --bogus"):
        (args,) = variants(wrong)
        assert CliRunner().invoke(cli, [*args, "--help"]).exit_code == 2, wrong
