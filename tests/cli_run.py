"""Running `warmpool` as a person does: a subprocess configured only by its environment.

Shared by the CLI test modules, so that every command is checked the same way: its exit code,
80 columns of human output, and failures as one `error:` line without a traceback.
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


def run(env: dict[str, str], *args: str, code: int = 0,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "warmpool.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    if "--json" not in args:
        too_wide = [line for line in proc.stdout.splitlines() if len(line) > WIDTH]
        assert not too_wide, f"{args}: lines wider than {WIDTH} columns:\n" + "\n".join(too_wide)
    return proc


def run_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(run(env, *args, "--json").stdout)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
