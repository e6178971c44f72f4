"""The e-mail grammar of spec.user: what oauth2-proxy's allow-list can hold without admitting
anyone else, and a message that names the rule an address breaks (never the address)."""

from __future__ import annotations

import pytest

from tests.unit.pool_fixtures import session
from warmpool.pool.emails import MAX_LENGTH, email_error
from warmpool.pool.model import session_error


@pytest.mark.parametrize("address", [
    "jane@example.com",
    "First.Last+tag@Example.COM",
    "o'brien@example.ie",
    "a!b#c$d%e&f*g/h=i?j^k_l`m{n|o}p~q-r@sub.example-domain.org",
    "u" * 200 + "@example.com",
    "x@" + ".".join(["d" * 60] * 3) + ".com",
    "1@2.example",
])
def test_valid_addresses(address: str) -> None:
    assert email_error(address) is None, email_error(address)


@pytest.mark.parametrize(("address", "rule"), [
    ("", "is empty"),
    ("u" * 250 + "@example.com", f"longer than {MAX_LENGTH} characters"),
    ("jane@example.com\n", "control character"),
    ("ja\x00ne@example.com", "control character"),
    ("jane\x7f@example.com", "control character"),
    ("jane@example.com\r", "control character"),
    ("jane @example.com", "whitespace"),
    ("\tjane@example.com", "control character"),
    ("\u212aate@example.com", "non-ASCII character U+212A"),
    ("jane@exa\u0301mple.com", "non-ASCII character U+0301"),
    ("jane\u00a0@example.com", "non-ASCII character U+00A0"),
    ("jane@example.com,bob@example.com", "comma"),
    ('"jane"@example.com', "quote"),
    ('ja"ne@example.com', "quote"),
    ("#jane@example.com", "starts with '#'"),
    ("jane@@example.com", "exactly one '@'"),
    ("a@b@example.com", "exactly one '@'"),
    ("no-at-sign", "exactly one '@'"),
    ("@example.com", "nothing before '@'"),
    ("jane@", "nothing after '@'"),
    (".jane@example.com", "local part"),
    ("jane.@example.com", "local part"),
    ("ja..ne@example.com", "local part"),
    ("ja(ne)@example.com", "character '(' is not allowed before '@'"),
    ("ja\\ne@example.com", "character '\\' is not allowed before '@'"),
    ("jane;bob@example.com", "character ';' is not allowed before '@'"),
    ("jane@localhost", "at least two labels"),
    ("jane@[127.0.0.1]", "character '[' is not allowed after '@'"),
    ("jane@exam_ple.com", "character '_' is not allowed after '@'"),
    ("jane@-example.com", "label 1 of the domain"),
    ("jane@example-.com", "label 1 of the domain"),
    ("jane@example..com", "label 2 of the domain"),
    ("jane@example.com.", "label 3 of the domain"),
    ("jane@" + "d" * 64 + ".com", "label 1 of the domain"),
])
def test_invalid_addresses_name_the_rule(address: str, rule: str) -> None:
    error = email_error(address)
    assert error is not None and rule in error, error
    assert "\n" not in error
    if "@" in address and len(address) > 3:
        local = address.split("@")[0]
        assert len(local) < 3 or local not in error, "the message repeats the address"


def test_session_error_says_which_rule() -> None:
    error = session_error(session(user="\u212aate@example.com"))
    assert error is not None
    assert error.startswith("spec.user must be exactly one e-mail address")
    assert "U+212A" in error
