"""One way for every `warmpool` command to fail: one line on stderr, a distinct exit code.

Exit codes (also in `warmpool --help` and README's Commands section), one per class of
failure, so a script can tell "try later" (4) from "fix the credentials" (5) from "this is the
wrong address" (6):

  0  done
  1  failed (a cluster step, a persistent conflict, an unexpected error)
  2  usage or bad value (click's own code)
  3  not found (an AppDefinition, a namespace, a dead letter)
  4  unreachable or not configured: nothing answers (Redis, the Kubernetes API server), no
     kubeconfig, no Redis URL for a worker or scheduler, or the API server does not serve
     the CRDs
  5  credentials refused: the server answered and said no (401/403, Redis AUTH)
  6  not the expected server: something answers there, but not as a Kubernetes API server
     (an HTML page, a 404 on /apis) or not as Redis speaks

Commands raise a `CliError` subclass when they know what went wrong; anything else that
escapes a command (a Redis connection error, an API server that does not answer, ...) is
translated here by `translate`, once, for all commands, by the root group (`FriendlyGroup`).
`warmpool --debug ...` prints the traceback too, then the same line and the same exit code.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
EXIT_CREDENTIALS = 5
EXIT_WRONG_SERVER = 6

EXIT_CODES_HELP = (
    "Exit codes: 0 done, 1 failed, 2 usage or bad value, 3 not found, "
    "4 unreachable or not configured (Redis or its URL, Kubernetes API, kubeconfig, CRDs), "
    "5 credentials refused, 6 not a Kubernetes API server (or not Redis) at that address."
)


def one_line(text: str, limit: int = 400) -> str:
    """Collapse whitespace (server messages carry newlines) and cut very long texts."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class CliError(click.ClickException):
    """A failure a person can act on: `message` says what, and how to fix it."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(one_line(message))
        if exit_code is not None:
            # click types exit_code as a ClassVar, yet reads it off the instance (as here)
            self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.secho(f"error: {self.format_message()}", fg="red", err=True)


class BadValue(CliError):
    exit_code = EXIT_USAGE


class NotFound(CliError):
    exit_code = EXIT_NOT_FOUND


class Unreachable(CliError):
    """A server does not answer, or the configuration to reach it is missing or wrong."""

    exit_code = EXIT_UNREACHABLE


class Unusable(Unreachable):
    """Exit 4 as well, but nothing to wait for: a configuration that cannot work however long
    the servers take (a kubeconfig that does not parse). `warmpool.config.patiently` retries
    an `Unreachable` for a while; this fails at once."""


class CredentialsRefused(CliError):
    """The server answers and says no: waiting will not help (unlike a server still booting)."""

    exit_code = EXIT_CREDENTIALS


class WrongServer(CliError):
    """Something answers at the address, but not as the server asked for (a web server, a
    proxy's error page, a port of another service): the address is wrong, not the server
    down, so neither waiting nor new credentials will help."""

    exit_code = EXIT_WRONG_SERVER


def _usage(exc: click.UsageError) -> CliError:
    ctx = exc.ctx
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return BadValue(exc.format_message() + hint)


def translate(exc: BaseException) -> CliError:
    """The one-line error for any exception a command let escape."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, click.UsageError):
        return _usage(exc)
    if isinstance(exc, click.ClickException):
        return CliError(exc.format_message(), exit_code=exc.exit_code)
    for servers_error in (_redis_error, _kube_error):
        if (error := servers_error(exc)) is not None:
            return error
    return _other_error(exc)


def _redis_error(exc: BaseException) -> CliError | None:
    """`translate` for what Redis (redis-py) raised; None for anything else."""
    import redis

    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return CredentialsRefused(f"Redis refused the credentials: {exc}; put the password in "
                                  "WARMPOOL_REDIS_URL (redis://:PASSWORD@host:port)")
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return Unreachable(f"lost the connection to Redis: {exc}; check that it runs and that "
                           "WARMPOOL_REDIS_URL (or --redis-url) names it")
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return WrongServer(f"the server at WARMPOOL_REDIS_URL (or --redis-url) does not speak "
                           f"Redis: {exc}; is that the Redis port?")
    if isinstance(exc, redis.RedisError):
        return CliError(f"Redis refused a command: {exc}")
    return None


def _kube_error(exc: BaseException) -> CliError | None:
    """`translate` for what the Kubernetes client (or warmpool.kube) raised; None for
    anything else."""
    import urllib3.exceptions
    from kubernetes.client.rest import ApiException
    from kubernetes.config import ConfigException
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    from warmpool.kube.api import Conflict, KubeError

    if isinstance(exc, urllib3.exceptions.HTTPError):
        return Unreachable(f"cannot reach the Kubernetes API server: {_reason(exc)}; check "
                           "KUBECONFIG (or --kubeconfig) and that the server runs")
    if isinstance(exc, ConfigException):
        return Unreachable(f"bad Kubernetes configuration: {exc}; check KUBECONFIG "
                           "(or --kubeconfig)")
    if isinstance(exc, ApiException):  # the plain client, outside warmpool.kube
        return translate(KubeError(exc.status, f"{exc.status} {exc.reason}"))
    if isinstance(exc, ResourceNotFoundError):
        return Unreachable(f"the API server does not serve it: {exc}; is Theia Cloud installed "
                           "(its CRDs come with Theia Cloud, never from warmpool), and is this "
                           "the right cluster?")
    if isinstance(exc, KubeError):
        if exc.status in (401, 403):
            return CredentialsRefused(f"the API server refused the credentials: {exc}; check the "
                               "kubeconfig's user and its RBAC permissions")
        if exc.status == 404:
            return NotFound(str(exc))
        if exc.status is None or exc.status >= 500:
            return Unreachable(str(exc))
        return CliError(str(exc))
    if isinstance(exc, Conflict):
        return CliError(f"the object kept changing while being written ({exc}); try again")
    return None


def _other_error(exc: BaseException) -> CliError:
    """`translate` for the rest: the local cluster's failures, the file system's, a bug."""
    try:
        from warmpool.cluster.local import ClusterError
    except ImportError:  # pragma: no cover - the package ships it
        pass
    else:
        if isinstance(exc, ClusterError):
            return CliError(exc.message)
    if isinstance(exc, PermissionError | FileNotFoundError):
        return Unreachable(str(exc))
    if isinstance(exc, OSError):
        return CliError(str(exc))
    return CliError(f"unexpected {type(exc).__name__}: {exc} (a bug? run 'warmpool --debug ...' "
                    "for the traceback)")


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)


