"""Theia Cloud's object names (its Java ``NamingUtil``), reproduced exactly.

A cluster that the Java operator ran must be adoptable by warmpool, so every name here has to
match the Java output byte for byte: the tests pin the examples of pool-spec.md §2.
"""

from __future__ import annotations

import hashlib
import re

from warmpool.pool.emails import user_key

VALID_NAME_LIMIT = 62
INSTANCE_PREFIX = "instance-"
LABEL_VALUE_LIMIT = 63

_INVALID_CHARS = re.compile(r"[^a-zA-Z0-9-]")
_USER_LABEL_INVALID = re.compile(r"[^a-zA-Z0-9]")


def as_valid_name(text: str, limit: int = VALID_NAME_LIMIT) -> str:
    """Turn any text into an RFC 1035 label the way Theia Cloud does (replace, prefix, cut, end)."""
    if not text:
        return text
    valid = _INVALID_CHARS.sub("-", text)
    if not valid[0].isalpha():
        valid = "a" + valid
    valid = valid[:limit]
    if not valid[-1].isalnum():
        valid = valid[:-1] + "z"
    return valid.lower()


def _join_valid(*segments: str | None) -> str:
    return as_valid_name("-".join(s for s in segments if s and not s.isspace()))


def _cut(text: str | None, length: int) -> str | None:
    if text is None or length <= 0:
        return None
    return text[:length]


def short_uid(uid: str) -> str:
    """The last 12 characters of a Kubernetes UID: unique enough, and short."""
    return uid[-12:]


def instance_prefix(instance: int) -> str:
    return f"{INSTANCE_PREFIX}{instance}"


def create_name(appdef_name: str, appdef_uid: str, instance: int, ident: str | None = None) -> str:
    """``NamingUtil.createName(AppDefinition, int, String)``: Deployment, Services, ConfigMaps."""
    if ident is None or not ident.strip():
        segment, ident = 17, None
    else:
        segment = 11
        ident = _cut(ident, segment)
    return _join_valid(
        instance_prefix(instance), ident, _cut(appdef_name, segment), short_uid(appdef_uid)
    )


def create_name_with_suffix(appdef_name: str, appdef_uid: str, instance: int, suffix: str) -> str:
    """``NamingUtil.createNameWithSuffix(AppDefinition, int, String)``: the suffix is kept whole."""
    if not suffix or suffix.isspace():
        raise ValueError("suffix must not be blank")
    prefix = instance_prefix(instance)
    uid12 = short_uid(appdef_uid)
    available = VALID_NAME_LIMIT - (len(suffix) + 1) - (len(prefix) + 1 + len(uid12))
    available = max(0, available)
    segment = max(1, available // 2) if available > 0 else 0
    return _join_valid(prefix, _cut(appdef_name, segment), uid12, suffix)


def app_selector(appdef_spec_name: str, instance: int) -> str:
    """The ``app`` label that ties an instance's Services to its pods, e.g. ``java-17-latest-1``."""
    return as_valid_name(f"{appdef_spec_name}-{instance}")


def label_value(text: str) -> str:
    """`text` as a label value Kubernetes accepts: at most 63 characters, alphanumeric at both
    ends. A label the API server refuses would block the whole claim (a Session name may have
    253 characters); the session-uuid label still identifies the Session exactly."""
    value = text[:LABEL_VALUE_LIMIT]
    start, end = 0, len(value)
    while start < end and not value[start].isalnum():
        start += 1
    while end > start and not value[end - 1].isalnum():
        end -= 1
    return value[start:end]


def user_label(user: str) -> str:
    """The ``theia-cloud.io/user`` label value: ``@`` → ``_at_``, other symbols → ``_``, ≤ 63."""
    return label_value(_USER_LABEL_INVALID.sub("_", user.replace("@", "_at_")))


# Bounded like an instance-id annotation (model.parse_instance_id): ASCII digits without a
# leading zero, at most 9 (`\d` would take any Unicode digit, and int() refuses > 4300 digits;
# a ConfigMap's name may have 253 characters and anyone with `create` may choose it).
_INSTANCE_NAME = re.compile(r"^instance-([1-9][0-9]{0,8})-", re.ASCII)


def instance_id_from_name(name: str) -> int | None:
    """The id k encoded in a pool object's name, or None for a name that is not ours."""
    m = _INSTANCE_NAME.match(name)
    return int(m.group(1)) if m else None


def split_instance_name(name: str) -> tuple[int, str] | None:
    """(k, rest) for a pool object's name ``instance-<k>-<rest>``, or None.

    ``rest`` is the same for every instance of a pool and part, except the internal Service's,
    whose AppDefinition segment is cut by the length of k (`create_name_with_suffix`).
    """
    m = _INSTANCE_NAME.match(name)
    return (int(m.group(1)), name[m.end():]) if m else None


def claimed_for(session_uid: str, user: str) -> str:
    """The value of the claimed-for annotation: the Session and a digest of its user (no
    e-mail address in plain text on an object anyone with read access to Services sees).

    The user as oauth2-proxy compares it (`emails.user_key`): a spec.user that changes only
    in case is the same person, whose instance is kept; any other change is a new user."""
    digest = hashlib.blake2b(user_key(user).encode(), digest_size=8).hexdigest()
    return f"{session_uid}/{digest}"


def claimed_for_as_spelt(session_uid: str, user: str) -> str:
    """The claimed-for value as releases before issue #27 wrote it (a digest of spec.user as
    spelt): still read as "the same user", so an upgrade releases no instance."""
    digest = hashlib.blake2b(user.encode(), digest_size=8).hexdigest()
    return f"{session_uid}/{digest}"
