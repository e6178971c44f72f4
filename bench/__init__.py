"""Benchmarks: `python -m bench <name> [options]` (`python -m bench` lists them)."""

from pathlib import Path

#: The repository's root: where the report is written and the scheduler is started from, and
#: whose commit the report names.
REPO = Path(__file__).resolve().parent.parent
