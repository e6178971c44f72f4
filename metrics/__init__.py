"""Prometheus series for warmpool: see metrics/README.md (what is exported where, and how to
aggregate it)."""
