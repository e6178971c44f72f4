"""`warmpool config`: the effective value of every setting, where it came from, and whether
the roles would accept it; `--markdown` prints the configuration reference.

What a role would run with is otherwise found out by starting it. This shows it beforehand
(in a pod: `kubectl exec deploy/warmpool-scheduler -- warmpool config`), and runs the same
parsers the roles run at start, so a bad value is reported here with the same message. Values
are shown as set, except that passwords never are: a secret setting goes through `redact_url`
(the one used for every URL the CLI prints). A `WARMPOOL_*` variable that is not a setting is
named (a typo'd name is otherwise silently ignored), without its value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import click

from warmpool.cli.output import Column, Output, Table, output_options
from warmpool.config import redact_url
from warmpool.errors import BadValue
from warmpool.settings_registry import BY_NAME, ROLES, SETTINGS, Setting, render_markdown

#: Variables of the test suite, not of warmpool (tests/README.md).
TEST_PREFIX = "WARMPOOL_TEST_"
DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class Effective:
    """One setting as a role would see it: `shown` is the value, redacted if secret (None:
    unset, the default applies); `source` the flag, `$VARIABLE` or `default`."""

    setting: Setting
    shown: str | None
    source: str


def shown_value(setting: Setting, value: str) -> str:
    """The value as it may be printed: a secret one without its passwords."""
    if not setting.secret:
        return value
    redacted = redact_url(value)
    # A secret that is not a URL with a password in it may still be one whole.
    return redacted if redacted != value or "://" in value else "***"


def effective(environ: Mapping[str, str], flags: Mapping[str, str | None]) -> list[Effective]:
    """Every setting's value and source: a flag given (`flags`: flag -> value), else the
    variable (if set, and not empty where empty means unset), else the default."""
    out = []
    for s in SETTINGS:
        flag_value = flags.get(s.flag) if s.flag else None
        raw = environ.get(s.name)
        if flag_value:
            out.append(Effective(s, shown_value(s, flag_value), s.flag or ""))
        elif raw is not None and (raw.strip() or not s.empty_is_unset):
            out.append(Effective(s, shown_value(s, raw), f"${s.name}"))
        else:
            out.append(Effective(s, None, DEFAULT))
    return out


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`WARMPOOL_*` names set but not settings (a typo, or a setting of another version)."""
    return sorted(name for name in environ
                  if name.startswith("WARMPOOL_") and name not in BY_NAME
                  and not name.startswith(TEST_PREFIX))


def problems(environ: Mapping[str, str], flags: Mapping[str, str | None]) -> list[str]:
    """What the roles' own parsers refuse in this configuration, one message each (they name
    the variable); empty when everything would start."""
    from warmpool import logs
    from warmpool.config import resolve_namespace
    from warmpool.controller.timeouts import TimeoutSettings
    from warmpool.kube.pacing import PacingSettings
    from warmpool.pool.builders import PoolSettings
    from warmpool.queue.settings import QueueSettings

    env = dict(environ)
    checks: list[Callable[[], object]] = [
        lambda: QueueSettings.from_env(env),
        lambda: PoolSettings.from_env(env),
        lambda: TimeoutSettings.from_env(env),
        lambda: PacingSettings.from_env(env),
        lambda: logs.resolve(environ=env),
    ]
    if flags.get("--namespace"):  # the CLI's one namespace; the roles take a list
        checks.append(lambda: resolve_namespace(flags["--namespace"], None, env))
    out = []
    for check in checks:
        try:
            check()
        except (TypeError, ValueError, click.ClickException) as exc:
            text = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            out.append(text)
    return out


def _cell(entry: Effective) -> str:
    """The value; an empty one as `""` (set, and empty on purpose); the default in
    parentheses."""
    if entry.shown is None:
        return f"({entry.setting.default.replace('`', '')})"
    return entry.shown or '""'


@click.command("config")
@click.option("--kubeconfig", default=None, metavar="PATH", help="As the other commands take it.")
@click.option("--namespace", "-n", "namespace", default=None, metavar="NS",
              help="As the other commands take it.")
@click.option("--redis-url", default=None, metavar="URL", help="As the other commands take it.")
@click.option("--role", type=click.Choice(ROLES), default=None,
              help="Only the settings this role reads.")
@output_options
@click.option("--markdown", is_flag=True,
              help="Print the configuration reference (docs/configuration.md) and exit.")
def config(kubeconfig: str | None, namespace: str | None, redis_url: str | None,
           role: str | None, out: Output, markdown: bool) -> None:
    """The effective settings: value (passwords redacted), and whether it came from a flag,
    the environment or the default. Checks the values as the roles do: exit 2 if one would
    refuse to start. Reference: docs/configuration.md.

    \b
    -o wide: the roles that read each setting too.
    -o json | -o yaml: [{"name", "value", "source", "default", "roles", "secret"}]
    """
    if markdown:
        click.echo(render_markdown(), nl=False)
        return
    flags = {"--kubeconfig": kubeconfig, "--namespace": namespace, "--redis-url": redis_url}
    rows = [e for e in effective(os.environ, flags) if role is None or role in e.setting.roles]
    if not out.document([{"name": e.setting.name, "value": e.shown, "source": e.source,
                          "default": e.setting.default.replace("`", ""),
                          "roles": list(e.setting.roles), "secret": e.setting.secret}
                         for e in rows]):
        # the value last: the one cell that may hold blanks
        t = Table("name", "source", Column("roles", wide=True), "value")
        for e in rows:
            t.add_row(e.setting.name, e.source, ",".join(e.setting.roles), _cell(e))
        out.table(t)
    for name in unknown_variables(os.environ):
        click.echo(f"warning: {name} is set but is not a warmpool setting "
                   "(docs/configuration.md lists them)", err=True)
    found = problems(os.environ, flags)
    for message in found[:-1]:
        click.secho(f"error: {message}", fg="red", err=True)
    if found:
        raise BadValue(found[-1])
