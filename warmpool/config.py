"""One configuration story for every command: flags, then environment, then defaults.

  Kubernetes   --kubeconfig    KUBECONFIG            in-cluster service account, else
                                                     ~/.kube/config
  context      --context                             the kubeconfig's current-context
  namespace    -n/--namespace  WARMPOOL_NAMESPACE    the kubeconfig context's namespace (or the
                                                     service account's), else `default`
  Redis        --redis-url     WARMPOOL_REDIS_URL    redis://127.0.0.1:6379/0
  queue layout                 WARMPOOL_QUEUE_<FIELD> (QueueSettings.from_env, e.g. _PREFIX,
                                                     _NAMESPACE, _QUEUE_NAME), as the workers

Every setting, with its grammar, default and the roles that read it: docs/configuration.md
(generated from warmpool/settings_registry.py); `warmpool config` shows the effective values.

No command starts a Redis of its own: inspecting an empty server that happens to be there
would show a wrong, quiet queue, and a worker or scheduler on a Redis of its own would serve
a queue nobody else sees. The inspection commands fall back to the default URL and, when
nothing answers, say so and exit 4; `warmpool worker` and `warmpool scheduler` need a URL
(`require_redis_url`, exit 4 without one). Only `warmpool demo` runs an embedded Redis.
A server that refuses the credentials exits 5, and one that answers but is not a Kubernetes
API server (or not Redis) exits 6 (errors.py).

Everything that can go wrong here becomes an `Unreachable` or `BadValue` error with the source
of the value in it ("from $KUBECONFIG"), so a person knows which setting to fix.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from warmpool.errors import (
    BadValue,
    CliError,
    CredentialsRefused,
    Unreachable,
    Unusable,
    WrongServer,
    one_line,
)
from warmpool.settings_registry import registered

if TYPE_CHECKING:
    import redis

    from warmpool.kube.api import Kube
    from warmpool.queue.settings import QueueSettings

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

ENV_KUBECONFIG = registered("KUBECONFIG")
ENV_NAMESPACE = registered("WARMPOOL_NAMESPACE")
ENV_REDIS_URL = registered("WARMPOOL_REDIS_URL")
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_NAMESPACE = "default"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LOCAL_CLUSTER_HINT = 'for the local cluster: eval "$(warmpool cluster env)"'
#: How long `warmpool worker` and `warmpool scheduler` wait at start for Redis and the API
#: server to answer before they give up with one line (exit 4).
STARTUP_WAIT = 10.0


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


# --- Kubernetes -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class KubeTarget:
    """Where the API server's address and credentials come from."""

    in_cluster: bool
    path: str | None  # kubeconfig file(s), os.pathsep-separated like KUBECONFIG
    source: str  # for messages: "--kubeconfig", "$KUBECONFIG", "in-cluster", "~/.kube/config"


def _in_cluster(environ: Mapping[str, str], sa_dir: Path) -> bool:
    return bool(_env(environ, "KUBERNETES_SERVICE_HOST")) and (sa_dir / "token").is_file()


