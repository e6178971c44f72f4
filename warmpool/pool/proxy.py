"""oauth2-proxy in front of every instance: its image, its per-instance configuration, and the
grammars of the settings that go into either (issue #27, points 2, 6 and 7).

Theia Cloud's Java operator copies the namespace's template (the ConfigMap
`oauth2-proxy-config`) into every instance as text, replacing two placeholders. warmpool reads
the template instead (TOML, size-capped), rewrites the few keys that decide who gets past the
proxy, and writes every value back as an escaped TOML value, so:

- no setting and no template value can add a line to an instance's configuration (a quote and a
  newline in `WARMPOOL_INSTANCES_HOST` used to);
- `skip_auth_routes` / `skip_auth_regex` become anchored, path-only routes (`GET=^/health$`),
  and are refused outright while `reverse_proxy` is on and no trusted proxy is configured:
  oauth2-proxy then takes every client for a trusted proxy and evaluates its skip routes on a
  client-supplied `X-Forwarded-Uri` (GHSA-7x63-xv5r-3p2x, and oauth2-proxy issue #3506: the
  fix is incomplete while `trusted_proxy_ip` is unset);
- `trusted_ips`, `skip_auth_preflight` and `email_domains`, which let a request past the
  login or the allow-list, are refused;
- `client_secret` and `cookie_secret` leave the per-instance ConfigMaps when the proxy reads
  them from a Secret (`WARMPOOL_PROXY_SECRET`) instead.

Everything here is pure; a refusal is a `Finding` the decision turns into a Warning event on the
template ConfigMap (warmpool.pool.decide).
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from warmpool.pool import vocabulary as v

# --- the image ------------------------------------------------------------------------------

#: The newest oauth2-proxy release established for this change. Every release before 7.15.2 is
#: inside GHSA-7x63-xv5r-3p2x (CVE-2026-40575: a client-supplied X-Forwarded-Uri skips
#: authentication when reverse_proxy is on), GHSA-5hvv-m4w4-gf6v (health-check User-Agent
#: bypass), GHSA-pxq7-h93f-9jrg (URL fragment evaluated by skip routes) and GHSA-c5c4-8r6x-56w3
#: (an address with several `@` passes e-mail validation); before 7.11.0 also GHSA-7rh7-c77v-6434
#: (CVE-2025-54576: skip_auth_routes matched against the query string). v7.5.1, pinned until
#: now, is inside all five. Through v7.15.3 the X-Forwarded-Uri fix is incomplete while
#: `trusted_proxy_ip` is unset (oauth2-proxy issue #3506), which the configuration rewrite
#: below closes. Upstream Theia Cloud makes the version a setting too (`--oAuth2ProxyVersion`).
IMAGE_SETTING = "WARMPOOL_OAUTH2_PROXY_IMAGE"
DEFAULT_IMAGE = "quay.io/oauth2-proxy/oauth2-proxy:v7.15.5"

# An image reference as the distribution spec's grammar has it, bounded: an optional registry
# host (DNS labels, optional port), lower-case path components, and a tag or a digest (one of
# them required: an image that floats to `latest` is not a pinned proxy).
_DOMAIN_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*(?::[0-9]{{1,5}})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?")
MAX_IMAGE_CHARS = 255


def parse_image(raw: str) -> str:
    """`WARMPOOL_OAUTH2_PROXY_IMAGE`: an image reference with a tag or a digest, at most 255
    characters; anything else raises ValueError naming the setting."""
    if len(raw) > MAX_IMAGE_CHARS or not raw.isascii() or not _IMAGE.fullmatch(raw):
        raise ValueError(f"{IMAGE_SETTING} must be an image reference such as "
                         f"{DEFAULT_IMAGE}, got {_shown(raw)}")
    last = raw.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in raw:
        raise ValueError(f"{IMAGE_SETTING} must name a tag or a digest (as {DEFAULT_IMAGE}), "
                         f"got {_shown(raw)}")
    return raw


# --- the other settings that reach the configuration -----------------------------------------

TRUSTED_PROXIES_SETTING = "WARMPOOL_TRUSTED_PROXY_IPS"
SECRET_SETTING = "WARMPOOL_PROXY_SECRET"
MAX_TRUSTED_PROXIES = 32

# RFC 1123 host names, lower case (the Gateway API's hostnames and Ingress hosts are), at most
# 253 characters, each label 1-63; an optional port (a local demo's `localhost:8443`).
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
# A path below the host: segments of URL-safe characters, no `.`/`..` segments, bounded.
_SEGMENT = r"[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,62}"
_PATH = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,7}}")
# A Kubernetes object name (DNS-1123 subdomain).
_OBJECT_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")


def parse_host(raw: str, setting: str) -> str:
    """A host name per RFC 1123 (lower case, at most 253 characters), with an optional port
    1-65535; anything else raises ValueError naming the setting."""
    host, colon, port = raw.partition(":")
    ok = (raw.isascii() and len(host) <= 253 and _HOST.fullmatch(host) is not None
          and (not colon or (port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536)))
    if not ok:
        raise ValueError(f"{setting} must be a lower-case host name (RFC 1123) with an optional "
                         f":port, got {_shown(raw)}")
    return raw


def parse_path(raw: str, setting: str) -> str:
    """Up to eight `/`-separated segments of letters, digits, `.`, `_`, `~`, `-` (not starting
    with `.`); no leading or trailing `/`."""
    if not raw.isascii() or not _PATH.fullmatch(raw):
        raise ValueError(f"{setting} must be a path such as `instances` or `a/b` (letters, "
                         f"digits, . _ ~ -; no leading or trailing /), got {_shown(raw)}")
    return raw


def parse_trusted_proxies(raw: str) -> tuple[str, ...]:
    """`WARMPOOL_TRUSTED_PROXY_IPS`: comma-separated addresses or CIDRs of the gateway (or
    ingress controller) pods, at most 32; a range that trusts every address (`/0`) is
    refused, since it is what oauth2-proxy does without the setting."""
    items = [p.strip() for p in raw.split(",") if p.strip()]
    if len(items) > MAX_TRUSTED_PROXIES:
        raise ValueError(f"{TRUSTED_PROXIES_SETTING} lists {len(items)} ranges, at most "
                         f"{MAX_TRUSTED_PROXIES}")
    out = []
    for item in items:
        try:
            net = ipaddress.ip_network(item, strict=True)
        except ValueError:
            raise ValueError(f"{TRUSTED_PROXIES_SETTING} must be comma-separated IP addresses "
                             f"or CIDRs (10.0.0.0/8), got {_shown(item)}") from None
        if net.prefixlen == 0:
            raise ValueError(f"{TRUSTED_PROXIES_SETTING}: {item} trusts every address; name "
                             "the gateway's pod range instead")
        out.append(str(net))
    return tuple(out)


def parse_secret_name(raw: str) -> str:
    if not raw.isascii() or not _OBJECT_NAME.fullmatch(raw):
        raise ValueError(f"{SECRET_SETTING} must name a Secret (a DNS-1123 name), "
                         f"got {_shown(raw)}")
    return raw


#: The keys of the `WARMPOOL_PROXY_SECRET` Secret, and the variables oauth2-proxy reads them
#: from (its environment wins over its configuration file).
SECRET_KEYS = {"client_secret": ("client-secret", "OAUTH2_PROXY_CLIENT_SECRET"),
               "cookie_secret": ("cookie-secret", "OAUTH2_PROXY_COOKIE_SECRET")}


@dataclass(frozen=True, slots=True)
class ProxyPolicy:
    """What the deployment's settings say about the proxies' configuration."""

    trusted_proxy_ips: tuple[str, ...] = ()
    secret_name: str = ""


# --- the template ---------------------------------------------------------------------------

MINIMAL_CONFIG = """\
# Written by warmpool: the namespace has no oauth2-proxy-config ConfigMap to copy from.
http_address = "0.0.0.0:5000"
reverse_proxy = true
upstreams = ["http://127.0.0.1:placeholder-port/"]
redirect_url = "https://placeholder/oauth2/callback"
provider = "oidc"
skip_provider_button = true
cookie_secure = true
"""

HEAD_TEMPLATE = ("# Written by warmpool from the ConfigMap oauth2-proxy-config, values rewritten "
                 "(docs/security.md).\n")
HEAD_NO_TEMPLATE = "# Written by warmpool: the namespace has no oauth2-proxy-config ConfigMap.\n"
HEAD_UNUSABLE = ("# Written by warmpool: the ConfigMap oauth2-proxy-config cannot be read (see "
                 "its events).\n")

#: Bounds of the template: what a TOML file of oauth2-proxy's legacy options needs, and no more.
MAX_TEMPLATE_CHARS = 64 * 1024
MAX_KEYS = 200
MAX_LIST_ITEMS = 100
MAX_STRING_CHARS = 4096
_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")

#: Where a finding points: the template ConfigMap's one data key.
TEMPLATE_FIELD = f"data[{v.PROXY_CONFIG_KEY}]"
REASON_INVALID = "ProxyTemplateInvalid"
REASON_REFUSED = "ProxyTemplateRefused"

# A skip route oauth2-proxy would accept, reduced to a literal path: an optional METHOD=, an
# optional ^, the path (letters, digits, / _ ~ - and dots, a dot escaped or not), an optional
# trailing .* and an optional $.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_ROUTE = re.compile(r"(?:(?P<method>[A-Z]{3,7})=)?\^?(?P<path>/(?:[A-Za-z0-9/_~-]|\\?\.){0,200}?)"
                    r"(?:\.\*)?\$?")


@dataclass(frozen=True, slots=True)
class Finding:
    """A part of the template not used as written: the event's reason, the field, why."""

    reason: str
    field: str
    message: str


