"""Typed, validated views of the two custom resources.

The API server admits anything (the CRDs preserve unknown fields and do not type-check, so that
real Theia Cloud objects are accepted); validation therefore happens here, once, and a bad object
becomes an ``Invalid`` with a message a person can act on instead of an exception mid-reconcile.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.emails import email_error
from warmpool.pool.grammar import hostname_prefix_error, object_name_error
from warmpool.pool.grammar import shown as _shown
from warmpool.pool.quantity import parse_quantity, quantity_error

#: The most instances one AppDefinition may ask for, unless configured otherwise
#: (PoolSettings.max_instances_ceiling, WARMPOOL_INSTANCES_CEILING): a pool is enumerated id
#: by id (resync, claims), so `minInstances: 1000000` must be refused, not attempted.
MAX_INSTANCES_CEILING = 5000
CEILING_SETTING = "WARMPOOL_INSTANCES_CEILING"

_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_DEFAULT_PULL_POLICY = "IfNotPresent"
_MAX_USER_ID = 2**31 - 1  # Kubernetes' IsValidUserID
_QUANTITY_FIELDS = ("requestsCpu", "requestsMemory", "limitsCpu", "limitsMemory")

#: A Session route carries the instances host and one hostname per prefix: the Gateway API
#: allows 16 hostnames on a route.
MAX_HOSTNAME_PREFIXES = 15

_SPEC_NAME = re.compile(r"[a-z0-9A-Z\-_]+")  # the CRD's pattern; used with fullmatch
# A Kubernetes object name (RFC 1123 subdomain), at most 253 characters: what an Ingress may
# be called. Used with fullmatch.
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_OBJECT_NAME_LIMIT = 253
_INSTANCE_ID = re.compile(r"[1-9][0-9]{0,8}")


@dataclass(frozen=True, slots=True)
class Invalid:
    """A resource the controller refuses to act on, and why.

    `ingress_name`: the AppDefinition's spec.ingressname where that field alone is a valid
    object name (``ingress_name_of``), else "". A release needs nothing else of an invalid
    AppDefinition: in upstream's Ingress mode it names the shared Ingress whose rule for a
    released instance must go (issue #27), whatever else of the spec is wrong.
    """

    message: str
    ingress_name: str = ""


@dataclass(frozen=True, slots=True)
class AppDefinition:
    name: str
    namespace: str
    uid: str
    generation: int
    spec_name: str
    image: str
    image_pull_policy: str
    run_as_user: int | None
    port: int
    min_instances: int
    max_instances: int
    requests_cpu: str | None
    requests_memory: str | None
    limits_cpu: str | None
    limits_memory: str | None
    deleting: bool
    # metadata.creationTimestamp: which of two colliding AppDefinitions came first.
    created: str = ""
    # spec.ingressname: the shared HTTPRoute (or Ingress) whose parentRefs and hostnames the
    # Session routes copy (session-lifecycle §1); "" when unset.
    ingress_name: str = ""
    # spec.ingressHostnamePrefixes: the route's hostnames when the shared route has none.
    ingress_hostname_prefixes: tuple[str, ...] = ()
    # spec.pullSecret: the Secret every instance pulls its image with (the pod's
    # imagePullSecrets, as Java's K8sResourceFactory adds it); "" when unset.
    pull_secret: str = ""
    # spec.monitor.port: where the IDE's monitor listens, declared on the external Service so
    # that the activity tracker can reach it (warmpool.controller.timeouts); None when unset.
    monitor_port: int | None = None
    # Whether spec.monitor.activityTracker is declared: the IDE's
    # THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER (Java takes it from --enableActivityTracker).
    activity_tracker: bool = False
    # The apiVersion the object was read at (the cluster's line, warmpool.pool.lines): what
    # an owner reference to it says, so the garbage collector resolves it on that cluster.
    api_version: str = v.APPDEF_API_VERSION
    # spec.sidecars[].name (v1beta11, the EduIDE-Cloud fork, only): containers the fork's
    # operator adds to each instance's pod. warmpool does not run them (README, "Theia Cloud
    # lines"): they are read so that this is said, not silently dropped.
    sidecars: tuple[str, ...] = ()

    def owner_reference(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": v.APPDEF_KIND,
            "name": self.name,
            "uid": self.uid,
        }


@dataclass(frozen=True, slots=True)
class Session:
    name: str
    namespace: str
    uid: str
    appdef: str
    user: str
    created: str
    deleting: bool
    instance_id: int | None
    status: str
    message: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    # Why a field of the object is unusable as it is (wrong type), or None: an error by itself.
    malformed: str | None = None
    # status.url (set once the instance answers, session-lifecycle §2) and status.error
    # ("<code>:<reason>", e.g. the probe's give-up): "" when unset.
    url: str = ""
    error: str = ""
    # spec.sessionSecret ("" when missing or not a string): the bearer token of the instance's
    # monitor (session-lifecycle §5.2). Kept out of the repr, so that no log line shows it.
    secret: str = field(default="", repr=False)
    # status.lastActivity in epoch ms, or None when missing or not a non-negative integer.
    last_activity: int | None = None
    # The apiVersion the object was read at: what an owner reference to it says.
    api_version: str = v.SESSION_API_VERSION
    # `session_error` of this Session, computed once when it is made rather than each time
    # it is asked (a claim asks it of every Session of its pool): it reads only the fields
    # above that are strings, which never change, and `dataclasses.replace` makes a new
    # Session, so it is computed again there. Not an argument, not compared, not shown.
    problem: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "problem", _problem_of(self))

    @property
    def live(self) -> bool:
        return not self.deleting

    @property
    def started_lazily(self) -> bool:
        """Started by the Java operator's lazy fallback: it runs on a Deployment of its own
        (owned by the Session, so the garbage collector ends it with the Session), not on a
        pool instance. Found on a cluster migrated from it (docs/operating.md); warmpool
        never claims an instance for it, which would move its user off the running IDE."""
        return (self.annotations.get(v.ANNOTATION_START_STRATEGY)
                == v.START_STRATEGY_LAZY_FALLBACK)

    def owner_reference(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": v.SESSION_KIND,
            "name": self.name,
            "uid": self.uid,
        }


def _int_field(spec: Mapping[str, Any], key: str, *, required: bool) -> int | Invalid | None:
    value: object = spec.get(key)  # narrowed to int below (an Any would stay Any in mypy 1.x)
    if value is None:
        return Invalid(f"spec.{key} is missing") if required else None
    if isinstance(value, bool) or not isinstance(value, int):
        return Invalid(f"spec.{key} must be an integer, got {_shown(value)}")
    return value


def ingress_name_of(obj: Mapping[str, Any]) -> str:
    """spec.ingressname read on its own, for a release while the rest of the spec is invalid.

    Bounded: a string that is a Kubernetes object name (RFC 1123 subdomain, at most 253
    characters, surrounding blanks ignored as ``parse_appdefinition`` ignores them);
    anything else reads as "" (no shared Ingress known: nothing of one is written).
    """
    spec = obj.get("spec")
    raw = spec.get("ingressname") if isinstance(spec, Mapping) else None
    if not isinstance(raw, str):
        return ""
    name = raw.strip()  # linear; the pattern runs only on at most 253 characters
    return name if len(name) <= _OBJECT_NAME_LIMIT and _OBJECT_NAME.fullmatch(name) else ""


def parse_appdefinition(
    obj: Mapping[str, Any], *, max_instances_ceiling: int = MAX_INSTANCES_CEILING
) -> AppDefinition | Invalid:
    """Validate an AppDefinition as the pool needs it; an ``Invalid`` is left untouched
    (and carries what a release still needs of it: ``Invalid.ingress_name``).

    Never raises, whatever the object holds (one AppDefinition must not stop its namespace).
    """
    parsed = _parse_appdefinition(obj, max_instances_ceiling)
    if isinstance(parsed, Invalid) and not parsed.ingress_name:
        return replace(parsed, ingress_name=ingress_name_of(obj))
    return parsed


def _parse_appdefinition(
    obj: Mapping[str, Any], max_instances_ceiling: int
) -> AppDefinition | Invalid:
    meta = _mapping(obj.get("metadata"))
    spec = obj.get("spec")
    if spec is None:
        return Invalid("spec is missing")
    if not isinstance(spec, Mapping):
        return Invalid(f"spec must be an object, got {type(spec).__name__}")
    ints = _spec_ints(spec)
    if isinstance(ints, Invalid):
        return ints
    min_i, max_i, port = ints["minInstances"], ints["maxInstances"], ints["port"]
    assert min_i is not None and max_i is not None and port is not None
    if (error := _sizes_error(min_i, max_i, port, max_instances_ceiling)) is not None:
        return Invalid(error)
    spec_name = _spec_name(spec.get("name"), max_i)
    if isinstance(spec_name, Invalid):
        return spec_name
    image = _image(spec.get("image"))
    if isinstance(image, Invalid):
        return image
    resources = {key: _opt_str(spec.get(key)) for key in _QUANTITY_FIELDS}
    pull_policy = spec.get("imagePullPolicy") or _DEFAULT_PULL_POLICY
    if (error := _deployment_error(image, pull_policy, ints["uid"], port, resources)):
        return Invalid(error)
    if not meta.get("uid"):
        return Invalid("metadata.uid is missing")
    ingress_name = spec.get("ingressname")
    prefixes = spec.get("ingressHostnamePrefixes") or []
    if (error := _ingress_error(ingress_name, prefixes)) is not None:
        return Invalid(error)
    pull_secret = spec.get("pullSecret")
    if pull_secret is None:
        pull_secret = ""
    # Copied into every instance's pod spec as a LocalObjectReference: held to the grammar of
    # a Secret's name here, so a bad one stops this pool alone, with a message, instead of
    # every Deployment write being refused (or a pod waiting on a Secret nobody can make).
    if pull_secret != "" and (error := object_name_error(pull_secret)) is not None:
        return Invalid(f"spec.pullSecret {error}")
    lifetime = parse_lifetime(obj)
    if (error := _monitor_error(lifetime)) is not None:
        return Invalid(error)
    sidecars = _sidecar_names(spec.get("sidecars"))
    if isinstance(sidecars, Invalid):
        return sidecars
    return AppDefinition(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        uid=meta["uid"],
        generation=_generation(meta.get("generation")),
        spec_name=spec_name,
        image=image,
        image_pull_policy=pull_policy,
        run_as_user=ints["uid"],
        port=port,
        min_instances=min_i,
        max_instances=max_i,
        requests_cpu=resources["requestsCpu"],
        requests_memory=resources["requestsMemory"],
        limits_cpu=resources["limitsCpu"],
        limits_memory=resources["limitsMemory"],
        deleting=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        ingress_name=(ingress_name or "").strip(),
        ingress_hostname_prefixes=tuple(prefixes),
        pull_secret=pull_secret,
        monitor_port=lifetime.monitor_port,
        activity_tracker=lifetime.tracker is not None,
        api_version=theia_api_version(obj, v.APPDEF_API_VERSION),
        sidecars=sidecars,
    )


def _spec_ints(spec: Mapping[str, Any]) -> dict[str, int | None] | Invalid:
    """The AppDefinition's integer fields (uid optional), or the first one that is wrong."""
    ints: dict[str, int | None] = {}
    for key, required in (
        ("minInstances", True),
        ("maxInstances", True),
        ("port", True),
        ("uid", False),
    ):
        parsed = _int_field(spec, key, required=required)
        if isinstance(parsed, Invalid):
            return parsed
        ints[key] = parsed
    return ints


def _sizes_error(min_i: int, max_i: int, port: int, max_instances_ceiling: int) -> str | None:
    """What is wrong with the pool's bounds and port, if anything."""
    for key, value in (("minInstances", min_i), ("maxInstances", max_i)):
        if value > max_instances_ceiling:
            return (f"spec.{key} ({_shown(value)}) is above the ceiling of "
                    f"{max_instances_ceiling} instances per AppDefinition "
                    f"(the controller's {CEILING_SETTING})")
    if min_i < 0:
        return f"spec.minInstances must be >= 0, got {min_i}"
    if max_i < min_i:
        return f"spec.minInstances ({min_i}) must not exceed spec.maxInstances ({max_i})"
    if not 0 < port < 65536:
        return f"spec.port must be a TCP port (1-65535), got {port}"
    return None


def _spec_name(spec_name: object, max_i: int) -> str | Invalid:
    """spec.name, if valid for instance ids up to `max_i`."""
    if not isinstance(spec_name, str) or not _SPEC_NAME.fullmatch(spec_name):
        return Invalid(f"spec.name must match ^[a-z0-9A-Z-_]+$, got {_shown(spec_name)}")
    # Each instance's Services select its pods by the `app` label "<spec.name>-<id>", which
    # Theia Cloud cuts to 62 characters: past that, instances share one selector and a user's
    # Service would route to another user's pod. Refuse rather than build that.
    longest = naming.VALID_NAME_LIMIT - 1 - len(str(max_i))
    if len(spec_name) > longest:
        return Invalid(f"spec.name is {len(spec_name)} characters; with instance ids up to "
                       f"maxInstances ({max_i}) at most {longest} fit in the "
                       f"{naming.VALID_NAME_LIMIT}-character `app` selector "
                       "'<spec.name>-<id>' that keeps instances apart")
    return spec_name


def _image(image: object) -> str | Invalid:
    """spec.image, if it is a non-blank string (its grammar is the Deployment's check)."""
    if image is not None and not isinstance(image, str):
        return Invalid(f"spec.image must be a string, got {_shown(image)}")
    if not image or not image.strip():
        return Invalid("spec.image is missing")
    return image


def _ingress_error(ingress_name: object, prefixes: object) -> str | None:
    """What is wrong with spec.ingressname and spec.ingressHostnamePrefixes, if anything."""
    if ingress_name is not None and not isinstance(ingress_name, str):
        return f"spec.ingressname must be a string, got {_shown(ingress_name)}"
    if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
        return f"spec.ingressHostnamePrefixes must be a list of strings, got {_shown(prefixes)}"
    # Each prefix is put before the instances host in every Session route's hostnames: bounded
    # by the hostname grammar (warmpool.pool.grammar) and by count, so a bad one is refused
    # here, at its AppDefinition, rather than by the API server at every claim.
    if len(prefixes) > MAX_HOSTNAME_PREFIXES:
        return (f"spec.ingressHostnamePrefixes has {len(prefixes)} entries; at most "
                f"{MAX_HOSTNAME_PREFIXES} (a route has at most 16 hostnames, one of "
                "them the instances host)")
    for i, prefix in enumerate(prefixes):
        if (error := hostname_prefix_error(prefix)) is not None:
            return f"spec.ingressHostnamePrefixes[{i}] {error}"
    return None


def _monitor_error(lifetime: Lifetime) -> str | None:
    """What in spec.monitor refuses the pool, if anything.

    spec.monitor is read once, by parse_lifetime (the timeouts read it too). What the
    timeouts may read as unset must not be built into a Service: a bad port refuses the pool.
    (The activity tracker's minutes stay the timeouts' concern: not checked here.)"""
    if (problem := next((p for p in lifetime.problems
                         if p.startswith(("spec.monitor must", "spec.monitor.port"))),
                        None)) is not None:
        return problem.removesuffix(": read as unset")
    if lifetime.monitor_port == v.OAUTH2_PROXY_PORT:
        return (f"spec.monitor.port must not be {v.OAUTH2_PROXY_PORT}: the oauth2-proxy "
                "in the same pod listens there")
    return None


@dataclass(frozen=True, slots=True)
class ActivityTracker:
    """spec.monitor.activityTracker, in minutes, as written (None: missing or unusable)."""

    timeout_after: int | None
    notify_after: int | None


@dataclass(frozen=True, slots=True)
class Lifetime:
    """What of an AppDefinition bounds its Sessions' lives (session-lifecycle §5).

    Read apart from the pool's validation (``parse_appdefinition``), as Java reads it: an
    AppDefinition the pool refuses still limits its Sessions, and a bad limit never makes a
    pool invalid. Values are kept as written; which of them disable a limit (missing, 0,
    negative) is the decision's (``warmpool.pool.timeouts``). A malformed value reads as
    missing, and ``problems`` says what was wrong with it.
    """

    name: str
    namespace: str
    timeout: int | None  # spec.timeout, minutes from creation
    monitor_port: int | None  # spec.monitor.port
    tracker: ActivityTracker | None  # None: no spec.monitor.activityTracker block
    problems: tuple[str, ...] = ()
    # metadata.uid and spec.name ("" when missing or not a string): what names the instance
    # Services the pool made, the only place the monitor's token is sent (§5.2, issue #29).
    uid: str = ""
    spec_name: str = ""


_DECIMAL = re.compile(r"-?[0-9]{1,18}")


def _minutes_field(parent: Mapping[str, Any], path: str, key: str,
                   problems: list[str]) -> int | None:
    """An integer field read as Java's Jackson reads an `int`: a JSON integer or a string of
    decimal digits; anything else is recorded in `problems` and reads as missing."""
    value: object = parent.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    problems.append(f"{path}.{key} must be an integer, got {_shown(value)}: read as unset")
    return None


def _sub_mapping(parent: Mapping[str, Any], path: str, key: str,
                 problems: list[str]) -> Mapping[str, Any] | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        where = f"{path}.{key}" if path else key
        problems.append(f"{where} must be an object, got {type(value).__name__}: read as unset")
        return None
    return value


def parse_lifetime(obj: Mapping[str, Any]) -> Lifetime:
    """The Session limits of an AppDefinition: spec.timeout and spec.monitor. Never raises."""
    meta = _mapping(obj.get("metadata"))
    problems: list[str] = []
    spec = _sub_mapping(obj, "", "spec", problems) or {}
    timeout = _minutes_field(spec, "spec", "timeout", problems)
    monitor = _sub_mapping(spec, "spec", "monitor", problems)
    port: int | None = None
    tracker: ActivityTracker | None = None
    if monitor is not None:
        port = _minutes_field(monitor, "spec.monitor", "port", problems)
        if port is not None and not 0 < port < 65536:
            problems.append(f"spec.monitor.port must be a TCP port (1-65535), got "
                            f"{_shown(port)}: read as unset")
            port = None
        block = _sub_mapping(monitor, "spec.monitor", "activityTracker", problems)
        if block is not None:
            path = "spec.monitor.activityTracker"
            tracker = ActivityTracker(
                timeout_after=_minutes_field(block, path, "timeoutAfter", problems),
                notify_after=_minutes_field(block, path, "notifyAfter", problems))
    return Lifetime(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        timeout=timeout, monitor_port=port, tracker=tracker, problems=tuple(problems),
        uid=str(meta.get("uid") or ""),
        spec_name=spec_name if isinstance(spec_name := spec.get("name"), str) else "")


def _deployment_error(
    image: str, pull_policy: Any, run_as_user: int | None, port: int,
    resources: Mapping[str, str | None],
) -> str | None:
    """What of the spec the API server (or the pod) would refuse in an instance's Deployment.

    These fields go verbatim into every Deployment (builders._deployment_spec); a value found
    bad only when the Deployments are re-created after a spec change leaves the pool empty
    and failing forever, so it is refused here, before anything is deleted.
    """
    if any(ch.isspace() or not ch.isprintable() for ch in image):
        return "spec.image must not contain whitespace or control characters"
    if pull_policy not in _PULL_POLICIES:
        return (f"spec.imagePullPolicy must be one of {', '.join(_PULL_POLICIES)}, "
                f"got {_shown(pull_policy)}")
    if run_as_user is not None and not 0 <= run_as_user <= _MAX_USER_ID:
        return (f"spec.uid (the pod's runAsUser) must be between 0 and {_MAX_USER_ID}, "
                f"got {_shown(run_as_user)}")
    if port == v.OAUTH2_PROXY_PORT:
        return (f"spec.port must not be {v.OAUTH2_PROXY_PORT}: the oauth2-proxy in the same "
                "pod listens there")
    values = {}
    for key, text in resources.items():
        if text is None:
            continue
        if (error := quantity_error(text)) is not None:
            return f"spec.{key} {error}, got {_shown(text)}"
        value = parse_quantity(text)
        assert value is not None
        if value < 0:
            return f"spec.{key} must not be negative, got {_shown(text)}"
        values[key] = value
    for request, limit in (("requestsCpu", "limitsCpu"), ("requestsMemory", "limitsMemory")):
        if request in values and limit in values and values[request] > values[limit]:
            return (f"spec.{request} ({_shown(resources[request])}) must not exceed "
                    f"spec.{limit} ({_shown(resources[limit])}): Kubernetes refuses a "
                    "container whose request is above its limit")
    return None


def _generation(value: Any) -> int:
    """metadata.generation (set by the API server, so an int; 1 if anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _opt_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def parse_instance_id(raw: object) -> int | None:
    """The id an instance-id annotation names, or None when it names none.

    Only plain ASCII decimals without a leading zero, at most 9 digits, are ids: str.isdigit()
    also accepts '²' and other Unicode digits that int() refuses, and int() refuses more than
    4300 digits; either would raise for every job that reads the namespace's Sessions. A value
    that is no id is not obeyed (pool-spec §4: the owner references decide who holds what).
    """
    if isinstance(raw, str) and _INSTANCE_ID.fullmatch(raw):
        return int(raw)
    return None


def _str_field(spec: Mapping[str, Any], key: str) -> tuple[str, str | None]:
    """A string field of a Session's spec, and what is wrong with it if it is not a string."""
    value = spec.get(key)
    if value is None or isinstance(value, str):
        return value or "", None
    return "", f"spec.{key} must be a string, got {type(value).__name__}"


def parse_session(obj: Mapping[str, Any]) -> Session:
    """A Session as observed; validity is a separate question (``session_error``).

    Never raises, whatever the object holds: the cache parses every Session of a namespace
    and every job reads them, so one that raised would stop the whole namespace. What is
    malformed is recorded in ``Session.malformed`` and makes the Session an error by itself.
    """
    meta = _mapping(obj.get("metadata"))
    raw_spec = obj.get("spec")
    spec = _mapping(raw_spec)
    annotations = {str(k): val for k, val in _mapping(meta.get("annotations")).items()
                   if isinstance(val, str)}
    status_obj = _mapping(obj.get("status"))
    status = status_obj.get("operatorStatus")
    message = status_obj.get("operatorMessage")
    problems = [] if raw_spec is None or isinstance(raw_spec, Mapping) else [
        f"spec must be an object, got {type(raw_spec).__name__}"]
    appdef, appdef_problem = _str_field(spec, "appDefinition")
    if appdef and appdef_problem is None and (error := object_name_error(appdef)) is not None:
        # Bounded by the grammar of the AppDefinition's metadata.name: the reference goes into
        # work keys ("instance/<ns>/<appdef>/<k>", where a '/' makes a key nobody can parse)
        # and into API paths. A Session naming no possible AppDefinition is an error by
        # itself, and its reference is dropped so that nothing is built from it.
        appdef_problem = f"spec.appDefinition must name an AppDefinition: it {error}"
        appdef = ""
    user, user_problem = _str_field(spec, "user")
    problems += [p for p in (appdef_problem, user_problem) if p]
    return Session(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        uid=str(meta.get("uid") or ""),
        appdef=appdef,
        user=user,
        created=str(meta.get("creationTimestamp") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        instance_id=parse_instance_id(annotations.get(v.ANNOTATION_INSTANCE_ID)),
        # The controller owns the status and rewrites it; a mangled one reads as NEW.
        status=status if isinstance(status, str) and status else v.STATUS_NEW,
        message=message if isinstance(message, str) else "",
        annotations=annotations,
        resource_version=str(meta.get("resourceVersion") or ""),
        malformed="; ".join(problems) or None,
        url=url if isinstance(url := status_obj.get("url"), str) else "",
        error=error if isinstance(error := status_obj.get("error"), str) else "",
        secret=secret if isinstance(secret := spec.get("sessionSecret"), str) else "",
        last_activity=_epoch_ms(status_obj.get("lastActivity")),
        api_version=theia_api_version(obj, v.SESSION_API_VERSION),
    )


#: A Theia Cloud apiVersion as the API server writes it into an object it returns.
_THEIA_API_VERSION = re.compile(re.escape(v.GROUP) + r"/v[1-9][0-9]?(?:(?:alpha|beta)[1-9][0-9]?)?")
#: At most this many sidecars are read (the fork's chart runs one per language server).
MAX_SIDECARS = 16


def theia_api_version(obj: Mapping[str, Any], default: str) -> str:
    """The object's own apiVersion when it is a Theia Cloud one (the version the cluster
    served it at), else `default`: a value that is no apiVersion is never copied into an owner
    reference, where it would leave the garbage collector unable to resolve the owner."""
    raw = obj.get("apiVersion")
    return raw if isinstance(raw, str) and _THEIA_API_VERSION.fullmatch(raw) else default


def _sidecar_names(raw: object) -> tuple[str, ...] | Invalid:
    """spec.sidecars (v1beta11): the entries' names, held to the fork's CRD grammar and count.
    Absent (v1beta10 and older, or none declared): ()."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_SIDECARS:
        return Invalid(f"spec.sidecars must be a list of at most {MAX_SIDECARS} objects, got "
                       f"{_shown(raw)}")
    names: list[str] = []
    for i, entry in enumerate(raw):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not _SPEC_NAME.fullmatch(name) or len(name) > 63:
            return Invalid(f"spec.sidecars[{i}].name must match ^[a-z0-9A-Z-_]+$ (at most 63 "
                           f"characters), got {_shown(name)}")
        names.append(name)
    return tuple(names)


def _epoch_ms(value: object) -> int | None:
    """An epoch-ms field (Java's `long`): a non-negative int, else None (unset or unusable)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def session_error(session: Session) -> str | None:
    """Why a Session must not get an instance (status ERROR), or None when it may."""
    return session.problem


def _problem_of(session: Session) -> str | None:
    """`session_error`, computed (once per Session: `Session.problem`)."""
    if session.malformed:
        return session.malformed
    if not session.appdef:
        return "spec.appDefinition is empty"
    if not session.user:
        return "spec.user is empty: an instance is only handed to a named user"
    if (rule := email_error(session.user)) is not None:
        # The grammar is in warmpool.pool.emails; the message names the rule, not the address.
        return f"spec.user must be exactly one e-mail address: {rule}"
    return None
