"""Kubernetes quantities as the API server parses them: a value it refuses in a Deployment must
be refused when the AppDefinition is read, before any free instance is deleted for it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from warmpool.pool.quantity import parse_quantity, quantity_error


@pytest.mark.parametrize(("text", "value"), [
    ("0", Decimal(0)), ("2", Decimal(2)), ("500m", Decimal("0.5")), ("0.5", Decimal("0.5")),
    (".5", Decimal("0.5")), ("1.", Decimal(1)), ("+1", Decimal(1)), ("100n", Decimal("1e-7")),
    ("3u", Decimal("3e-6")), ("1k", Decimal(1000)), ("64Mi", Decimal(64 * 2**20)),
    ("1Gi", Decimal(2**30)), ("2Ei", Decimal(2 * 2**60)), ("1E", Decimal(10**18)),
    ("1e3", Decimal(1000)), ("1E-3", Decimal("0.001")), ("1e+3", Decimal(1000)),
    ("129M", Decimal(129 * 10**6)), ("0.1Gi", Decimal("0.1") * 2**30),
])
def test_valid_quantities(text: str, value: Decimal) -> None:
    assert quantity_error(text) is None
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", [
    "", " ", "lots", "1 Gi", "1gi", "1GB", "1Kb", "1ki", "Mi", "1.2.3", "1,5", "--1", "1e",
    "1e3Mi", "1Mi3", "nan", "inf", "Infinity", "1_000", "\u0661", "²", "1\n", " 1", "0x10", "1e1.5",
    ".", "+", "1mi", "e3",
])
def test_invalid_quantities(text: str) -> None:
    error = quantity_error(text)
    assert error is not None and "quantity" in error
    assert parse_quantity(text) is None
