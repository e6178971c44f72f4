"""Output rules: no e-mail address, cells kept whole at any width, -o json|yaml|wide, readable
ages; and the queue views' reading of Redis (fakeredis, real Lua)."""

from __future__ import annotations

import json

import click
import pytest
import yaml
from click.testing import CliRunner

from warmpool.cli import output
from warmpool.cli.queue import key_view, locks_view, overview_view, workers_view
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings


@pytest.mark.parametrize("text", [
    "spec.user a@b.com,c@d.org must be one address",
    "user <jane.doe+x@example.co.uk> refused",
    "emails: 'ann@example.com'\nbob@example.com",
])
def test_redact_removes_every_address(text: str) -> None:
    out = output.redact(text)
    assert "@" not in out and "<e-mail>" in out


def test_redact_keeps_what_is_not_an_address() -> None:
    text = "no whitespace, newline, comma or second '@'; host:1234:99:ab.1"
    assert output.redact(text) == text
    assert output.redact(None) == ""


def test_ages() -> None:
    assert [output.age(s) for s in (None, 0.25, 9.94, 42, 184, 7500, 200000)] == [
        "-", "0.2s", "9.9s", "42s", "3m04s", "2h05m", "2d07h"]


KEY = "instance/" + "n" * 60 + "/java-application-definition/12"


def _table() -> output.Table:
    t = output.Table("key", "message", output.Column("holder", wide=True))
    t.add_row(KEY, "must match ^[a-z0-9A-Z-_]+$\nand  more", "host:42:1:abc.1")
    t.add_row("pool/ns/a", "", None)
    return t


@click.command()
@output.output_options
def shows(out: output.Output) -> None:
    if not out.document({"key": KEY, "error": "x" * 300}):
        out.table(_table())


@pytest.mark.parametrize("columns", ["20", "80", "300"])
def test_a_cell_is_never_wrapped_folded_or_cut_whatever_the_width(
    monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    """`warmpool locks` printed keys folded at 80 columns: the printed key could not be
    pasted into `warmpool queue show`. Whatever the terminal's width, and off a terminal,
    each row is one line and each cell is whole: the first field of a row is the key."""
    monkeypatch.setenv("COLUMNS", columns)
    result = CliRunner().invoke(shows, [])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["KEY", "MESSAGE"]
    assert [line.split()[0] for line in lines[1:]] == [KEY, "pool/ns/a"]
    # one row per line, newlines and runs of blanks inside a cell made one blank
    assert "must match ^[a-z0-9A-Z-_]+$ and more" in lines[1]
    assert lines[2].split() == ["pool/ns/a", "-"]  # an empty cell keeps its column
    # columns line up (the header's MESSAGE above each message), no trailing blanks
    at = lines[0].index("MESSAGE")
    assert lines[1][at:].startswith("must") and lines[2][at:] == "-"
    assert all(line == line.rstrip() for line in lines)


def test_wide_adds_its_columns() -> None:
    assert "HOLDER" not in _table().lines()[0]
    wide = _table().lines(wide=True)
    assert wide[0].split() == ["KEY", "MESSAGE", "HOLDER"]
    assert wide[1].split()[-1] == "host:42:1:abc.1" and wide[2].split()[-1] == "-"
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        _table().add_row("a", "b")


def test_json_and_yaml_print_the_same_document_unfolded() -> None:
    as_json = json.loads(CliRunner().invoke(shows, ["-o", "json"]).stdout)
    as_yaml = CliRunner().invoke(shows, ["-o", "yaml"]).stdout
    assert yaml.safe_load(as_yaml) == as_json == {"key": KEY, "error": "x" * 300}
    assert f"key: {KEY}\n" in as_yaml  # one line each, however long
    assert json.loads(CliRunner().invoke(shows, ["--json"]).stdout) == as_json  # the alias


def test_output_flags_are_checked() -> None:
    for args, fragment in ((["-o", "xml"], "'xml' is not one of"),
                           (["--json", "-o", "yaml"], "--json asks for -o json")):
        result = CliRunner().invoke(shows, args)
        assert result.exit_code == 2 and fragment in result.stderr, result.stderr
    assert CliRunner().invoke(shows, ["--json", "-o", "json"]).exit_code == 0
    assert "Same as -o json" in CliRunner().invoke(shows, ["--help"]).stdout


def test_views_read_only_their_own_prefix_even_with_glob_characters(client) -> None:
    mine = QueueSettings(prefix="t[1]*:warmpool:", namespace="t[1]*:dramatiq")
    other = QueueSettings(prefix="t1x:warmpool:", namespace="t1x:dramatiq")
    for s, key in ((mine, "pool/ns/a"), (other, "pool/ns/b")):
        lo = Layout.of(s)
        client.set(lo.lease(key), "7|host:42:1:abc.1", px=5000)
        client.set(lo.maintenance_lock("audit"), "worker-1", px=3000)
    doc = locks_view(client, mine)
    assert [(lk["key"], lk["kind"]) for lk in doc["locks"]] == [
        ("pool/ns/a", "lease"), ("audit", "maintenance")]
    lease = doc["locks"][0]
    assert (lease["holder"], lease["fence"]) == ("host:42:1:abc.1", 7)
    assert 0 < lease["ttl_seconds"] <= 5
    assert workers_view(client, mine)["lease_holders"] == [
        {"process": "host:42", "leases": 1, "keys": ["pool/ns/a"]}]


def test_pending_keys_in_the_order_they_run_and_reruns(client) -> None:
    s = QueueSettings(prefix="u:warmpool:", namespace="u:dramatiq")
    q = KeyedQueue(client, s)
    for k in ("session/ns/z", "pool/ns/a", "instance/ns/a/2"):
        q.add(k)
    doc = overview_view(client, s, limit=10)
    assert [p["key"] for p in doc["pending"]] == ["session/ns/z", "pool/ns/a",
                                                  "instance/ns/a/2"]
    assert doc["queues"][0]["ready"] == 3 and doc["rerun"] == []
    assert [p["key"] for p in overview_view(client, s, limit=2)["pending"]] == [
        "session/ns/z", "pool/ns/a"]

    # pool/ns/a is taken by a worker (lease + inflight) and added again: a re-run.
    lo = Layout.of(s)
    client.set(lo.lease("pool/ns/a"), "3|host:1:1:x.1", px=10000)
    client.zadd(lo.inflight, {"pool/ns/a": 0})
    doc = overview_view(client, s, limit=10)
    assert doc["rerun"] == [{"key": "pool/ns/a", "holder": "host:1:1:x.1"}]
    assert [p["key"] for p in doc["pending"]] == ["session/ns/z", "instance/ns/a/2"]
    assert (doc["queues"][0]["ready"], doc["queues"][0]["rerun"]) == (2, 1)
    shown = key_view(client, s, "pool/ns/a")
    assert (shown["state"], shown["rerun"], shown["fence"]) == ("running", True, 3)
