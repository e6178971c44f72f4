"""One way for every `warmpool` command to fail: one line on stderr, a distinct exit code.

Exit codes (also in `warmpool --help`):

  0  done
  1  failed (a cluster step, a persistent conflict, an unexpected error)
  2  usage or bad value (click's own code)
  3  not found (an AppDefinition, a dead letter)
  4  unreachable or misconfigured (Redis, the Kubernetes API, a missing kubeconfig)

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

EXIT_CODES_HELP = (
    "Exit codes: 0 done, 1 failed, 2 usage or bad value, 3 not found, "
    "4 unreachable or misconfigured (Redis, Kubernetes API, kubeconfig)."
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


class CredentialsRefused(Unreachable):
    """The server answers and says no: waiting will not help (unlike a server still booting)."""


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

    import redis
    import urllib3.exceptions
    from kubernetes.config import ConfigException
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    from warmpool.kube.api import Conflict, KubeError

    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return Unreachable(f"lost the connection to Redis: {exc}; check that it runs and that "
                           "WARMPOOL_REDIS_URL (or --redis-url) names it")
    if isinstance(exc, redis.RedisError):
        return CliError(f"Redis refused a command: {exc}")
    if isinstance(exc, urllib3.exceptions.HTTPError):
        return Unreachable(f"cannot reach the Kubernetes API server: {_reason(exc)}; check "
                           "KUBECONFIG (or --kubeconfig) and that the server runs")
    if isinstance(exc, ConfigException):
        return Unreachable(f"bad Kubernetes configuration: {exc}; check KUBECONFIG "
                           "(or --kubeconfig)")
    if isinstance(exc, ResourceNotFoundError):
        return Unreachable(f"the API server does not serve it: {exc}; are the theia.cloud CRDs "
                           "installed (warmpool/kube/crds), and is this the right cluster?")
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


class FriendlyGroup(click.Group):
    """The root group: every sub-command's failure goes through `translate`, here, once."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            error = translate(exc)
            if _debug(ctx) and not isinstance(exc, click.UsageError):
                traceback.print_exception(exc, file=sys.stderr)
            raise error from exc


__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "BadValue",
    "CliError",
    "CredentialsRefused",
    "FriendlyGroup",
    "NotFound",
    "Unreachable",
    "one_line",
    "translate",
]
