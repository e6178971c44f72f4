"""The one log setup (warmpool.logs): JSON on request, key and fence, never an e-mail."""

from __future__ import annotations

import io
import json
import logging

import pytest

from warmpool import logs


@pytest.fixture
def captured() -> io.StringIO:
    """The root logger configured by `logs.setup`, writing to a buffer."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def _setup(buf: io.StringIO, fmt: str) -> None:
    logs.setup("worker", logging.INFO, fmt)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buf)


def test_json_lines_carry_key_fence_and_session_uid_but_no_email(
    captured: io.StringIO,
) -> None:
    _setup(captured, "json")
    log = logging.getLogger("warmpool.test")
    with logs.job_context("session/ns/s1", 17):
        log.info("Session %s claimed instance %s (user %s)", "s1", 3, "jane@example.com",
                 extra={"session_uid": "u-1"})
    log.info("outside")
    first, second = (json.loads(line) for line in captured.getvalue().splitlines())
    assert first["key"] == "session/ns/s1" and first["fence"] == 17
    assert first["session_uid"] == "u-1" and first["role"] == "worker"
    assert first["level"] == "INFO" and first["logger"] == "warmpool.test"
    assert "jane@example.com" not in captured.getvalue() and "<e-mail>" in first["msg"]
    assert "key" not in second and "fence" not in second and second["msg"] == "outside"


def test_text_lines_name_the_role_and_the_job_and_redact_too(captured: io.StringIO) -> None:
    _setup(captured, "text")
    with logs.job_context("instance/ns/java/1", 4):
        logging.getLogger("x").warning("for a.b+c@d.example.org")
    line = captured.getvalue()
    assert "[worker] key=instance/ns/java/1 fence=4" in line and "WARNING" in line
    assert "@" not in line


def test_flag_then_setting_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logs.LOG_FORMAT_ENV, raising=False)
    monkeypatch.delenv(logs.LOG_LEVEL_ENV, raising=False)
    assert logs.resolve() == (logging.INFO, "text")
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, "JSON")
    monkeypatch.setenv(logs.LOG_LEVEL_ENV, "warning")
    assert logs.resolve() == (logging.WARNING, "json")
    assert logs.resolve("debug", "text") == (logging.DEBUG, "text")
    with pytest.raises(ValueError, match="WARMPOOL_LOG_FORMAT"):
        logs.resolve(fmt="xml")
    with pytest.raises(ValueError, match="WARMPOOL_LOG_LEVEL"):
        logs.resolve(level="loud")
