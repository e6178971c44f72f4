"""The fence annotation's bounded grammar (issue #27, point 1): a value on a pool object that
warmpool cannot have written is foreign, ignored for the fence decision and reported on its
object (naming the field), and never lifts the counter every key shares.
"""

from __future__ import annotations

from typing import Any

import pytest

from warmpool.kube.executor import FenceRegression, check_fence, observed_fence
from warmpool.pool import fence
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.fence import (
    FENCE_CEILING,
    FENCE_FIELD,
    FENCE_MAX,
    LARGE_LIFT,
    parse_fence,
    read_fences,
)
from warmpool.pool.instances import InstanceView
from warmpool.pool.parts import PARTS, Part
from warmpool.queue import scripts


def view_with(*fences: object) -> InstanceView:
    """An instance whose objects carry these fence annotations (one object per value)."""
    objects: dict[Part, dict[str, Any] | None] = dict.fromkeys(PARTS)
    for part, value in zip(PARTS, fences, strict=False):
        objects[part] = {"metadata": {"name": f"obj-{part.name.lower()}",
                                      "annotations": {v.ANNOTATION_FENCE: value}}}
    return InstanceView(3, objects)


class Guard:
    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.lifted: list[int] = []

    def ensure_held(self) -> None:
        return None

    def lift_fence(self, seen: int) -> None:
        self.lifted.append(seen)


@pytest.mark.parametrize("raw, value", [
    ("0", 0), ("7", 7), ("99999999999999", 99999999999999),
    (str(FENCE_CEILING), FENCE_CEILING), (str(FENCE_MAX), FENCE_MAX),
])
def test_the_grammar_takes_canonical_ascii_decimals_up_to_int64(raw: str, value: int) -> None:
    assert parse_fence(raw) == value


@pytest.mark.parametrize("raw", [
    "", "²", "١٢", "\uff11\uff12", "-5", "+5", " 5", "5 ", "5\n", "05", "1e14", "1.0", "0x10",
    str(FENCE_MAX + 1), "9" * 20, "9" * 5000, None, 12, ["1"],
])
def test_everything_else_is_not_a_fence(raw: object) -> None:
    assert parse_fence(raw) is None


def test_the_pool_and_the_queue_agree_on_the_ceiling() -> None:
    """The queue may not import the pool: the two spellings of one bound are checked here."""
    assert fence.FENCE_CEILING == scripts.FENCE_CEILING
    assert FENCE_CEILING < scripts.FENCE_SAFE < FENCE_MAX


def test_foreign_values_are_ignored_and_each_named_on_its_object() -> None:
    reading = read_fences(view_with("²", "9" * 5000, "12", "-3"), ours=20)
    assert reading.seen == 12
    assert [(f.part, f.raw[:3]) for f in reading.foreign] == [
        (Part.EMAIL_CONFIGMAP, "²"), (Part.PROXY_CONFIGMAP, "999"), (Part.INTERNAL_SERVICE, "-3")]
    reports = fence.fence_reports(3, reading, 20)
    assert [r.reason for r in reports] == ["ForeignFence"] * 3
    first = reports[1]
    assert first.warning and first.regarding == {
        "apiVersion": "v1", "kind": "ConfigMap", "name": "obj-proxy_configmap"}
    assert FENCE_FIELD in first.message and "(5000 chars)" in first.message
    assert len(first.message) < 400  # a 5,000-digit value is quoted cut


def test_a_fence_above_the_ceiling_counts_only_when_it_can_be_ours() -> None:
    above = FENCE_CEILING + 10
    # Our counter passed the ceiling by INCRs after a lift to it: our own writes stand.
    assert observed_fence(view_with(str(above)), ours=above + 5) == above
    # Above ours too: no lift could ever pass it, so it is foreign, not a refusal forever.
    reading = read_fences(view_with(str(above)), ours=5)
    assert reading.seen == 0 and reading.foreign[0].why.startswith("above")


def test_check_fence_reports_a_foreign_value_and_goes_on_without_lifting() -> None:
    guard = Guard(fence=4)
    got: list[list[Report]] = []
    check_fence(view_with("²", "99999999999999999999999", "3"), guard, got.append)
    assert guard.lifted == []
    assert [r.reason for r in got[0]] == ["ForeignFence", "ForeignFence"]


def test_a_valid_fence_far_above_ours_lifts_and_is_reported_on_its_carrier() -> None:
    guard = Guard(fence=4)
    got: list[list[Report]] = []
    far = 4 + LARGE_LIFT + 1
    with pytest.raises(FenceRegression):
        check_fence(view_with("3", str(far)), guard, got.append)
    assert guard.lifted == [far]
    (lifted,) = got[0]
    assert lifted.reason == "FenceLifted" and lifted.regarding["name"] == "obj-proxy_configmap"
    assert str(far) in lifted.message


def test_an_ordinary_lift_is_not_reported() -> None:
    guard = Guard(fence=4)
    got: list[list[Report]] = []
    with pytest.raises(FenceRegression):
        check_fence(view_with("900"), guard, got.append)
    assert guard.lifted == [900] and got == []