@dataclass(frozen=True, slots=True)
class Prepared:
    """The template's values after the rewrite, and what was refused on the way. Shared by
    every caller of `prepare` with the same template (it is memoized): read-only, and
    `render` writes a new file from it each time."""

    values: Mapping[str, Any]
    findings: tuple[Finding, ...] = ()
    # The literal paths of the kept skip routes, with their methods, anchored per instance.
    skip_routes: tuple[tuple[str, str], ...] = ()
    # The first line of the rendered file: where its values come from.
    head: str = HEAD_TEMPLATE

    def render(self, url: str, port: int, session_path: str) -> str:
        """The instance's configuration: the placeholders filled in inside string values
        (`https://placeholder` → the session URL, `placeholder-port` → spec.port), the skip
        routes anchored to this instance's path, every value written as escaped TOML."""
        values = {k: _fill(val, url, port) for k, val in self.values.items()}
        if self.skip_routes:
            prefix = _literal(session_path.rstrip("/"))
            values["skip_auth_routes"] = [f"{m}=^(?:{prefix})?{p}$" for m, p in self.skip_routes]
        return self.head + "".join(f"{k} = {_toml(val)}\n" for k, val in values.items())


def prepare(template: str | None, policy: ProxyPolicy) -> Prepared:
    """Read the namespace's template (None: warmpool's minimal one) with a bounded grammar and
    apply the policy. Never raises: what cannot be used is a Finding, and a template that
    cannot be read at all gives way to the minimal configuration (which names no client, so
    the proxy does not start: the instance fails closed, and the event says why)."""
    if template is None:
        return _read(MINIMAL_CONFIG, policy, HEAD_NO_TEMPLATE)
    if not isinstance(template, str):  # the API server stores strings; a fake cache might not
        return _unusable(policy, f"is a {type(template).__name__}, not text")
    if len(template) > MAX_TEMPLATE_CHARS:
        return _unusable(policy, f"is {len(template)} characters, more than "
                                 f"{MAX_TEMPLATE_CHARS}")
    return _read(template, policy, HEAD_TEMPLATE)


