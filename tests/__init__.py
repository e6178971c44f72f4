"""The test suite: a package, so its modules import each other as `tests.<module>` (pytest puts
the repository root on sys.path for it; no test edits sys.path)."""
