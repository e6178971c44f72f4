"""Which cases of an end-to-end catalogue run in CI, and which only in the slow tier.

A catalogue of bad values (foreign fences, bad references, garbage timestamps) is checked
twice: every value by the unit tests of its grammar, in milliseconds, and end to end against
the real control plane, where each case costs seconds of waiting for the controller. CI runs
the end-to-end cases named here, chosen so that each path of the code under test is taken
(a value refused by each rule of the grammar, each kind of outcome); the slow tier
(`pytest -m slow`) runs them all. A cold CI run must stay under 30 minutes on two cores.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import pytest


def ci_sample(cases: Sequence[Any], keep: Collection[str],
              id_of: Callable[[Any], str]) -> list[Any]:
    """`cases` as pytest params with their ids; those whose id is not in `keep` are marked
    slow. An id in `keep` that no case has is an error (a renamed case must not drop out)."""
    ids = [id_of(c) for c in cases]
    unknown = set(keep) - set(ids)
    if unknown:
        raise ValueError(f"ci_sample: no case has the id(s) {sorted(unknown)}")
    return [pytest.param(*(c if isinstance(c, tuple) else (c,)), id=i,
                         marks=() if i in keep else pytest.mark.slow)
            for c, i in zip(cases, ids, strict=True)]
