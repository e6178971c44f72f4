"""Output rules: no e-mail address, 80 columns at most, markup-proof cells, readable ages;
and the queue views' reading of Redis (fakeredis, real Lua)."""

from __future__ import annotations

import pytest

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


def test_tables_fit_80_columns_fold_long_cells_and_keep_brackets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    t = output.table("key", "message")
    t.add_row("instance/" + "n" * 60 + "/java/1", "must match ^[a-z0-9A-Z-_]+$ " * 5)
    output.console().print(t)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and max(len(line) for line in lines) <= 80
    assert all(line == line.rstrip() for line in lines)
    assert "^[a-z0-9A-Z-_]+$" in out


def test_a_narrower_terminal_is_respected(monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    output.console().print("word " * 30)
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 50


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
