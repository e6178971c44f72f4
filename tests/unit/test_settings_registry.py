"""The settings registry against the code that reads the settings, and the checked-in
configuration reference against the registry (so CI fails when either drifts)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from warmpool import logs
from warmpool import settings_registry as reg
from warmpool.cli.settings import problems
from warmpool.controller.timeouts import TimeoutSettings
from warmpool.kube import pacing
from warmpool.pool import availability, proxy
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import MAX_INSTANCES_CEILING
from warmpool.queue.settings import QueueSettings

ROOT = Path(__file__).resolve().parents[2]
#: The shipped packages (pyproject.toml's packages.find), whose source reads the settings.
PACKAGES = ("warmpool", "scheduler", "workers", "metrics")
#: Files that describe settings rather than read them.
DESCRIBERS = {ROOT / "warmpool" / "settings_registry.py", ROOT / "warmpool" / "cli" / "settings.py"}
NAME = re.compile(r"WARMPOOL_[A-Z0-9_]*")


def _sources() -> dict[Path, str]:
    return {path: path.read_text() for package in PACKAGES
            for pattern in ("*.py", "*.sh") for path in (ROOT / package).rglob(pattern)
            if path not in DESCRIBERS}


def test_every_variable_the_packages_name_is_registered() -> None:
    unregistered = set()
    for path, text in _sources().items():
        for name in NAME.findall(text):
            if name.startswith("WARMPOOL_TEST_"):
                continue  # the test suite's own (tests/), not a setting
            if name.endswith("_"):  # a family: `WARMPOOL_QUEUE_<FIELD>`, `WARMPOOL_*`
                known = any(s.startswith(name) for s in reg.BY_NAME)
            else:
                known = name in reg.BY_NAME
            if not known:
                unregistered.add(f"{name} ({path.relative_to(ROOT)})")
    assert not unregistered, ("read but not in warmpool/settings_registry.py: "
                              f"{sorted(unregistered)}")


def test_every_registered_variable_is_read_somewhere() -> None:
    text = "\n".join(_sources().values())
    queue = {s.name for s in reg.SETTINGS if s.section == "Queue"}
    unread = [s.name for s in reg.SETTINGS
              if s.name not in queue and re.search(rf"\b{s.name}\b", text) is None]
    assert not unread, f"registered but named by no source: {unread}"


def test_queue_variables_are_exactly_the_fields_from_env_reads() -> None:
    """`QueueSettings.from_env` reads `WARMPOOL_QUEUE_<FIELD>`: each registered one changes
    its field, and every field but the URL is registered."""
    fields = {f.name: f for f in dataclasses.fields(QueueSettings)}
    queue = [s for s in reg.SETTINGS if s.section == "Queue"]
    assert {s.name for s in queue} == {
        "WARMPOOL_QUEUE_" + name.upper() for name in fields if name != "redis_url"}
    for s in queue:
        field = fields[s.name.removeprefix("WARMPOOL_QUEUE_").lower()]
        value = {int: "7", float: "7.5", str: "other"}[type(field.default)]
        assert str(getattr(QueueSettings.from_env({s.name: value}), field.name)) == value
        assert s.default == f"`{field.default}`"


# What the code says each default is, for the settings whose default the code holds in one
# value (the others are behaviour: "every namespace", "the in-cluster service account").
_pool, _timeouts, _probe = PoolSettings(), TimeoutSettings(), availability.ProbeSettings()
CODE_DEFAULTS = {
    "WARMPOOL_INSTANCES_HOST": _pool.instances_host,
    "WARMPOOL_ROUTES": _pool.routes,
    "WARMPOOL_USE_PATHS": str(_pool.use_paths).lower(),
    "WARMPOOL_INGRESS_PATH_SUFFIX": _pool.ingress_path_suffix,
    "WARMPOOL_INSTANCES_CEILING": str(MAX_INSTANCES_CEILING),
    "WARMPOOL_BURST": "on" if _pool.burst else "off",
    "WARMPOOL_OAUTH2_PROXY_IMAGE": proxy.DEFAULT_IMAGE,
    "WARMPOOL_URL_PROBE": "on" if _probe.enabled else "off",
    "WARMPOOL_URL_PROBE_SCHEDULE": availability.DEFAULT_SCHEDULE_TEXT,
    "WARMPOOL_URL_PROBE_TIMEOUT": str(_probe.timeout),
    "WARMPOOL_TIMEOUTS": "on" if _timeouts.enabled else "off",
    "WARMPOOL_TIMEOUT_INTERVAL": str(_timeouts.interval),
    "WARMPOOL_ACTIVITY_TRACKER": "on" if _timeouts.activity_tracker else "off",
    "WARMPOOL_MONITOR_TIMEOUT": str(_timeouts.monitor_timeout),
    "WARMPOOL_LOG_LEVEL": logs.DEFAULT_LEVEL,
    "WARMPOOL_LOG_FORMAT": logs.FORMATS[0],
    "WARMPOOL_BULK_PACE": "off" if pacing.PacingSettings().rate is None else "on",
}


@pytest.mark.parametrize("name", sorted(CODE_DEFAULTS))
def test_documented_default_is_the_codes(name: str) -> None:
    assert reg.BY_NAME[name].default.startswith(f"`{CODE_DEFAULTS[name]}`")


# A value each setting's grammar refuses.
BAD_VALUES = {
    "WARMPOOL_INSTANCES_HOST": "Not A Host",
    "WARMPOOL_ROUTES": "gateway",
    "WARMPOOL_USE_PATHS": "yes please",
    "WARMPOOL_INSTANCES_PATH": "/a/../b",
    "WARMPOOL_INGRESS_PATH_SUFFIX": "a b",
    "WARMPOOL_SESSIONS_PER_USER": "one",
    "WARMPOOL_INSTANCES_CEILING": "0",
    "WARMPOOL_BURST": "sometimes",
    "WARMPOOL_OAUTH2_PROXY_IMAGE": "oauth2-proxy",
    "WARMPOOL_TRUSTED_PROXY_IPS": "0.0.0.0/0",
    "WARMPOOL_PROXY_SECRET": "Not_A_Name",
    "WARMPOOL_URL_PROBE": "maybe",
    "WARMPOOL_URL_PROBE_SCHEDULE": "often",
    "WARMPOOL_URL_PROBE_TIMEOUT": "0",
    "WARMPOOL_TIMEOUTS": "maybe",
    "WARMPOOL_TIMEOUT_INTERVAL": "-1",
    "WARMPOOL_ACTIVITY_TRACKER": "maybe",
    "WARMPOOL_MONITOR_TIMEOUT": "inf",
    "WARMPOOL_QUEUE_LEASE_TTL": "ten",
    "WARMPOOL_QUEUE_BATCH": "1.5",
    "WARMPOOL_LOG_FORMAT": "xml",
    "WARMPOOL_LOG_LEVEL": "loud",
    "WARMPOOL_BULK_PACE": "fast",
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_value_is_refused_naming_its_variable(name: str) -> None:
    """Each of these is read by the parsers the roles run at start (so registered and read
    are one fact), and a bad value names the variable to fix."""
    assert name in reg.BY_NAME
    (message,) = problems({name: BAD_VALUES[name]}, {})
    assert name in message


def test_the_defaults_are_accepted() -> None:
    assert problems({}, {}) == []


def test_checked_in_reference_is_what_the_code_generates() -> None:
    doc = ROOT / reg.DOC_PATH
    assert doc.read_text() == reg.render_markdown(), (
        f"{reg.DOC_PATH} is stale: regenerate it with "
        f"`warmpool config --markdown > {reg.DOC_PATH}`")


def test_reference_lists_every_setting_once_in_a_table_row() -> None:
    rows = [line for line in reg.render_markdown().splitlines() if line.startswith("| `")]
    names = [re.match(r"\| `([A-Z0-9_]+)`", row).group(1) for row in rows]  # type: ignore[union-attr]
    assert sorted(names) == sorted(reg.BY_NAME)
    for row in rows:  # a `|` in a value (`(/|$)(.*)`, grammars) must not split the row
        assert len(re.findall(r"(?<!\\)\|", row)) == 6, row


def test_secret_settings_are_marked() -> None:
    assert [s.name for s in reg.SETTINGS if s.secret] == [
        "WARMPOOL_REDIS_URL", "WARMPOOL_SERVICE_AUTH_TOKEN"]
    (row,) = [line for line in reg.render_markdown().splitlines()
              if line.startswith("| `WARMPOOL_REDIS_URL`")]
    assert "**Secret:** shown redacted" in row
