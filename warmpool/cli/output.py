"""Output for people (kubectl-style columns) and for programs (`-o json`, `-o yaml`).

Tables are plain columns, as kubectl prints them: upper-case headers, each column as wide as
its widest cell, three spaces between columns, no frame, no trailing blanks. A cell is never
wrapped, folded or cut, whatever the terminal's width and when the output is not a terminal:
a key one command prints (`warmpool locks`) is pasted whole into another (`warmpool queue
show KEY`), and `awk '{print $1}'` reads a column. A row wider than the terminal is left to
the terminal to wrap on screen, where copying keeps it one line (kubectl does the same).
`-o wide` adds the columns marked wide; `-o json` and `-o yaml` print the command's document
(the same keys in both), which its `--help` describes.

No e-mail address is ever printed: Session names identify who holds what, and every free text
that comes from the cluster or the queue (event messages, Session messages, errors) goes
through `redact` first, since a server message may quote an object's data.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import click

__all__ = ["FORMATS", "Column", "Output", "Table", "age", "cell", "joined", "last_line",
           "output_options", "redact", "rounded"]

F = TypeVar("F", bound=Callable[..., Any])

#: The values of `-o/--output`; without it, a table.
FORMATS = ("json", "yaml", "wide")
GAP = "   "  # between columns, as kubectl's tabwriter pads them
EMPTY = "-"  # an empty cell: a blank would shift the columns `awk` reads

_EMAIL = re.compile(r"[^\s@,;:<>()\[\]\"'`/|=]+@[^\s@,;:<>()\[\]\"'`/|=]+\.[A-Za-z]{2,}")
REDACTED = "<e-mail>"


def redact(text: str | None) -> str:
    return _EMAIL.sub(REDACTED, text or "")


def cell(value: object) -> str:
    """A value as one table cell: one line (a server message may carry newlines and runs of
    blanks), `-` for nothing."""
    text = " ".join(str(value).split()) if value is not None else ""
    return text or EMPTY


class Column(NamedTuple):
    header: str
    wide: bool = False  # shown with `-o wide` only


class Table:
    """Rows of cells under headed columns, rendered whole (see the module's docstring)."""

    def __init__(self, *columns: str | Column) -> None:
        self.columns = [c if isinstance(c, Column) else Column(c) for c in columns]
        self.rows: list[list[str]] = []
        self.show_header = True

    def add_row(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([cell(c) for c in cells])

    def lines(self, wide: bool = False) -> list[str]:
        shown = [i for i, c in enumerate(self.columns) if wide or not c.wide]
        grid = [[self.columns[i].header.upper() for i in shown]] if self.show_header else []
        grid += [[row[i] for i in shown] for row in self.rows]
        if not grid:
            return []
        widths = [max(len(r[k]) for r in grid) for k in range(len(shown))]
        return [GAP.join(text.ljust(w) for text, w in zip(r, widths, strict=True)).rstrip()
                for r in grid]


def _yaml(doc: Any) -> str:
    import yaml

    # width: PyYAML folds long strings at 80 columns otherwise (a traceback, a long key)
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False,
                          width=2**31 - 1)


@dataclass(frozen=True, slots=True)
class Output:
    """Where a command's result goes: `format` is None (a table), or one of `FORMATS`."""

    format: str | None = None

    @property
    def wide(self) -> bool:
        return self.format == "wide"

    def document(self, doc: Any) -> bool:
        """Print `doc` as JSON or YAML if that was asked for, and say whether it was: a command
        returns then, else it renders the same document for people."""
        if self.format == "json":
            click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        elif self.format == "yaml":
            click.echo(_yaml(doc), nl=False)
        else:
            return False
        return True

    def line(self, text: str = "") -> None:
        click.echo(text.rstrip())

    def heading(self, text: str) -> None:
        """Bold on a terminal; click drops the styling when the output is not one."""
        click.echo(click.style(text, bold=True))

    def table(self, table: Table) -> None:
        for text in table.lines(self.wide):
            click.echo(text)


def output_options(func: F) -> F:
    """`-o/--output json|yaml|wide` and `--json` (an alias of `-o json`, from before `-o`),
    handed to the command as `out: Output`."""

    @functools.wraps(func)
    def wrapper(*args: Any, output_format: str | None, as_json: bool, **kwargs: Any) -> Any:
        if as_json and output_format not in (None, "json"):
            from warmpool.errors import BadValue

            raise BadValue(f"--json asks for -o json, not -o {output_format}: give one of them")
        return func(*args, out=Output("json" if as_json else output_format), **kwargs)

    wrapper = click.option(
        "--json", "as_json", is_flag=True,
        help="Same as -o json (kept for scripts written before -o).")(wrapper)
    wrapper = click.option(
        "-o", "--output", "output_format", type=click.Choice(FORMATS), default=None,
        help="json or yaml: the document described below; wide: the table with more "
             "columns. [default: a table]")(wrapper)
    return wrapper  # type: ignore[return-value]


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
