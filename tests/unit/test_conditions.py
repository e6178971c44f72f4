"""Status conditions as apimachinery's SetStatusCondition sets them (warmpool.pool.conditions)."""

from __future__ import annotations

import pytest

from warmpool.pool.conditions import Condition, find, set_conditions

T0, T1 = "2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z"


def test_a_new_condition_gets_now_and_the_generation() -> None:
    out = set_conditions(None, [Condition("Valid", "True", "Valid", "ok")], 4, T0)
    assert out == [{"type": "Valid", "status": "True", "reason": "Valid", "message": "ok",
                    "lastTransitionTime": T0, "observedGeneration": 4}]


def test_the_transition_time_moves_only_when_the_status_does() -> None:
    first = set_conditions([], [Condition("Active", "False", "NoWindowOpen", "a")], 1, T0)
    # Same status, new reason, message and generation: the time stays.
    same = set_conditions(first, [Condition("Active", "False", "NotValid", "b")], 2, T1)
    assert same[0]["lastTransitionTime"] == T0
    assert (same[0]["reason"], same[0]["message"], same[0]["observedGeneration"]) == (
        "NotValid", "b", 2)
    turned = set_conditions(same, [Condition("Active", "True", "WindowOpen")], 2, T1)
    assert turned[0]["lastTransitionTime"] == T1


def test_other_types_are_kept_and_garbage_is_dropped() -> None:
    existing = [{"type": "Theirs", "status": "True", "reason": "X", "lastTransitionTime": T0},
                "not a condition", {"no": "type"},
                {"type": "Valid", "status": "True", "reason": "Valid", "lastTransitionTime": 5},
                {"type": "Valid", "status": "False", "reason": "Dup"}]
    out = set_conditions(existing, [Condition("Valid", "True", "Valid")], None, T1)
    assert [c["type"] for c in out] == ["Theirs", "Valid"]
    assert out[0] == existing[0]
    # An unreadable time is replaced; no generation known: none claimed.
    assert out[1]["lastTransitionTime"] == T1 and "observedGeneration" not in out[1]
    assert find(out, "Valid") is out[1] and find(out, "Nope") is None
    assert set_conditions("a string", [], 1, T0) == []


def test_a_reason_must_be_camel_case() -> None:
    with pytest.raises(ValueError):
        Condition("Valid", "False", "not camel case")
