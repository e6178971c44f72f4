"""Benchmarks: `python -m bench <name> [options]` (`python -m bench` lists them)."""
