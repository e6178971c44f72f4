"""Running `warmpool` as a person does: a subprocess configured only by its environment.

Shared by the CLI test modules, so that every command is checked the same way: its exit code,
and failures as one `error:` line without a traceback. Human output is never cut to the
terminal's width (a printed key must paste whole into the next command): COLUMNS is set, 80
unless a test asks for another width, so that a test can show the width changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any warmpool or cluster setting, plus `extra`: a
    command must find its servers through what the test gives it, nothing inherited."""
    env = {k: val for k, val in os.environ.items()
           if not k.startswith(("WARMPOOL_", "KUBERNETES_")) and k != "KUBECONFIG"}
    env["COLUMNS"] = str(WIDTH)
    env.update(extra)
    return env


def run(env: dict[str, str], *args: str, code: int = 0, timeout: float = 90,
        columns: int | None = None) -> subprocess.CompletedProcess[str]:
    if columns is not None:
        env = {**env, "COLUMNS": str(columns)}
    proc = subprocess.run([sys.executable, "-m", "warmpool.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def run_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(run(env, *args, "-o", "json").stdout)


def first_column(stdout: str, prefix: str) -> list[str]:
    """The first cell of every table row that starts with `prefix` (a key's kind: "pool/"),
    read as a person's double-click or `awk '{print $1}'` reads it."""
    return [line.split()[0] for line in stdout.splitlines() if line.startswith(prefix)]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
