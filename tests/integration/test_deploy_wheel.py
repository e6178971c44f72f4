"""The Dockerfile's Python steps replayed here, as far as they go without a Docker engine: the
builder's RUN in a context made of exactly its COPY sources, then the final stage's pip
commands in a fresh virtual environment standing in for the image's Python (3.11, with pip and
setuptools, like python:3.11-slim): install from the wheel directory with no index, remove pip,
setuptools and wheel, and the smoke command. What is not replayed: the base images, apt, the
user and the directories (root-only changes to this machine), and the build itself.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_deploy_image import copied_sources, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_STEPS = ("groupadd", "useradd", "mkdir", "chown")


def commands(run: str) -> list[list[str]]:
    """A RUN line as its `&&`-joined commands, RUN's own --mount flags dropped."""
    words = shlex.split(run)
    while words and words[0].startswith("--mount="):
        words.pop(0)
    out: list[list[str]] = [[]]
    for w in words:
        if w == "&&":
            out.append([])
        else:
            out[-1].append(w)
    return [c for c in out if c]


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{argv}:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.mark.slow  # CI builds the image itself (`make image`, then `make image-test`)
def test_the_dockerfiles_python_steps_give_a_working_install_without_pip(tmp_path: Path) -> None:
    _, stages = parse_dockerfile((ROOT / "Dockerfile").read_text())
    builder, final = stages[0], stages[-1]
    context = tmp_path / "src"
    context.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for source in copied_sources(builder):
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, context / source, ignore=ignore)
        else:
            shutil.copy2(ROOT / source, context / source)
    wheels = tmp_path / "wheels"
    venv = tmp_path / "image"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, dict(os.environ))
    env = {k: val for k, val in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def replay(stage_runs: list[str], cwd: Path) -> list[str]:
        skipped = []
        for line in stage_runs:
            for argv in commands(line):
                argv = [a.replace("/wheels", str(wheels)) for a in argv]
                argv = [m for a in argv for m in (sorted(glob.glob(a)) if "*" in a else [a])]
                if argv[0] in SYSTEM_STEPS:
                    skipped.append(argv[0])
                    continue
                if argv[0] == "ls":
                    assert all(Path(a).exists() for a in argv[1:]), argv
                    continue
                assert argv[0] in ("python", "warmpool"), argv
                run(argv, cwd, env)
        return skipped

    # Builder: `python -m pip wheel --wheel-dir /wheels .` (the venv's python stands in).
    assert replay(builder.all("RUN"), context) == []
    assert list(wheels.glob("warmpool-0.1.0-*.whl"))
    # Final: install with no index, uninstall pip/setuptools/wheel, `warmpool --help`.
    skipped = replay(final.all("RUN"), tmp_path)
    assert sorted(set(skipped)) == sorted(SYSTEM_STEPS)
    site = run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                "print(sysconfig.get_paths()['purelib'])"], tmp_path, env).stdout.strip()
    installed = {p.name.split("-")[0].lower() for p in Path(site).glob("*.dist-info")}
    assert "warmpool" in installed
    assert not {"pip", "setuptools", "wheel"} & installed
    # Each role and the modules the workers and scheduler import, with pip gone.
    for args in (["scheduler", "--help"], ["worker", "--help"]):
        out = run([str(venv / "bin" / "warmpool"), *args], tmp_path, env)
        assert "Usage: warmpool" in out.stdout
    out = run([str(venv / "bin" / "python"), "-c",
               "import scheduler.app, workers.handlers, workers.process, warmpool.kube.api, "
               "warmpool.queue.broker, warmpool.cluster.local, prometheus_client, sys; "
               "print(scheduler.app.__file__)"], tmp_path, env)
    assert out.stdout.startswith(site)
    assert (Path(site) / "warmpool" / "kube" / "crds" / "appdefinitions.yaml").exists()
