"""The grammar of an e-mail address that may go into an instance's allow-list (spec.user).

oauth2-proxy reads the allow-list file as CSV (comma-separated, '#' starts a comment line,
'"' quotes a field, leading spaces trimmed) and lower-cases every entry and every login with
Go's Unicode-aware ToLower. So an entry is safe only if it is read back as exactly one
address that lower-cases to itself alone: a comma or a newline adds a second person, a quote
can join lines or make the whole file unreadable (403 for everyone), a leading '#' turns the
holder's line into a comment, and a non-ASCII look-alike such as U+212A KELVIN SIGN
lower-cases to 'k' and admits someone else.

The grammar (README "Input limits"): an ASCII subset of RFC 5322's addr-spec.

    address    = local "@" domain              at most 254 characters in all
    local      = atom *("." atom)              not starting with '#'
    atom       = 1*( ALPHA / DIGIT / "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" /
                     "/" / "=" / "?" / "^" / "_" / "`" / "{" / "|" / "}" / "~" )
    domain     = label 1*("." label)           at least two labels
    label      = 1*63( ALPHA / DIGIT / "-" )   not starting or ending with '-'

No quoted local parts, comments, domain literals or internationalised addresses. The check is
pure and its message names the rule that failed and where, never the address itself (the
message goes into events and logs that more people read than the Session).
"""

from __future__ import annotations

import functools
import string

#: RFC 5321's limit on a path (256) less its angle brackets.
MAX_LENGTH = 254
LABEL_LIMIT = 63

_ATEXT = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-/=?^_`{|}~")
_LDH = frozenset(string.ascii_letters + string.digits + "-")


@functools.lru_cache(maxsize=16384)
def email_error(address: str) -> str | None:
    """Which rule of the grammar `address` breaks (a phrase for a message), or None.

    Remembered per address: a claim and a release each look at every waiting Session, and
    checking each one's address again was a tenth of a worker's CPU under a claim storm
    (docs/benchmarks.md, profile of the claim churn)."""
    if not address:
        return "it is empty"
    if len(address) > MAX_LENGTH:
        return f"it is longer than {MAX_LENGTH} characters ({len(address)})"
    if (error := _character_error(address)) is not None:
        return error
    if address.startswith("#"):
        return "it starts with '#', which oauth2-proxy reads as a comment line"
    if address.count("@") != 1:
        return f"it must contain exactly one '@' (it has {address.count('@')})"
    local, domain = address.split("@")
    if not local:
        return "there is nothing before '@'"
    if not domain:
        return "there is nothing after '@'"
    return _local_error(local) or _domain_error(domain)


def _character_error(address: str) -> str | None:
    """The first character of `address` that no allow-list line may hold, said why."""
    for i, ch in enumerate(address, start=1):
        code = ord(ch)
        if code < 0x20 or code == 0x7F:
            return (f"character {i} is a control character (U+{code:04X}): the allow-list is "
                    "read line by line")
        if code > 0x7E:
            return (f"character {i} is a non-ASCII character U+{code:04X}: oauth2-proxy "
                    "lower-cases addresses, and a look-alike can admit someone else")
        if ch.isspace():
            return f"character {i} is whitespace"
        if ch == ",":
            return f"character {i} is a comma: oauth2-proxy reads the allow-list as CSV"
        if ch == '"':
            return f"character {i} is a quote: oauth2-proxy reads the allow-list as CSV"
    return None


def _local_error(local: str) -> str | None:
    """Which rule the part before '@' breaks (`local`: atoms joined by '.'), or None."""
    for ch in local:
        if ch != "." and ch not in _ATEXT:
            return f"character '{ch}' is not allowed before '@'"
    if any(not atom for atom in local.split(".")):
        return "the local part (before '@') starts or ends with '.' or has '..'"
    return None


def _domain_error(domain: str) -> str | None:
    """Which rule the part after '@' breaks (`domain`: two or more labels), or None."""
    for ch in domain:
        if ch != "." and ch not in _LDH:
            return f"character '{ch}' is not allowed after '@' (letters, digits, '-' and '.')"
    labels = domain.split(".")
    if len(labels) < 2:
        return "the domain (after '@') must have at least two labels separated by '.'"
    for n, label in enumerate(labels, start=1):
        if not label or len(label) > LABEL_LIMIT or label[0] == "-" or label[-1] == "-":
            return (f"label {n} of the domain must have 1-{LABEL_LIMIT} letters, digits or "
                    "'-', and not start or end with '-'")
    return None


def user_key(address: str) -> str:
    """`address` as oauth2-proxy compares it: lower-cased, so ``U@X.IO`` and ``u@x.io`` are
    one user (it lower-cases every allow-list entry and every login, Go's strings.ToLower).

    The one normalisation: the sessions-per-user count and every other comparison of two
    Sessions' users go through it. For the addresses the grammar above admits (ASCII only)
    Python's str.lower is the same map as Go's; an address outside the grammar is never
    served (`session_error`), so where the two maps differ on other characters nothing is
    decided on the difference."""
    return address.lower()


def same_user(a: str, b: str) -> bool:
    """Whether two spec.user values name one person to oauth2-proxy (`user_key`)."""
    return user_key(a) == user_key(b)