def _debug(ctx: click.Context) -> bool:
    obj = ctx.find_root().obj
    return bool(isinstance(obj, dict) and obj.get("debug"))


def _print_help(ctx: click.Context) -> None:
    """A group run without a sub-command: its help on stdout and exit 0, as `kubectl config`
    does (click 8.2 turned this into a usage error on stderr, which the one-line translation
    then cut to a truncated line)."""
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit(0)


#: Every root group's help flags (`warmpool`'s and `python -m scheduler`'s): -h as well as --help,
#: inherited by every sub-command.
HELP_OPTION_NAMES = ("-h", "--help")


class FriendlyGroup(click.Group):
    """The root group: every sub-command's failure goes through `translate`, here, once; and
    any group run bare (`warmpool`, `warmpool dead-letters`) prints its help."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            _print_help(ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except click.exceptions.NoArgsIsHelpError as bare:  # a sub-group, run bare
            _print_help(bare.ctx)
        except Exception as exc:
            error = translate(exc)
            if _debug(ctx) and not isinstance(exc, click.UsageError):
                traceback.print_exception(exc, file=sys.stderr)
            raise error from exc


__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_CREDENTIALS",
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "EXIT_WRONG_SERVER",
    "HELP_OPTION_NAMES",
    "BadValue",
    "CliError",
    "CredentialsRefused",
    "FriendlyGroup",
    "NotFound",
    "Unreachable",
    "WrongServer",
    "one_line",
    "translate",
]
