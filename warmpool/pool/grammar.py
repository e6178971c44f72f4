"""The bounded grammars of the names and hosts warmpool copies from objects it does not own.

A value read from someone else's object (a Session's `spec.appDefinition`, an owner
reference's `name`, a PoolSchedule's `spec.appDefinition`, an AppDefinition's
`ingressHostnamePrefixes`, the shared route's `parentRefs` and `hostnames`) goes into a work
key, an API path or an object warmpool writes. Each is checked here against the grammar the
API server would hold it to, so that a bad one is refused with a message naming the rule at
the object that carries it, instead of making a key the queue cannot parse (a `/`), a request
to another path, or a write the API server refuses for every claim. Pure; never raises.

Each `*_error` function returns None for a good value and otherwise a short reason, to be
prefixed with the field's path by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Kubernetes' DNS-1123 subdomain (metadata.name of a custom resource, a ConfigMap, ...):
#: lower-case alphanumerics, '-' and '.', alphanumeric at both ends, at most 253 characters.
#: re.ASCII: `\w`-free, but also keeps `[a-z]` from ever meaning more than ASCII.
SUBDOMAIN_MAX = 253
#: (IsDNS1123Subdomain bounds only the whole; its labels may be longer than 63.)
_PART = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_PART}(?:\.{_PART})*", re.ASCII)
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
#: RFC 1123 hostnames as the Gateway API's `Hostname` type has them (lower case, at most 253,
#: labels of at most 63), optionally with one leading wildcard label "*.".
_HOSTNAME = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*", re.ASCII)
#: A hostname prefix of Theia Cloud's `ingressHostnamePrefixes`: labels each followed by a dot
#: ("ws.", "*.webview."), to be put before the instances host.
_PREFIX = re.compile(rf"(?:\*\.)?(?:{_LABEL}\.)*", re.ASCII)
#: Gateway API v1 `ParentReference`: group (a DNS subdomain or ""), kind (an UpperCamel
#: identifier), name and namespace (names), sectionName (a DNS-1123 subdomain), port.
_KIND = re.compile(r"[a-zA-Z](?:[-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?", re.ASCII)
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
PARENT_REF_FIELDS = ("group", "kind", "namespace", "name", "sectionName", "port")
#: The Gateway API's bounds on an HTTPRoute: at most 32 parentRefs and 16 hostnames.
MAX_PARENT_REFS = 32
MAX_HOSTNAMES = 16


def shown(value: Any, limit: int = 60) -> str:
    """`value` for a message: its repr, cut so that an event stays one readable line."""
    if isinstance(value, int) and value.bit_length() > 64:  # str() refuses > 4300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def object_name_error(value: object) -> str | None:
    """What keeps `value` from being the metadata.name of an AppDefinition or Session (a
    DNS-1123 subdomain), or None. Such names are all a work key may hold between its `/`s."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {shown(value)}"
    if len(value) > SUBDOMAIN_MAX:
        return f"must be at most {SUBDOMAIN_MAX} characters, got {len(value)}"
    if not _SUBDOMAIN.fullmatch(value):
        return ("must be a Kubernetes object name (a DNS-1123 subdomain: lower-case letters, "
                f"digits, '-' and '.', alphanumeric at both ends), got {shown(value)}")
    return None


def is_object_name(value: object) -> bool:
    return object_name_error(value) is None


def hostname_error(value: object) -> str | None:
    """What keeps `value` from being an HTTPRoute hostname (RFC 1123, lower case, an optional
    leading "*." wildcard, at most 253 characters), or None."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {shown(value)}"
    if len(value) > SUBDOMAIN_MAX:
        return f"must be at most {SUBDOMAIN_MAX} characters, got {len(value)}"
    if not _HOSTNAME.fullmatch(value):
        return ("must be an RFC 1123 hostname (lower-case labels of letters, digits and '-', "
                f"separated by dots, optionally '*.' first), got {shown(value)}")
    return None


def hostname_prefix_error(value: object) -> str | None:
    """What keeps `value` from being a hostname prefix ("ws.", "*.webview.": DNS labels, each
    followed by a dot, an optional "*." first), or None. The empty prefix is the bare host."""
    if not isinstance(value, str):
        return f"must be a string, got {shown(value)}"
    if len(value) > SUBDOMAIN_MAX:
        return f"must be at most {SUBDOMAIN_MAX} characters, got {len(value)}"
    if not _PREFIX.fullmatch(value):
        return ("must be hostname labels each followed by a dot, such as 'ws.' or "
                f"'*.webview.', got {shown(value)}")
    return None


def parent_ref_error(ref: object) -> str | None:
    """What keeps `ref` from being a Gateway API ParentReference warmpool may copy, or None.

    Only the six fields of the v1 type are allowed (an unknown one is a typo or a newer API
    that this copy could not honour), each in its grammar; `name` is required.
    """
    if not isinstance(ref, Mapping):
        return f"must be an object, got {shown(ref)}"
    unknown = sorted(str(k) for k in ref if k not in PARENT_REF_FIELDS)
    if unknown:
        return f"has fields other than {', '.join(PARENT_REF_FIELDS)}: {shown(unknown)}"
    name = ref.get("name")
    if (error := object_name_error(name)) is not None:
        return f"name {error}"
    group = ref.get("group")
    if group is not None and group != "" and (error := object_name_error(group)) is not None:
        return f"group {error}"
    kind = ref.get("kind")
    if kind is not None and not (isinstance(kind, str) and _KIND.fullmatch(kind)):
        return f"kind must be a kind such as 'Gateway', got {shown(kind)}"
    namespace = ref.get("namespace")
    if namespace is not None and not (isinstance(namespace, str)
                                      and _NAMESPACE.fullmatch(namespace)):
        return f"namespace must be a namespace name, got {shown(namespace)}"
    section = ref.get("sectionName")
    if section is not None and (error := object_name_error(section)) is not None:
        return f"sectionName {error}"
    port = ref.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        return f"port must be a TCP port (1-65535), got {shown(port)}"
    return None


def route_parents_error(parent_refs: object, hostnames: object) -> str | None:
    """What of a shared route's `spec.parentRefs` and `spec.hostnames` a Session's route may
    not copy, with the field's path, or None. Missing lists read as empty."""
    refs = [] if parent_refs is None else parent_refs
    if not isinstance(refs, list):
        return f"spec.parentRefs must be a list, got {shown(parent_refs)}"
    if len(refs) > MAX_PARENT_REFS:
        return f"spec.parentRefs has {len(refs)} entries; at most {MAX_PARENT_REFS}"
    for i, ref in enumerate(refs):
        if (error := parent_ref_error(ref)) is not None:
            return f"spec.parentRefs[{i}] {error}"
    hosts = [] if hostnames is None else hostnames
    if not isinstance(hosts, list):
        return f"spec.hostnames must be a list, got {shown(hostnames)}"
    if len(hosts) > MAX_HOSTNAMES:
        return f"spec.hostnames has {len(hosts)} entries; at most {MAX_HOSTNAMES}"
    for i, host in enumerate(hosts):
        if (error := hostname_error(host)) is not None:
            return f"spec.hostnames[{i}] {error}"
    return None
