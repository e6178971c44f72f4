"""`wait_for`, the one way tests wait: it lives in `warmpool.testing.waiting` (importable from
bench/ and the test world too); tests import it from here."""

from warmpool.testing.waiting import WaitTimeout, wait_for

__all__ = ["WaitTimeout", "wait_for"]
