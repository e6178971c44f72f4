"""The one log setup of the scheduler, the worker supervisor and the worker processes.

Each used to configure its own text format (three of them); an operator's log pipeline wants
one shape, and JSON on request (`WARMPOOL_LOG_FORMAT=json`, or `--log-format json`): one
object per line with the time, level, logger, role and message, and the fields that say which
work a line is about: the queue key and the fence of the lease it ran under (set by the
worker's run loop, `job_context`) and a Session's uid (`extra={"session_uid": ...}`).

Never an e-mail address: a Session's user is its e-mail, and a log line is read by more people
than the Session is. The code never logs one on purpose (a Session is named by name and uid);
the formatter also replaces anything shaped like one, so a message quoting an object's
field cannot leak it either.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime

#: The setting (an environment variable; `--log-format` overrides it): "text" or "json".
LOG_FORMAT_ENV = "WARMPOOL_LOG_FORMAT"
#: The setting for the level (`--log-level` overrides it): a `logging` level name.
LOG_LEVEL_ENV = "WARMPOOL_LOG_LEVEL"
FORMATS = ("text", "json")
DEFAULT_LEVEL = "INFO"

_TEXT = "%(asctime)s %(process)d %(levelname)s %(name)s [%(role)s]%(context)s %(message)s"
# Local part and domain as RFC 5322 allows them loosely: over-matching only hides text.
_EMAIL = re.compile(r"[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+")
REDACTED = "<e-mail>"

_job: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "warmpool_job", default=None)


@contextlib.contextmanager
def job_context(key: str, fence: int) -> Iterator[None]:
    """Every log line of this thread inside the block names the key and the fence."""
    token = _job.set((key, fence))
    try:
        yield
    finally:
        _job.reset(token)


def redact(text: str) -> str:
    """`text` with every e-mail-shaped part replaced."""
    return _EMAIL.sub(REDACTED, text)


class _Context(logging.Filter):
    """Adds role, key, fence (and the text form of them) to every record."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        job = _job.get()
        key, fence = job if job is not None else (None, None)
        setattr(record, "key", key)  # noqa: B010 (a LogRecord takes any attribute; mypy not)
        setattr(record, "fence", fence)  # noqa: B010
        parts = [f"key={key} fence={fence}"] if job is not None else []
        uid = getattr(record, "session_uid", None)
        if uid:
            parts.append(f"session_uid={uid}")
        record.context = "".join(f" {p}" for p in parts)
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line; fields absent (not null) when unknown."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "role": getattr(record, "role", None),
            "pid": record.process,
            "msg": redact(record.getMessage()),
        }
        for field in ("key", "fence", "session_uid"):
            value = getattr(record, field, None)
            if value is not None:
                out[field] = value
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps({k: val for k, val in out.items() if val is not None},
                          ensure_ascii=False)


def resolve(
    level: str | None = None, fmt: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """The level and format asked for: the flag's value, else the setting (in `environ`,
    default this process's environment), else the default. An unknown value raises
    ValueError naming the variable (the CLIs turn it into one `error:` line)."""
    env = os.environ if environ is None else environ
    fmt = (fmt or env.get(LOG_FORMAT_ENV) or "text").lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)} "
                         f"({LOG_FORMAT_ENV} or --log-format)")
    name = (level or env.get(LOG_LEVEL_ENV) or DEFAULT_LEVEL).upper()
    number = logging.getLevelName(name)
    if not isinstance(number, int):
        raise ValueError(f"log level {name!r}: expected DEBUG, INFO, WARNING or ERROR "
                         f"({LOG_LEVEL_ENV} or --log-level)")
    return number, fmt


def setup(role: str, level: int, fmt: str) -> None:
    """Configure the root logger of this process: one handler on stderr, `fmt` lines,
    `level`. Replaces any handler set before (a re-exec'd child, a second call)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_Context(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # The client library's connection-pool chatter says nothing an operator can act on.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
