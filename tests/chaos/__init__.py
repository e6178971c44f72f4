"""Chaos tests: seeded operations and faults against the real system (see run.py).

CI tier: `pytest -m chaos` (tests/chaos/test_chaos.py). Long tier, on demand:
`python -m tests.chaos --seeds 1,2,3 --ops 10000` (writes docs/reliability.md figures) or
`pytest -m slow tests/chaos --chaos-seeds 1,2,3 --chaos-ops 10000`.
"""