@functools.lru_cache(maxsize=16)
def _read(text: str, policy: ProxyPolicy, head: str) -> Prepared:
    """`prepare` of a text within the bounds, memoized by (text, policy, head), a few of
    them (a namespace's template changes rarely): every proxy ConfigMap a job builds, and
    every shape it compares, parsed the same TOML again (tomllib was 1.9 % of the samples
    while a pool grew, issue #28). Pure, and its answer is read-only, so a shared one is
    safe; only text already bounded (a string, at most `MAX_TEMPLATE_CHARS`) is kept."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return _unusable(policy, f"is not TOML ({str(exc)[:200]})")
    if len(raw) > MAX_KEYS:
        return _unusable(policy, f"has {len(raw)} keys, more than {MAX_KEYS}")
    return _rewrite(raw, policy, head=head)


def _unusable(policy: ProxyPolicy, why: str) -> Prepared:
    minimal = _read(MINIMAL_CONFIG, policy, HEAD_UNUSABLE)
    finding = Finding(REASON_INVALID, TEMPLATE_FIELD,
                      f"ConfigMap {v.NAMESPACE_PROXY_TEMPLATE} {TEMPLATE_FIELD} {why}: not used; "
                      "instances get warmpool's minimal configuration, whose proxy does not "
                      "start until the template is fixed")
    return Prepared(minimal.values, (finding,), minimal.skip_routes, HEAD_UNUSABLE)


class _Findings:
    """The findings of one rewrite, in the order they were made."""

    def __init__(self) -> None:
        self.found: list[Finding] = []

    def refuse(self, key: str, why: str, reason: str = REASON_REFUSED) -> None:
        self.found.append(Finding(reason, f"{TEMPLATE_FIELD}.{key}",
                                  f"ConfigMap {v.NAMESPACE_PROXY_TEMPLATE} {TEMPLATE_FIELD}: "
                                  f"{key} {why}"))


def _rewrite(raw: Mapping[str, Any], policy: ProxyPolicy, *, head: str) -> Prepared:
    findings = _Findings()
    values = _writable(raw, findings)
    reverse = _maybe_on(values.get("reverse_proxy", False))
    trusted = _trusted(values, policy, reverse, findings)
    routes = _skip_routes(values, reverse, trusted, findings)
    _refuse_open_doors(values, reverse, findings)
    if policy.secret_name:
        for key in SECRET_KEYS:
            values.pop(key, None)  # read from the Secret (environment), not this ConfigMap
    return Prepared(MappingProxyType(values), tuple(findings.found), tuple(routes), head)


def _writable(raw: Mapping[str, Any], findings: _Findings) -> dict[str, Any]:
    """The template's options that are oauth2-proxy option names with values this module
    can write; the others dropped, each a finding."""
    values: dict[str, Any] = {}
    for key, val in raw.items():
        if not _KEY.fullmatch(key):
            findings.refuse(_shown(key), "is not an oauth2-proxy option name: dropped",
                            REASON_INVALID)
        elif (why := _unwritable(val)) is not None:
            findings.refuse(key, f"{why}: dropped", REASON_INVALID)
        else:
            values[key] = val
    return values


def _trusted(
    values: dict[str, Any], policy: ProxyPolicy, reverse: bool, findings: _Findings,
) -> Sequence[str]:
    """Who is a trusted proxy: the setting, else the template's own list if it is one. The
    template's trusted_proxy_ip is replaced by it (kept only with reverse_proxy on)."""
    trusted: Sequence[str] = policy.trusted_proxy_ips
    if not trusted and "trusted_proxy_ip" in values:
        own = _strings(values["trusted_proxy_ip"])
        try:
            trusted = parse_trusted_proxies(",".join(own)) if own is not None else ()
        except ValueError:
            trusted = ()
        if not trusted:
            findings.refuse("trusted_proxy_ip", "is not a list of addresses or CIDRs narrower "
                            f"than /0: dropped (set {TRUSTED_PROXIES_SETTING} to the gateway's "
                            "pod range)")
    values.pop("trusted_proxy_ip", None)
    if reverse and trusted:
        values["trusted_proxy_ip"] = list(trusted)
    return trusted


