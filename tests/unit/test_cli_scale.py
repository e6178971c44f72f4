"""`warmpool scale`: checks, the resourceVersion precondition and its retries (a fake API)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from warmpool import config
from warmpool.cli.main import _register, cli
from warmpool.cli.scale import check_flags, new_max
from warmpool.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE, BadValue
from warmpool.kube.api import Conflict

#: What else a valid AppDefinition needs (the scale command checks the result as the
#: controller does, `validate_appdefinition`).
VALID = {"name": "java", "image": "i", "port": 3000}


class FakeKube:
    """One AppDefinition; a merge patch with a stale resourceVersion is a 409, like the server;
    `edits` are changes "someone else" makes right after each of our reads. The scale
    command's checks against the real API server, --dry-run included, are in
    tests/integration/test_cli_pool.py."""

    def __init__(self, spec: dict[str, Any] | None, edits: list[dict[str, Any]] | None = None):
        self.obj = None if spec is None else {
            "metadata": {"name": "java", "namespace": "ns", "uid": "u-0123456789ab",
                         "resourceVersion": "1", "generation": 1},
            "spec": {**VALID, **spec}}
        self.edits = list(edits or [])
        self.patches: list[tuple[dict[str, Any], str | None]] = []

    def _bump(self, spec: dict[str, Any]) -> None:
        assert self.obj is not None
        self.obj["spec"].update(spec)
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        meta["generation"] += 1

    def get(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        if self.obj is None or name != "java":
            return None
        read = json.loads(json.dumps(self.obj))
        if self.edits:
            self._bump(self.edits.pop(0))
        return read

    def list(self, api_version: str, kind: str, ns: str) -> tuple[list[dict[str, Any]], str]:
        return ([] if self.obj is None else [json.loads(json.dumps(self.obj))]), "1"

    def merge_patch(self, api_version: str, kind: str, ns: str, name: str,
                    patch: dict[str, Any], *, resource_version: str | None = None,
                    dry_run: bool = False) -> Any:
        assert not dry_run, "--dry-run is tested against the real API server"
        assert self.obj is not None
        self.patches.append((patch, resource_version))
        if resource_version != self.obj["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")
        self._bump(patch["spec"])
        return json.loads(json.dumps(self.obj))


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    _register()

    def go(fake: FakeKube, *args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(config.KubeConfig, "connect", lambda self: (fake, "ns"))
        result = CliRunner().invoke(cli, ["scale", *args], env={"COLUMNS": "80"})
        return result.exit_code, result.stdout, result.stderr

    return go


def test_flags_and_the_current_max() -> None:
    check_flags(0, None)
    check_flags(3, 3)
    for min_n, max_n, fragment in ((-1, None, "--min must be 0"), (1, -2, "--max must be 0"),
                                   (4, 3, "--min 4 exceeds --max 3")):
        with pytest.raises(BadValue, match=fragment):
            check_flags(min_n, max_n)
    assert new_max("java", 2, None, 4) == 4
    assert new_max("java", 5, 6, 4) == 6
    with pytest.raises(BadValue, match="pass --max 5"):
        new_max("java", 5, None, 4)
    with pytest.raises(BadValue, match=r"no integer spec\.maxInstances"):
        new_max("java", 1, None, "ten")


def test_scale_patches_with_the_resource_version_it_read(run) -> None:
    fake = FakeKube({"minInstances": 1, "maxInstances": 4, "image": "i"})
    code, out, err = run(fake, "java", "--min", "3")
    assert code == 0, err
    assert out.strip() == "ns/java: minInstances 1 -> 3, maxInstances 4 (unchanged)"
    assert fake.patches == [({"spec": {"minInstances": 3}}, "1")]
    assert fake.obj["spec"] == {**VALID, "minInstances": 3, "maxInstances": 4}


def test_a_conflict_is_read_checked_and_written_again(run) -> None:
    # Someone raises maxInstances between our read and our write: we retry on the new state.
    fake = FakeKube({"minInstances": 1, "maxInstances": 4}, edits=[{"maxInstances": 9}])
    code, out, err = run(fake, "java", "--min", "2", "--json")
    assert code == 0, err
    assert [rv for _, rv in fake.patches] == ["1", "2"]
    doc = json.loads(out)
    assert doc["old"] == {"minInstances": 1, "maxInstances": 9}
    assert doc["new"] == {"minInstances": 2, "maxInstances": 9}
    assert doc["changed"] is True and doc["generation"] == 3


def test_a_conflict_that_makes_the_request_invalid_is_refused(run) -> None:
    # Someone lowers maxInstances below our --min meanwhile: the retry's check refuses it.
    fake = FakeKube({"minInstances": 1, "maxInstances": 4}, edits=[{"maxInstances": 2}])
    code, _, err = run(fake, "java", "--min", "3")
    assert code == EXIT_USAGE and "maxInstances 2" in err
    assert fake.obj["spec"]["minInstances"] == 1


def test_endless_conflicts_give_up_with_one_line(run) -> None:
    fake = FakeKube({"minInstances": 1, "maxInstances": 4}, edits=[{"image": str(i)}
                                                                    for i in range(10)])
    code, _, err = run(fake, "java", "--min", "2")
    assert code == EXIT_FAILED and "kept changing" in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_appdefinition_and_no_change(run) -> None:
    code, _, err = run(FakeKube(None), "java", "--min", "1")
    assert code == EXIT_NOT_FOUND and "'java' not found in namespace 'ns'" in err
    fake = FakeKube({"minInstances": 2, "maxInstances": 4})
    code, out, _ = run(fake, "java", "--min", "2", "--max", "4")
    assert code == 0 and fake.patches == []
    assert "minInstances 2 (unchanged), maxInstances 4 (unchanged)" in out


def test_bad_flags_fail_before_any_connection(run) -> None:
    class Untouchable(FakeKube):
        def get(self, *args: Any) -> None:
            raise AssertionError("read the API for a request that was wrong anyway")

    for args in (("--min", "-1"), ("--min", "3", "--max", "2"), ("--min", "x")):
        code, _, err = run(Untouchable(None), "java", *args)
        assert code == EXIT_USAGE and err.startswith("error: "), (args, err)


def test_a_result_the_controller_would_refuse_is_not_written(run) -> None:
    """The controller's own validation judges the AppDefinition as it would be (issue #27)."""
    fake = FakeKube({"minInstances": 1, "maxInstances": 4})
    code, _, err = run(fake, "java", "--min", "5001", "--max", "5001")
    assert code == EXIT_USAGE and fake.patches == []
    assert err.strip() == (
        "error: refused, nothing written: AppDefinition java would be invalid "
        "(spec.minInstances (5001) is above the ceiling of 5000 instances per AppDefinition "
        "(the controller's WARMPOOL_INSTANCES_CEILING)), and the controller leaves an "
        "invalid pool as it is")
    # The ceiling is the controller's setting: raised there, raised here.
    code, _, err = run(fake, "java", "--min", "5001", "--max", "5001",
                       "--instances-ceiling", "6000")
    assert code == 0, err
    assert fake.patches == [({"spec": {"minInstances": 5001, "maxInstances": 5001}}, "1")]
