"""Output for people (rich tables within 80 columns) and for programs (`--json`).

No e-mail address is ever printed: Session names identify who holds what, and every free text
that comes from the cluster or the queue (event messages, Session messages, errors) goes
through `redact` first, since a server message may quote an object's data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = ["Out", "age", "console", "emit_json", "escape", "joined", "last_line", "redact",
           "rounded", "table"]

MAX_WIDTH = 80

_EMAIL = re.compile(r"[^\s@,;:<>()\[\]\"'`/|=]+@[^\s@,;:<>()\[\]\"'`/|=]+\.[A-Za-z]{2,}")
REDACTED = "<e-mail>"


def redact(text: str | None) -> str:
    return _EMAIL.sub(REDACTED, text or "")


class Out:
    """A console no wider than 80 columns (narrower if the terminal or $COLUMNS is), whose
    lines carry no trailing padding."""

    def __init__(self) -> None:
        self.console = Console(width=min(Console().width, MAX_WIDTH), highlight=False,
                               soft_wrap=False)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        with self.console.capture() as captured:
            self.console.print(*objects, **kwargs)
        click.echo("\n".join(line.rstrip() for line in captured.get().split("\n")), nl=False)


def console() -> Out:
    return Out()


class PlainTable(Table):
    """A table whose string cells are shown as they are: never read as rich markup (a
    message such as "must match ^[a-z0-9A-Z-_]+$" would otherwise lose its brackets)."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **kwargs)


def table(*columns: str) -> Table:
    """Headed columns, no frame; cells fold rather than widen the table past the console."""
    t = PlainTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    for col in columns:
        t.add_column(col, overflow="fold")
    return t


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def age(seconds: float | None) -> str:
    """12s, 3m04s, 2h05m, 3d04h; '-' for none."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def last_line(text: str | None) -> str:
    """The last non-empty line of a traceback: the exception and its message."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def joined(items: Iterable[str], empty: str = "-") -> str:
    out = ", ".join(items)
    return out or empty
