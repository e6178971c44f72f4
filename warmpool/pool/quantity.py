"""Kubernetes resource quantities (``resource.Quantity``), as the API server parses them.

An AppDefinition's requestsCpu, requestsMemory, limitsCpu and limitsMemory go verbatim into
every instance's Deployment. One the API server refuses used to be found only when the
Deployments were re-created, after the free ones had been deleted for the spec change: the
pool then stayed empty, failing forever. Checking the grammar when the AppDefinition is read
makes it Invalid instead, before anything is deleted.

The grammar (apimachinery's quantity.go, with the decimal suffixes its suffixer knows):

    quantity  = [ "+" / "-" ] number [ suffix ]
    number    = digits [ "." [ digits ] ] / "." digits
    suffix    = "Ki" / "Mi" / "Gi" / "Ti" / "Pi" / "Ei"          (powers of 1024)
              / "n" / "u" / "m" / "k" / "M" / "G" / "T" / "P" / "E"  (powers of 1000)
              / ( "e" / "E" ) [ "+" / "-" ] digits              (powers of 10)

ASCII digits only. Stricter than the server where the server's reading is surely not what
was meant, which is the safe side: exponents are limited to |e| <= 60, and a number is
required (apimachinery reads ".", "+" and a bare "Mi" as 0).
"""

from __future__ import annotations

import re
from decimal import Decimal

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?",
    re.ASCII,
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
EXPONENT_LIMIT = 60


def parse_quantity(text: str) -> Decimal | None:
    """The value of `text` (in base units: cores, bytes), or None if it is no quantity."""
    m = _QUANTITY.fullmatch(text)
    if m is None:
        return None
    number = Decimal(m["number"])
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        factor: int = 1024 ** _BINARY[suffix]  # int ** int is typed Any (negative exponents)
        return number * factor
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > EXPONENT_LIMIT:
            return None
        return number.scaleb(exponent)
    return number


def quantity_error(text: str) -> str | None:
    """Why `text` is no quantity the API server accepts (a phrase), or None."""
    if parse_quantity(text) is None:
        return ("must be a Kubernetes quantity: a decimal number with an optional suffix "
                "(m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent), e.g. 500m or 1Gi")
    return None
