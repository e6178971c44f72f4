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
    assert all(reg.script.startswith(scripts._LIB) for reg in s._scripts.values())


def test_every_script_is_called_and_every_call_has_its_script() -> None:
    assert called_names() == set(BODIES)


def test_every_script_compiles_as_redis_lua() -> None:
    """Redis runs Lua 5.1: each registered text (lib + script) must compile there."""
    lua51 = pytest.importorskip("lupa.lua51")
    compiles = lua51.LuaRuntime().eval(
        "function(text, name) local f, err = loadstring(text, name); return err or '' end")
    for name, body in BODIES.items():
        err = compiles(scripts._LIB + body, f"{name}.lua")
        assert err == "", err
        assert compiles(scripts._LIB + body + "\nlocal x = 1 +", name) != ""  # it does check


def test_every_file_keeps_its_header_comment() -> None:
    """What the script does and its KEYS/ARGV stay with the code, in the file."""
    for name, body in {LIB_NAME: scripts.LIB, **BODIES}.items():
        assert body.startswith("-- "), f"{name}.lua starts without its header comment"


def test_no_placeholder_is_left_unfilled() -> None:
    assert "@" not in re.sub(r"--[^\n]*", "", scripts._LIB)


def test_the_package_data_ships_every_lua_file() -> None:
    """pyproject's package-data for warmpool.queue matches each file, so a wheel (and so
    `pip install`) carries them all; setuptools leaves out what it does not match."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["warmpool.queue"]
    for name in lua_files():
        path = f"{LUA_FOLDER}/{name}"
        assert any(fnmatch.fnmatch(path, g) for g in globs), f"{path} is not package data"
