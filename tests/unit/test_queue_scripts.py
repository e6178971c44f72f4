"""The queue's Lua files: every one loaded and registered, none missing, all shipped.

The scripts live in `warmpool/queue/lua/` (package data) and are read by
`warmpool.queue.scripts` at import; `Scripts` registers each (after `lib.lua`) and calls it
by file name. A file nobody calls, or a call with no file, is a mistake these tests catch
before Redis would (a missing script fails only when its call is first made).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from importlib import resources
from pathlib import Path

import fakeredis
import pytest

from warmpool.queue import scripts
from warmpool.queue.layout import Layout
from warmpool.queue.scripts import BODIES, LIB_NAME, LUA_FOLDER, Scripts

ROOT = Path(__file__).resolve().parents[2]


def lua_files() -> set[str]:
    folder = resources.files("warmpool.queue").joinpath(LUA_FOLDER)
    return {e.name for e in folder.iterdir() if e.is_file() and e.name.endswith(".lua")}


def called_names() -> set[str]:
    """The script names `Scripts`' methods call (`self._call("<name>", ...)`)."""
    source = Path(scripts.__file__).read_text(encoding="utf-8")
    return set(re.findall(r'self\._call\(\s*"([a-z_]+)"', source))


def test_every_lua_file_is_loaded_and_registered() -> None:
    s = Scripts(fakeredis.FakeRedis(), Layout("warmpool:", "dramatiq", "warmpool"))
    assert lua_files() == {f"{LIB_NAME}.lua"} | {f"{name}.lua" for name in BODIES}
    assert set(s._scripts) == set(BODIES)
    # lib.lua is the head of every registered script, not a script of its own
    lib = scripts.library(Layout("warmpool:", "dramatiq", "warmpool"))
    assert all(reg.script.startswith(lib) for reg in s._scripts.values())


def test_every_script_is_called_and_every_call_has_its_script() -> None:
    assert called_names() == set(BODIES)


def test_every_script_compiles_as_redis_lua() -> None:
    """Redis runs Lua 5.1: each registered text (lib + script) must compile there."""
    lua51 = pytest.importorskip("lupa.lua51")
    compiles = lua51.LuaRuntime().eval(
        "function(text, name) local f, err = loadstring(text, name); return err or '' end")
    lib = scripts.library(Layout("x{1}:", "ns", 'q"\\'))  # quotes and escapes too
    for name, body in BODIES.items():
        err = compiles(lib + body, f"{name}.lua")
        assert err == "", err
        assert compiles(lib + body + "\nlocal x = 1 +", name) != ""  # it does check


def test_every_file_keeps_its_header_comment() -> None:
    """What the script does and its KEYS/ARGV stay with the code, in the file."""
    for name, body in {LIB_NAME: scripts.LIB, **BODIES}.items():
        assert body.startswith("-- "), f"{name}.lua starts without its header comment"


def test_no_placeholder_is_left_unfilled() -> None:
    lib = scripts.library(Layout("warmpool:", "dramatiq", "warmpool"))
    assert "@" not in re.sub(r"--[^\n]*", "", lib)