def _skip_routes(
    values: dict[str, Any], reverse: bool, trusted: Sequence[str], findings: _Findings,
) -> list[tuple[str, str]]:
    """The skip routes, taken out of `values`: anchored literal paths, or refused."""
    routes: list[tuple[str, str]] = []
    for key in ("skip_auth_routes", "skip_auth_regex"):
        if key not in values:
            continue
        entries = _strings(values.pop(key))
        if entries is None:
            findings.refuse(key, "is not a string or a list of strings: dropped")
            continue
        if reverse and not trusted:
            findings.refuse(
                key, f"{_shown(str(entries))} refused: reverse_proxy is on and no trusted "
                f"proxy is configured ({TRUSTED_PROXIES_SETTING} unset), so oauth2-proxy "
                "would match them against a client-supplied X-Forwarded-Uri "
                "(GHSA-7x63-xv5r-3p2x, oauth2-proxy #3506); instances are served with "
                "authentication on every path")
            continue
        for entry in entries:
            route = _anchored(entry, regex_only=key == "skip_auth_regex")
            if route is None:
                findings.refuse(key, f"entry {_shown(entry)} is not a literal path "
                                "([METHOD=]/a/path, optionally ^...$ or ending in .*): dropped")
            else:
                routes.append(route)
    return routes


