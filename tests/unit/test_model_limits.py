"""Limits on what an AppDefinition may ask for: a pool bigger than the ceiling is refused,
not enumerated (a resync lists every id up to minInstances, a claim reads them)."""

from __future__ import annotations

from typing import Any

import pytest

from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import (
    MAX_INSTANCES_CEILING,
    AppDefinition,
    Invalid,
    parse_appdefinition,
)


def obj(**spec: Any) -> dict[str, Any]:
    base = {"name": "java", "image": "img", "port": 3000, "minInstances": 1, "maxInstances": 3}
    base.update(spec)
    return {"metadata": {"name": "a", "uid": "u" * 20}, "spec": base}


def test_the_default_ceiling_is_a_sensible_size() -> None:
    assert MAX_INSTANCES_CEILING == 5000
    assert PoolSettings().max_instances_ceiling == MAX_INSTANCES_CEILING


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"minInstances": 1, "maxInstances": 1_000_000},
     "spec.maxInstances (1000000) is above the ceiling of 5000 instances"),
    ({"minInstances": 1_000_000, "maxInstances": 1_000_000},
     "spec.minInstances (1000000) is above the ceiling of 5000 instances"),
    ({"minInstances": 5001, "maxInstances": 6000}, "spec.minInstances (5001) is above"),
    ({"minInstances": 1, "maxInstances": 5001}, "spec.maxInstances (5001) is above"),
    ({"minInstances": 1, "maxInstances": 10**400},
     "spec.maxInstances (an integer of about 401 digits)"),
])
def test_a_pool_above_the_ceiling_is_invalid(spec: dict[str, Any], fragment: str) -> None:
    parsed = parse_appdefinition(obj(**spec))
    assert isinstance(parsed, Invalid) and fragment in parsed.message, parsed
    assert "WARMPOOL_INSTANCES_CEILING" in parsed.message and len(parsed.message) < 300


def test_an_integer_too_long_to_print_is_still_refused_in_words() -> None:
    parsed = parse_appdefinition(obj(maxInstances=10**5000))
    assert isinstance(parsed, Invalid) and "about 5001 digits" in parsed.message


def test_the_ceiling_itself_is_allowed() -> None:
    parsed = parse_appdefinition(obj(minInstances=5000, maxInstances=5000, name="j"))
    assert isinstance(parsed, AppDefinition)


def test_the_ceiling_is_configurable() -> None:
    assert isinstance(parse_appdefinition(obj(maxInstances=20), max_instances_ceiling=10),
                      Invalid)
    assert isinstance(parse_appdefinition(obj(maxInstances=8000), max_instances_ceiling=10_000),
                      AppDefinition)


def test_pool_settings_from_the_environment() -> None:
    env = {"WARMPOOL_INSTANCES_HOST": "ide.example.com", "WARMPOOL_INSTANCES_CEILING": "200"}
    settings = PoolSettings.from_env(env)
    assert settings.instances_host == "ide.example.com"
    assert settings.max_instances_ceiling == 200
    assert PoolSettings.from_env({}) == PoolSettings()


@pytest.mark.parametrize("raw", ["0", "-5", "many", "1.5", "²"])
def test_a_bad_ceiling_setting_says_which_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="WARMPOOL_INSTANCES_CEILING must be a positive integer"):
        PoolSettings.from_env({"WARMPOOL_INSTANCES_CEILING": raw})