def test_the_package_data_ships_every_lua_file() -> None:
    """pyproject's package-data for warmpool.queue matches each file, so a wheel (and so
    `pip install`) carries them all; setuptools leaves out what it does not match."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["warmpool.queue"]
    for name in lua_files():
        path = f"{LUA_FOLDER}/{name}"
        assert any(fnmatch.fnmatch(path, g) for g in globs), f"{path} is not package data"


def test_no_script_spells_a_key_name() -> None:
    """Key names come from `Layout` only (the generated head, `KEY_NAMES`): no Lua derives
    one, and none reads KEYS (no call passes any)."""
    joined = re.compile(r'\.\.\s*"([^"]*)"|"([^"]*)"\s*\.\.')  # a literal in a `..`
    spelled = re.compile(r'"[^"]*\.(msgs|XQ)\b[^"]*"|"(lease|trig|own|maintenance):')
    for name, body in {LIB_NAME: scripts.LIB, **BODIES}.items():
        code = re.sub(r"--[^\n]*", "", body)
        literals = {a or b for a, b in joined.findall(code)}
        assert literals <= {"|"}, f"{name}.lua builds a name from {literals - {'|'}}"
        assert not spelled.search(code), f"{name}.lua: {spelled.search(code)}"
        assert "KEYS[" not in code, f"{name}.lua reads KEYS itself: use the head's names"


def test_the_generated_head_declares_each_layout_name_as_a_constant() -> None:
    lo = Layout("x{1}:", "ns", "q")
    keys = scripts.script_keys(lo)
    assert len(keys) == len(scripts.KEY_NAMES) == len(set(keys))
    head = scripts.head(lo)
    for i, (local, attr) in enumerate(scripts.KEY_NAMES, 1):
        assert f'local {local} = "{getattr(lo, attr)}"\n' in head
        assert keys[i - 1] == getattr(lo, attr)
    assert "KEYS" not in head.partition("\n")[2]
    assert keys[scripts.KEY_NAMES.index(("LEASE", "lease_prefix"))] + "k" == lo.lease("k")
    assert keys[scripts.KEY_NAMES.index(("TRIG", "triggers_prefix"))] + "k" == lo.triggers("k")
    assert keys[scripts.KEY_NAMES.index(("OWN", "own_prefix"))] + "k" == lo.own("k")
    # each layout its own scripts: a name is never shared by accident
    assert scripts.head(Layout("y:", "ns", "q")) != head


def test_a_name_lua_would_misread_is_refused() -> None:
    with pytest.raises(ValueError, match="one-line"):
        scripts.head(Layout("x\n:", "ns", "q"))


def test_the_scripts_write_where_a_non_default_layout_says() -> None:
    """Run a key through add, start, a failing done and a redrive under an unusual layout;
    every key the scripts touched is one of that layout's names."""
    client = fakeredis.FakeRedis()
    lo = Layout("other:", "ns", "q")
    s = Scripts(client, lo)
    assert s.add([("pool/a/b", "r1", b"body1", {"Pool/b": "7"})]) == ["enqueued"]
    assert s.add([("session/a/s", "r2", b"body2")]) == ["enqueued"]
    assert client.lrange(lo.messages_list, 0, -1) == [b"r1"]
    assert client.lrange(lo.claims_messages_list, 0, -1) == [b"r2"]
    assert client.hget(lo.messages, "r1") == b"body1"
    assert client.hget(lo.claims_messages, "r2") == b"body2"
    assert client.hgetall(lo.triggers("pool/a/b")) == {b"Pool/b": b"7"}
    acks = lo.acks("w1")
    assert client.lpop(lo.messages_list) == b"r1"  # delivered, as dramatiq fetches
    client.sadd(acks, "r1")
    started = s.start("pool/a/b", "tok", 10_000, (acks, "r1"))
    assert isinstance(started, scripts.Started) and started.triggers == {"Pool/b": "7"}
    assert client.get(lo.lease("pool/a/b")) == started.value.encode()
    assert client.zscore(lo.inflight, "pool/a/b") is not None
    done = s.done("pool/a/b", started.value, "fail", ack=(acks, "r1"), max_failures=1,
                  dead=("d1", b"dead"), writes={"pool/a/b": {"Pool/b": "8"}})
    assert done.outcome == "dead"
    assert client.hget(lo.messages, "r1") is None  # acked
    assert client.zscore(lo.xq, "d1") is not None and client.hget(lo.xq_messages, "d1") == b"dead"
    assert client.hget(lo.dead, "pool/a/b") == b"d1"
    assert client.hgetall(lo.own("pool/a/b")) == {b"Pool/b": b"8"}
    assert s.redrive("d1", "pool/a/b", "r3", b"body3") == "enqueued"
    assert client.lrange(lo.messages_list, 0, -1) == [b"r3"]
    names = {lo.dirty, lo.inflight, lo.failures, lo.delayed, lo.errors, lo.added_at,
             lo.pending, lo.dead, lo.fence, lo.messages_list, lo.messages,
             lo.claims_messages_list, lo.claims_messages, lo.xq, lo.xq_messages, acks,
             *(f(k) for f in (lo.lease, lo.triggers, lo.own)
               for k in ("pool/a/b", "session/a/s"))}
    touched = {k.decode() for k in client.keys("*")}
    assert touched and touched <= names, touched - names


def test_the_outcomes_the_scripts_spell_are_the_enums() -> None:
    """`done.lua`'s outcomes and `start.lua`'s skip reasons are exactly `DoneOutcome` and `Skip`:
    the enums are the Python side of those words (a StrEnum, so equal to them)."""
    done = BODIES["done"]
    spelt = set(re.findall(r'outcome(?:, delay, failures)? = "(\w+)"', done))
    spelt |= set(re.findall(r'return \{"(\w+)"', done))
    assert spelt == {o.value for o in scripts.DoneOutcome}
    start = BODIES["start"]
    skips = set(re.findall(r'return "(\w+)"', start)) | set(re.findall(r'return \{"(busy)"', start))
    assert skips == {s.value for s in scripts.Skip}
    client = fakeredis.FakeRedis()
    s = Scripts(client, Layout("e:", "ens", "q"))
    assert s.start("pool/a/b", "tok", 10_000) is scripts.Skip.STALE
    s.add([("pool/a/b", "r1", b"body1")])
    started = s.start("pool/a/b", "tok", 10_000)
    assert isinstance(started, scripts.Started)
    assert s.done("pool/a/b", "not-the-value", "ok").outcome is scripts.DoneOutcome.LOST
    assert s.done("pool/a/b", started.value, "ok").outcome is scripts.DoneOutcome.SUCCESS