def _refuse_open_doors(values: dict[str, Any], reverse: bool, findings: _Findings) -> None:
    """Options that would let someone other than the holder in, taken out of `values`."""
    if reverse and "trusted_ips" in values:
        values.pop("trusted_ips")
        findings.refuse("trusted_ips", "refused: with reverse_proxy on, the client address it "
                        "is checked against comes from X-Forwarded-For, which a client writes")
    if "skip_auth_preflight" in values and _maybe_on(values["skip_auth_preflight"]):
        values.pop("skip_auth_preflight")
        findings.refuse("skip_auth_preflight", "refused: it sends every OPTIONS request, on "
                        "any path, to the IDE without a login")
    if "email_domains" in values:
        values.pop("email_domains")
        findings.refuse("email_domains", "refused: it would admit users beside the instance's "
                        "holder (each instance's allow-list is its authenticated-emails file)")


def _anchored(entry: str, *, regex_only: bool) -> tuple[str, str] | None:
    """(method, escaped literal path) of a skip route, or None if it is not a literal path.
    `skip_auth_regex` entries have no method. No method: GET (a health check's)."""
    m = _ROUTE.fullmatch(entry) if len(entry) <= 256 else None
    if m is None or (m["method"] is not None and (regex_only or m["method"] not in _METHODS)):
        return None
    return (m["method"] or "GET", _literal(m["path"].replace("\\.", ".")))


def _literal(path: str) -> str:
    """A path as a Go (RE2) regex matching exactly it. The grammars above leave only the dot
    special; anything else outside them is written as a `\\x{..}` code point all the same."""
    return "".join(c if re.fullmatch(r"[A-Za-z0-9/_~-]", c) else
                   "\\." if c == "." else f"\\x{{{ord(c):x}}}" for c in path)


def _unwritable(val: Any) -> str | None:
    """Why a value is not one an oauth2-proxy option takes (None: it is)."""
    if isinstance(val, list):
        if len(val) > MAX_LIST_ITEMS:
            return f"has {len(val)} items, more than {MAX_LIST_ITEMS}"
        return next((why for item in val if (why := _unwritable_scalar(item))), None)
    return _unwritable_scalar(val)


def _unwritable_scalar(val: Any) -> str | None:
    if isinstance(val, str):
        return (f"is {len(val)} characters, more than {MAX_STRING_CHARS}"
                if len(val) > MAX_STRING_CHARS else None)
    if isinstance(val, bool | int):
        return None
    if isinstance(val, float):
        return None if math.isfinite(val) else "is not a finite number"
    return f"is a {type(val).__name__}, not a string, number, boolean or list of them"


def _maybe_on(val: Any) -> bool:
    """Whether oauth2-proxy may read the value as true: anything but false or a string Go's
    strconv.ParseBool reads as false (an odd `1` or `"yes"` counts as on: the safe side)."""
    return not (val is False or (isinstance(val, str)
                                 and val in ("0", "f", "F", "FALSE", "false", "False")))


def _strings(val: Any) -> list[str] | None:
    if isinstance(val, str):
        return [val]
    if isinstance(val, list) and all(isinstance(i, str) for i in val):
        return list(val)
    return None


def _fill(val: Any, url: str, port: int) -> Any:
    if isinstance(val, str):
        return val.replace("https://placeholder", url).replace("placeholder-port", str(port))
    if isinstance(val, list):
        return [_fill(i, url, port) for i in val]
    return val


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def _toml(val: Any) -> str:
    """A value as TOML: strings as basic strings with every quote, backslash and control
    character escaped, so no value can end its line or add a key."""
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, int | float):
        return repr(val)
    if isinstance(val, list):
        return "[" + ", ".join(_toml(i) for i in val) + "]"
    text = "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F
                                       else c) for c in str(val))
    return f'"{text}"'


def _shown(raw: str) -> str:
    return repr(raw) if len(raw) <= 80 else f"{raw[:80]!r}... ({len(raw)} chars)"


#: The proxy container's fixed hardening (docs/security.md): its image runs as distroless's
#: `nonroot` user (65532), writes nothing to its root filesystem and needs no capability; what
#: it uses idle is a few MiB and millicores, the limits leave room for a busy IDE's traffic.
PROXY_UID = 65532
PROXY_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"},
                   "limits": {"cpu": "500m", "memory": "128Mi"}}
