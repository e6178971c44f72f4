"""One way to fail for every command: one line on stderr, a distinct exit code; --debug adds
the traceback."""

from __future__ import annotations

import re

import click
import pytest
import redis
import urllib3
from click.testing import CliRunner
from kubernetes.client.rest import ApiException
from kubernetes.config import ConfigException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from warmpool import errors
from warmpool.cli.main import _register, cli
from warmpool.cluster.local import ClusterError
from warmpool.errors import (
    EXIT_CODES_HELP,
    EXIT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    EXIT_WRONG_SERVER,
    CliError,
    FriendlyGroup,
    NotFound,
    translate,
)
from warmpool.kube.api import Conflict, KubeError


@pytest.mark.parametrize(("exc", "code", "fragment"), [
    (redis.ConnectionError("Connection refused"), EXIT_UNREACHABLE, "Redis"),
    (redis.TimeoutError("timed out"), EXIT_UNREACHABLE, "WARMPOOL_REDIS_URL"),
    (redis.ResponseError("WRONGTYPE"), EXIT_FAILED, "WRONGTYPE"),
    (urllib3.exceptions.MaxRetryError(None, "/version", "refused"), EXIT_UNREACHABLE,
     "Kubernetes API"),
    (ConfigException("no context"), EXIT_UNREACHABLE, "KUBECONFIG"),
    (ResourceNotFoundError("No matches found for {'kind': 'AppDefinition'}"), EXIT_UNREACHABLE,
     "CRDs"),
    (KubeError(403, "forbidden"), EXIT_CREDENTIALS, "RBAC"),
    (KubeError(401, "unauthorized"), EXIT_CREDENTIALS, "credentials"),
    (ApiException(status=401, reason="Unauthorized"), EXIT_CREDENTIALS, "401 Unauthorized"),
    (ApiException(status=503, reason="Service Unavailable"), EXIT_UNREACHABLE, "503"),
    (redis.AuthenticationError("invalid username-password pair"), EXIT_CREDENTIALS,
     "PASSWORD"),
    (redis.exceptions.NoPermissionError("NOPERM"), EXIT_CREDENTIALS, "NOPERM"),
    (redis.exceptions.InvalidResponse("Protocol Error: b'H'"), EXIT_WRONG_SERVER,
     "does not speak Redis"),
    (KubeError(404, "gone"), EXIT_NOT_FOUND, "gone"),
    (KubeError(503, "unavailable"), EXIT_UNREACHABLE, "unavailable"),
    (KubeError(None, "no status"), EXIT_UNREACHABLE, "no status"),
    (KubeError(422, "invalid"), EXIT_FAILED, "invalid"),
    (Conflict("changed"), EXIT_FAILED, "try again"),
    (ClusterError("etcd did not start", detail="log\ntail"), EXIT_FAILED, "etcd did not start"),
    (PermissionError(13, "Permission denied"), EXIT_UNREACHABLE, "Permission denied"),
    (click.UsageError("No such option: --x"), EXIT_USAGE, "No such option"),
    (click.ClickException("worker exited"), EXIT_FAILED, "worker exited"),
    (ZeroDivisionError("division by zero"), EXIT_FAILED, "--debug"),
])
def test_translate(exc: BaseException, code: int, fragment: str) -> None:
    error = translate(exc)
    assert isinstance(error, CliError)
    assert error.exit_code == code
    assert fragment in error.message
    assert "\n" not in error.message


@click.group(cls=FriendlyGroup)
@click.option("--debug", is_flag=True)
@click.pass_context
def root(ctx: click.Context, debug: bool) -> None:
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


@root.command()
def missing() -> None:
    raise NotFound("AppDefinition 'x' not found in namespace 'ns'")


@root.command()
def crash() -> None:
    raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1.\nConnection refused.")


@root.command()
@click.option("--n", type=int, required=True)
def number(n: int) -> None:
    click.echo(n)


@root.group()
def nested() -> None:
    pass


@nested.command()
def deep() -> None:
    raise KubeError(500, "etcdserver: request timed out")


@root.command()
def exits() -> None:
    click.get_current_context().exit(5)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(root, list(args), obj=None)
    return result.exit_code, result.stdout, result.stderr


def test_each_failure_is_one_line_with_its_exit_code_and_no_traceback() -> None:
    for args, code, fragment in (
        (["missing"], EXIT_NOT_FOUND, "error: AppDefinition 'x' not found"),
        (["crash"], EXIT_UNREACHABLE, "error: lost the connection to Redis"),
        (["nested", "deep"], EXIT_UNREACHABLE, "etcdserver"),
        (["number", "--n", "x"], EXIT_USAGE, "'--n'"),
        (["number"], EXIT_USAGE, "Missing option '--n'"),
        (["nope"], EXIT_USAGE, "No such command 'nope'"),
    ):
        got, stdout, stderr = invoke(*args)
        assert got == code, (args, stderr)
        assert stdout == ""
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert fragment in stderr and "Traceback" not in stderr, stderr


def test_usage_errors_point_at_the_commands_help() -> None:
    _, _, stderr = invoke("number", "--n", "x")
    assert "(see 'root number --help')" in stderr


def test_debug_adds_the_traceback_and_keeps_the_exit_code() -> None:
    code, _, stderr = invoke("--debug", "crash")
    assert code == EXIT_UNREACHABLE
    assert "Traceback (most recent call last)" in stderr and "ConnectionError" in stderr
    assert stderr.strip().splitlines()[-1].startswith("error: lost the connection to Redis")
    code, _, stderr = invoke("--debug", "number")
    assert code == EXIT_USAGE and "Traceback" not in stderr  # a usage error has no story


def test_a_bare_group_prints_its_help_and_exits_0() -> None:
    """click 8.2 made a bare group a usage error; translated to one line, the help came out
    cut short as `error: Usage: ...`. A bare group prints its help, whole, on stdout."""
    for args in ([], ["nested"]):
        code, stdout, stderr = invoke(*args)
        assert code == 0 and stderr == "", stderr
        assert stdout.startswith("Usage: root") and "Commands:" in stdout


def test_every_exit_code_is_documented_once_in_help_and_readme() -> None:
    """One code per class of failure, each named in `warmpool --help` and in README's
    Commands section, so a script can tell them apart."""
    from tests.cli_run import ROOT

    codes = {getattr(errors, n) for n in errors.__all__ if n.startswith("EXIT_")
             and n != "EXIT_CODES_HELP"}
    assert codes == set(range(1, 7))
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    for code in [0, *sorted(codes)]:
        assert f" {code} " in EXIT_CODES_HELP or EXIT_CODES_HELP.startswith(
            f"Exit codes: {code} "), code
        assert f"| {code} |" in section, code


def test_explicit_exits_pass_through() -> None:
    assert invoke("exits")[0] == 5


def test_the_warmpool_root_group_is_the_friendly_one() -> None:
    _register()
    assert isinstance(cli, FriendlyGroup)
    result = CliRunner().invoke(cli, ["no-such-command"])
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip().splitlines() == [
        "error: No such command 'no-such-command'. (see 'cli --help')"]
    assert "Exit codes" in CliRunner().invoke(cli, ["--help"]).stdout
    version = CliRunner().invoke(cli, ["--version"])
    assert version.exit_code == 0 and re.fullmatch(r"warmpool \d+\.\d+\S*\n", version.stdout)
    for group in (["dead-letters"], ["queue"], ["cluster"], []):
        bare = CliRunner().invoke(cli, group)
        assert bare.exit_code == 0 and bare.stderr == "", (group, bare.stderr)
        assert bare.stdout.startswith(f"Usage: {' '.join(['cli', *group])} ")