def resolve_kube_target(
    flag: str | None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    sa_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeTarget:
    env = os.environ if environ is None else environ
    for value, source in ((flag, "--kubeconfig"), (_env(env, ENV_KUBECONFIG), "$KUBECONFIG")):
        if not value:
            continue
        paths = [p for p in value.split(os.pathsep) if p]
        if not any(Path(p).expanduser().is_file() for p in paths):
            raise Unreachable(f"kubeconfig {value} (from {source}) does not exist; point "
                              f"{source.lstrip('$')} at your cluster's kubeconfig "
                              f"({LOCAL_CLUSTER_HINT})")
        return KubeTarget(False, value, source)
    if _in_cluster(env, sa_dir):
        return KubeTarget(True, None, "in-cluster")
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        return KubeTarget(False, str(default), "~/.kube/config")
    raise Unreachable("no Kubernetes configuration: KUBECONFIG is unset, ~/.kube/config does not "
                      "exist and this is not a pod; set KUBECONFIG or pass --kubeconfig "
                      f"({LOCAL_CLUSTER_HINT})")


def context_namespace(target: KubeTarget, sa_dir: Path = SERVICE_ACCOUNT_DIR,
                      context: str | None = None) -> str | None:
    """The namespace of `context` (default: the current context; in a pod: the service
    account's), if any. `BadValue` if `context` is not in the kubeconfig, or asked for in a
    pod, where there is no kubeconfig to choose it from."""
    if target.in_cluster:
        if context is not None:
            raise BadValue(f"--context {context}: there is no kubeconfig to choose it from (in "
                           "a pod, with its service account); pass --kubeconfig too")
        try:
            return (sa_dir / "namespace").read_text().strip() or None
        except OSError:
            return None
    import yaml
    from kubernetes.config import ConfigException, list_kube_config_contexts

    try:
        contexts, current = list_kube_config_contexts(config_file=target.path)
    except (ConfigException, OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        if context is None:
            return None  # connecting will say what is wrong with the file
        contexts, current = [], None
    if context is not None:
        names = [str(c.get("name")) for c in contexts or [] if isinstance(c, dict)]
        if context not in names:
            raise BadValue(f"--context {context}: no such context in the kubeconfig "
                           f"{target.path} (from {target.source}); its contexts: "
                           f"{', '.join(names) or 'none'}")
        current = next(c for c in contexts if isinstance(c, dict) and c.get("name") == context)
    return ((current or {}).get("context") or {}).get("namespace") or None


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def resolve_namespace(
    flag: str | None, target: KubeTarget | None, environ: Mapping[str, str] | None = None,
    context: str | None = None,
) -> str:
    env = os.environ if environ is None else environ
    from_context = context_namespace(target, context=context) if target else None
    for value, source in ((flag, "--namespace"), (_env(env, ENV_NAMESPACE), "$WARMPOOL_NAMESPACE")):
        if value:
            if len(value) > 63 or not _DNS_LABEL.match(value):
                raise BadValue(f"namespace {value!r} (from {source}) is not a valid Kubernetes "
                               "namespace name (lower-case letters, digits and '-')")
            return value
    return from_context or DEFAULT_NAMESPACE


def _quiet_tls_warnings(verify_ssl: bool) -> None:
    """A kubeconfig with insecure-skip-tls-verify (the local cluster) chose that; a warning
    per request would bury the output."""
    if not verify_ssl:
        import urllib3

        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)


def _connection_reason(exc: BaseException) -> str:
    reason = str(getattr(exc, "reason", None) or exc)
    return reason.split("): ", 1)[-1]  # drop urllib3's "HTTPSConnection(host=...)" prefix


def _refusal(exc: Any, host: str, target: KubeTarget) -> CliError:
    """What an HTTP error answer to a request every API server serves says: credentials
    refused (401/403), a server not ready (5xx, 429: wait), or a server that is not a
    Kubernetes API server at all (any other answer: the address is wrong)."""
    status, reason = exc.status, one_line(str(exc.reason or ""), 80)
    where = f"at {host} (kubeconfig from {target.source})"
    if status in (401, 403):
        return CredentialsRefused(
            f"the Kubernetes API server {where} refused the credentials: {status} {reason}; "
            "renew them, or point KUBECONFIG/--kubeconfig at a kubeconfig whose user may use "
            "the cluster")
    if status is None or status == 429 or status >= 500:
        return Unreachable(f"the Kubernetes API server {where} is not ready: {status} "
                           f"{reason}; try again, or check the control plane")
    kind = (getattr(exc, "headers", None) or {}).get("Content-Type") or "no content type"
    return WrongServer(
        f"the server {where} is not a Kubernetes API server: it answered {status} {reason} "
        f"({kind}) to GET /apis; point the kubeconfig's cluster.server at the API server")


def _check_is_kubernetes(api: Any, host: str, target: KubeTarget) -> None:
    """GET /apis, with the credentials, parsed here: a web server or a proxy answering 200
    with a page of its own is told apart from an API server by the body, not the status.
    (The dynamic client's discovery may come from its cache file, and /apis answers only
    authenticated users, so this checks the credentials too.)"""
    from kubernetes import client as kclient

    resp: Any = kclient.ApisApi(api).get_api_versions(_preload_content=False,
                                                      _request_timeout=(5.0, 10.0))
    try:
        body = resp.data
        kind = resp.headers.get("Content-Type") or "no content type"
    finally:
        resp.release_conn()
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("kind") != "APIGroupList":
        raise WrongServer(
            f"the server at {host} (kubeconfig from {target.source}) is not a Kubernetes API "
            f"server: GET /apis answered {resp.status} with {kind}, not an APIGroupList; point "
            "the kubeconfig's cluster.server at the API server")


def connect_kube(target: KubeTarget, context: str | None = None) -> Kube:
    """A `Kube` on the target (with `context`: that kubeconfig context, not the current one);
    the API server has answered as one, and accepted the credentials, when this returns."""
    import urllib3
    import yaml
    from kubernetes import client as kclient
    from kubernetes import config as kconfig
    from kubernetes.client.rest import ApiException

    from warmpool.kube.api import Kube

    try:
        if target.in_cluster:
            cfg = kclient.Configuration()
            kconfig.load_incluster_config(client_configuration=cfg)
            api = kclient.ApiClient(cfg)
        else:
            api = kconfig.new_client_from_config(config_file=target.path, context=context)
    except (kconfig.ConfigException, OSError, KeyError, TypeError, ValueError,
            yaml.YAMLError) as exc:
        what = ("the in-cluster service account" if target.in_cluster
                else f"the kubeconfig {target.path} (from {target.source})")
        raise Unusable(f"cannot use {what}: {one_line(str(exc), 200)}; fix it or point "
                          "KUBECONFIG/--kubeconfig at another kubeconfig") from exc
    host = api.configuration.host
    _quiet_tls_warnings(bool(api.configuration.verify_ssl))
    try:
        _check_is_kubernetes(api, host, target)
        return Kube(api)  # its discovery runs now: after the check, so its errors are plain
    except urllib3.exceptions.HTTPError as exc:
        raise Unreachable(f"cannot reach the Kubernetes API server at {host} (kubeconfig from "
                          f"{target.source}): {_connection_reason(exc)}; start it, or point "
                          "KUBECONFIG/--kubeconfig at one that runs") from exc
    except ApiException as exc:  # the dynamic client's errors are ApiExceptions too
        raise _refusal(exc, host, target) from exc


def check_namespaces(kube: Kube, namespaces: list[str]) -> None:
    """`NotFound` for a namespace that does not exist: watching it would wait for ever on an
    empty pool. A user allowed only inside the namespace (the Role in deploy/) cannot read the
    Namespace object; then the namespace is taken as given."""
    from warmpool.errors import NotFound
    from warmpool.kube.api import KubeError

    for name in namespaces:
        try:
            found = kube.get("v1", "Namespace", "", name)
        except KubeError as exc:
            if exc.status == 403:
                continue
            raise
        if found is None:
            raise NotFound(f"namespace {name} does not exist (from --namespace or "
                           f"${ENV_NAMESPACE}); create it, or watch another")


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """What a Kubernetes command was asked to use, resolved lazily (so `--help` never fails)."""

    kubeconfig: str | None
    namespace_flag: str | None
    context: str | None = None

    def target(self) -> KubeTarget:
        return resolve_kube_target(self.kubeconfig)

    def connect(self) -> tuple[Kube, str]:
        """(Kube, namespace); the namespace (and the context) are checked before connecting."""
        target = self.target()
        namespace = resolve_namespace(self.namespace_flag, target, context=self.context)
        return connect_kube(target, self.context), namespace


# --- Redis ----------------------------------------------------------------------------------

def resolve_redis_url(flag: str | None, environ: Mapping[str, str] | None = None
                      ) -> tuple[str, str]:
    """(url, where it came from); never starts a server."""
    env = os.environ if environ is None else environ
    if flag:
        return flag, "--redis-url"
    if value := _env(env, ENV_REDIS_URL):
        return value, "$WARMPOOL_REDIS_URL"
    return DEFAULT_REDIS_URL, "the default"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")
#: What may follow a URL's userinfo: a host list (Sentinel URLs name several, with ports,
#: IPv6 in brackets), then a path or query or nothing. A password's own text rarely looks so.
_AFTER_USERINFO = re.compile(r"[A-Za-z0-9.\-\[\]:,_%]*(?:[/?#].*)?", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"([?&](?:sentinel_)?password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL without its passwords, for messages and output: the one in the user part
    (any scheme, in any case, redis+sentinel:// included) and `password=` /
    `sentinel_password=` in the query, where a Sentinel URL carries the Sentinels' password.

    Bounded parse, not a regular expression over the whole URL: a password may hold an
    unencoded `@`, `/`, `:` or `?` (redis-py would misread such a URL, but the text must not
    leak). The userinfo ends at the last `@` after which only a host list and a path or query
    follow (else at the last `@` before the first `?`); everything after its first `:` is
    hidden, and a userinfo without `:` (which some clients take for a password) entirely."""
    scheme, sep, rest = url.partition("://")
    if sep and _SCHEME.fullmatch(scheme) and "@" in rest:
        at = rest.rfind("@")
        if _AFTER_USERINFO.fullmatch(rest[at + 1:]) is None:
            query = rest.find("?")
            at = rest.rfind("@", 0, query) if query >= 0 else at
        if at >= 0:
            user, colon, _ = rest[:at].partition(":")
            shown = f"{user}:***" if colon else "***"
            rest = f"{shown}@{rest[at + 1:]}"
        url = f"{scheme}://{rest}"
    return _QUERY_PASSWORD.sub(r"\1***", url)


def require_redis_url(value: str | None, command: str) -> str:
    """The URL a worker or scheduler runs on (`--redis-url`, or $WARMPOOL_REDIS_URL through
    click), or `Unreachable` (exit 4): one without a URL used to start an embedded server of
    its own, or take whatever answered on 127.0.0.1:6379, and so could work a queue the other
    processes never see while looking healthy."""
    if value and value.strip():
        return value
    raise Unreachable(f"no Redis URL: set {ENV_REDIS_URL} or pass --redis-url (e.g. "
                      f"redis://redis:6379/0); `warmpool {command}` never starts a Redis of "
                      "its own (the embedded one is for `warmpool demo`)")


def queue_settings(url: str, environ: Mapping[str, str] | None = None,
                   queue_name: str | None = None) -> QueueSettings:
    """The workers' key layout (WARMPOOL_QUEUE_* from the environment) on `url`; a bad value
    is a `BadValue` (exit 2, one line), in every command and role alike."""
    from warmpool.queue.settings import QueueSettings

    try:
        return QueueSettings.from_env(environ, redis_url=url, queue_name=queue_name)
    except (TypeError, ValueError) as exc:
        raise BadValue(f"bad queue setting in the environment (WARMPOOL_QUEUE_*): {exc}") from exc


def connect_redis(url: str, source: str) -> redis.Redis:
    """A client on `url` that has answered PING, or `Unreachable` saying what to do."""
    import redis as redis_lib
    from redis.sentinel import MasterNotFoundError

    from warmpool.queue.redis_conn import connect

    shown = redact_url(url)
    try:
        # a command waits out a few seconds of a Sentinel failover, not a worker's budget
        client = connect(url, socket_connect_timeout=3.0, socket_timeout=10.0,
                         failover_wait=5.0)
    except (ValueError, redis_lib.RedisError) as exc:  # a malformed URL
        raise BadValue(f"bad Redis URL {shown} (from {source}): {exc}; use "
                       "redis://[:password@]host[:port][/db], rediss://..., "
                       "unix:///path/to/socket or "
                       "redis+sentinel://host:26379[,host2:26379]/service[/db]") from exc
    try:
        client.ping()
    except redis_lib.AuthenticationError as exc:
        raise CredentialsRefused(f"Redis at {shown} (from {source}) refused the credentials: "
                                 f"{exc}; put the password in the URL "
                                 "(redis://:PASSWORD@host:port)") from exc
    except redis_lib.exceptions.InvalidResponse as exc:
        raise WrongServer(f"the server at {shown} (from {source}) does not speak Redis: "
                          f"{one_line(str(exc), 80)}; is that the Redis port?") from exc
    except MasterNotFoundError as exc:  # its text is the repr of every Sentinel client
        raise Unreachable(f"no Sentinel of {shown} (from {source}) names a primary: none "
                          "answers, or none monitors that service; check the hosts and the "
                          "service name (sentinel monitor <service> ...)") from exc
    except (redis_lib.ConnectionError, redis_lib.TimeoutError, OSError) as exc:
        raise Unreachable(f"nothing answers at {shown} (from {source}): "
                          f"{one_line(str(exc), 160).rstrip('.')}; start Redis there, or set "
                          "WARMPOOL_REDIS_URL (or --redis-url) to the queue's Redis") from exc
    except redis_lib.RedisError as exc:
        raise Unreachable(f"Redis at {shown} (from {source}) failed PING: {exc}") from exc
    return client


def patiently(attempt: Callable[[], T], seconds: float = STARTUP_WAIT) -> T:
    """`attempt()`, retried for up to `seconds` while a server it needs does not answer: a
    service started together with its Redis or its API server (compose, a pod during a control
    plane upgrade) may come up first. Everything else fails at once, as one `CliError`: a
    malformed value, refused credentials, a namespace that does not exist."""
    import time

    from warmpool.errors import translate

    deadline = time.monotonic() + seconds
    while True:
        try:
            return attempt()
        except Exception as exc:
            error = translate(exc)
            if type(error) is not Unreachable or time.monotonic() >= deadline:
                raise error from exc
        time.sleep(0.5)


def check_servers(redis_url: str | None, *, kube: bool, kubeconfig: str | None = None,
                  namespaces: Sequence[str] = (),
                  kinds: Sequence[tuple[str, str, str]] = ()) -> None:
    """What `warmpool worker` and `warmpool scheduler` check before starting anything, so a
    configuration error ends in one line (exit 2, 3 or 4) and not in a loop of failing jobs or
    watches: Redis answers; with `kube`, the API server answers and accepts the credentials,
    the namespaces exist and every one of `kinds` ((apiVersion, kind, advice):
    `warmpool.kube.kinds.required`) is served. Servers still coming up get `STARTUP_WAIT`
    seconds. A Redis whose maxmemory-policy evicts keys is reported loudly, not refused
    (`warmpool.queue.eviction` says why)."""
    if redis_url is not None:
        from warmpool.queue.eviction import warn_if_evicting

        server = patiently(lambda: connect_redis(redis_url, "--redis-url or $WARMPOOL_REDIS_URL"))
        try:
            warn_if_evicting(server)
        finally:
            server.close()
    if kube:
        target = resolve_kube_target(kubeconfig)
        client = patiently(lambda: connect_kube(target))
        patiently(lambda: check_namespaces(client, list(dict.fromkeys(namespaces))))
        from warmpool.errors import Unreachable
        from warmpool.pool import lines
        from warmpool.pool import vocabulary as v

        for api_version, kind, advice in kinds:
            if client.serves(api_version, kind):
                continue
            if api_version.startswith(f"{v.GROUP}/") and kind in lines.KNOWN:
                # Theia Cloud's kinds are read at the cluster's version: say which it serves.
                raise Unreachable(lines.missing_advice(kind, *client.theia_group()))
            raise Unreachable(f"the Kubernetes API serves no {kind} ({api_version}): {advice}")


@dataclass(frozen=True, slots=True)
class RedisConfig:
    redis_url: str | None

    def connect(self) -> tuple[redis.Redis, QueueSettings, str]:
        """(client, settings, shown url) for a server that answered."""
        url, source = resolve_redis_url(self.redis_url)
        settings = queue_settings(url)
        return connect_redis(url, source), settings, redact_url(url)


# --- options --------------------------------------------------------------------------------

def kube_options(func: F) -> F:
    """`--kubeconfig`, `--context` and `-n/--namespace`, handed to the command as
    `kube: KubeConfig`."""

    @functools.wraps(func)
    def wrapper(*args: Any, kubeconfig: str | None, context: str | None,
                namespace_flag: str | None, **kwargs: Any) -> Any:
        return func(*args, kube=KubeConfig(kubeconfig, namespace_flag, context), **kwargs)

    wrapper = click.option(
        "--namespace", "-n", "namespace_flag", default=None, metavar="NS",
        help=f"Namespace of the AppDefinitions. [env: {ENV_NAMESPACE}; default: the kubeconfig "
             "context's namespace (in a pod: its own), else 'default']")(wrapper)
    wrapper = click.option(
        "--context", default=None, metavar="NAME",
        help="The kubeconfig context to use (its cluster, user and namespace). [default: "
             "the kubeconfig's current-context]")(wrapper)
    wrapper = click.option(
        "--kubeconfig", default=None, metavar="PATH",
        help=f"Kubeconfig file. [env: {ENV_KUBECONFIG}; default: the in-cluster service "
             "account, else ~/.kube/config]")(wrapper)
    return wrapper  # type: ignore[return-value]


def redis_options(func: F) -> F:
    """`--redis-url`, handed to the command as `redis_config: RedisConfig`."""

    @functools.wraps(func)
    def wrapper(*args: Any, redis_url: str | None, **kwargs: Any) -> Any:
        # `warmpool queue --redis-url X show KEY`: a group's flag holds for its sub-commands.
        meta = click.get_current_context().meta
        if redis_url is None:
            redis_url = meta.get("warmpool.redis_url")
        else:
            meta["warmpool.redis_url"] = redis_url
        return func(*args, redis_config=RedisConfig(redis_url), **kwargs)

    wrapper = click.option(
        "--redis-url", default=None, metavar="URL",
        help=f"The work queue's Redis: redis://[:password@]host[:port][/db], rediss://..., "
             f"unix:///path. [env: {ENV_REDIS_URL}; default: {DEFAULT_REDIS_URL}; never "
             "starts one]. Key layout from WARMPOOL_QUEUE_PREFIX, WARMPOOL_QUEUE_NAMESPACE, "
             "WARMPOOL_QUEUE_QUEUE_NAME, as for the workers.")(wrapper)
    return wrapper  # type: ignore[return-value]

