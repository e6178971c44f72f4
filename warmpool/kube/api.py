"""The controller's window on the Kubernetes API: plain dicts over the official client.

Decisions are computed on dicts exactly as the API server returns them, so one thin layer here
turns calls into dicts and API errors into the few outcomes the controller distinguishes
(not found, conflict, everything else), and nothing else in the code base imports the client.

The official DynamicClient finds each kind's path (discovery) and streams watches; a request
itself goes straight to the client's own connection pool (`Kube._send`), with its
configuration's credentials. Why: every request through the DynamicClient walked its body
and parameters for serialization, built its query from a table of every parameter any verb
takes, and parsed its URL again: about as much CPU as the HTTP exchange itself, and 12 % of a
worker's CPU under churn (issue #28's profile), spent once for every one of a claim's writes.
"""

from __future__ import annotations

import builtins
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import config as kube_config
from kubernetes import watch as kube_watch
from kubernetes.client import ApiClient, Configuration, VersionApi
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, ResourceNotFoundError

from warmpool.kube.events import Cause, CreateEvent, Recorded, event_name, plan_event
from warmpool.pool import lines
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import meta_of, namespace_of

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
#: What a metadata-only LIST and WATCH ask for (client-go's metadata client, the garbage
#: collector's informers): each object as a PartialObjectMetadata, its metadata alone. For a
#: kind whose reader keeps nothing but metadata, the server sends (and the reader decodes) a
#: fraction of the object. Served by every API server from 1.15, for the answer to a create,
#: a patch or a delete as well (the API server's handlers all transform their response by
#: the Accept header).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
Obj = dict[str, Any]


def as_kind(obj: Obj, api_version: str, kind: str) -> Obj:
    """A metadata-only object (the server says PartialObjectMetadata: a metadata-only list's
    or watch's item, a metadata-only write's answer) typed as the object it describes, since
    readers key on `kind`. The one place such objects are typed."""
    obj["apiVersion"], obj["kind"] = api_version, kind
    return obj


class Conflict(Exception):
    """409: the object changed since it was read (or already exists). Re-read and decide again."""


class Gone(Exception):
    """410 on a watch or list continuation: the resourceVersion is too old; relist."""


class KubeError(Exception):
    """Any other API failure, with the server's status and message kept for the person."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"Kubernetes API error {status}: {message}")
        self.status = status


def _wrap(exc: DynamicApiError) -> Exception:
    if isinstance(exc, ConflictError):
        return Conflict(exc.summary())
    if exc.status == 410:
        return Gone(exc.summary())
    return KubeError(exc.status, exc.summary())


#: The longest refusal message kept (`_refusal`), in characters.
REFUSAL_CHARS = 1000


def _refusal(status: int, data: bytes, reason: str | None) -> Exception:
    """What an answer of `status` >= 400 raises: the server's message (its Status' `message`,
    else the body as sent, else the HTTP reason), as the DynamicClient's errors said it."""
    message = ""
    try:
        status_body = json.loads(data) if data else None
    except ValueError:
        status_body = None
    if isinstance(status_body, dict) and isinstance(status_body.get("message"), str):
        message = status_body["message"]
    elif data:
        message = data.decode("utf-8", "replace")
    else:
        message = f"{status} Reason: {reason}"
    # What answered may be a proxy or a load balancer (an HTML page of any size): the
    # message goes into logs, events and statuses, so it is cut.
    if len(message) > REFUSAL_CHARS:
        message = message[:REFUSAL_CHARS - 1] + "…"
    if status == 409:
        return Conflict(message)
    if status == 410:
        return Gone(message)
    return KubeError(status, message)


def not_served(exc: BaseException) -> bool:
    """Whether `exc` says the API server does not serve that kind (its CRD is not installed):
    discovery found no such resource, or the server answered 404 to a list."""
    return isinstance(exc, ResourceNotFoundError) or (
        isinstance(exc, KubeError) and exc.status == 404)


#: Connections kept open to the API server per client. The library's default (5 per CPU)
#: is below what a worker sends at once (8 threads, each sending a plan's independent writes
#: together): every request over it opened a new TLS connection and threw it away after.
CONNECTIONS = 64


#: A lost path to the API server (a dead route, a host cut off: packets dropped, no reset) is
#: noticed within this many seconds, whatever the connection was doing: idle (a watch between
#: events) by TCP keep-alives (a probe after 10 s idle, every 5 s, given up after 3), waiting
#: for the answer to a request that was never acknowledged by TCP_USER_TIMEOUT. Without them
#: a watch on a dead path waited for its read timeout (its server-side timeout + 30 s, up to
#: 630 s) and an unacknowledged request for the kernel's ~15 minutes of retransmissions. A
#: path that acknowledges and never answers (a stalled proxy) is the read timeouts' to notice.
DEAD_PATH_SECONDS = 25


def socket_options() -> list[tuple[int, int, int]]:
    """urllib3's own options (no Nagle) and the dead-path bounds, where the platform has them."""
    import socket

    import urllib3

    options = list(urllib3.connection.HTTPConnection.default_socket_options)
    options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", DEAD_PATH_SECONDS * 1000)):
        if (opt := getattr(socket, name, None)) is not None:
            options.append((socket.IPPROTO_TCP, opt, value))
    return options


def connect(kubeconfig: str | None = None) -> ApiClient:
    """An API client from a kubeconfig file, else in-cluster config (never the global default)."""
    cfg = Configuration()
    cfg.connection_pool_maxsize = CONNECTIONS
    cfg.socket_options = socket_options()
    # new_client_from_config is unannotated; it returns ApiClient(configuration=...).
    client: ApiClient
    if kubeconfig:
        client = kube_config.new_client_from_config(config_file=kubeconfig,
                                                    client_configuration=cfg)
        return client
    try:
        kube_config.load_incluster_config(client_configuration=cfg)
    except kube_config.ConfigException:
        client = kube_config.new_client_from_config(client_configuration=cfg)
        return client
    return ApiClient(cfg)


#: Reads and writes of one Event's count before giving up (each retry follows another
#: writer's success, so only a storm of writers for one cause exhausts them).
_EVENT_ATTEMPTS = 4

# s beyond a watch's server-side timeout before the client gives up reading from it
WATCH_READ_MARGIN = 30

#: Seconds a client keeps its configuration's bearer token before reading it again
#: (`Kube._credentials`).
CREDENTIALS_SECONDS = 10.0

#: (connect, read) seconds of every call but watches, unless a caller bounds it tighter.
REQUEST_TIMEOUT = (5.0, 60.0)


def bounded_timeout(limit: float, timeout: tuple[float, float] = REQUEST_TIMEOUT
                    ) -> tuple[float, float]:
    """`timeout` with each part at most `limit` seconds (at least 1): a call that must give
    up within a lease or a renew deadline. The read timeout bounds each wait for the next
    bytes, so a stalled link (connection open, nothing answered: a dead path behind a NAT,
    a silent middlebox) fails the call within `limit` instead of holding its thread."""
    bound = max(1.0, limit)
    return (min(timeout[0], bound), min(timeout[1], bound))


def _check_preconditions(kind: str, name: str, **preconditions: str | None) -> None:
    """Refuse a precondition asked for but empty: it would be sent as none at all."""
    empty = sorted(k for k, val in preconditions.items() if val == "")
    if empty:
        raise ValueError(f"{kind} {name}: empty {' and '.join(empty)} precondition (the "
                         "object was read without it): the write would not be guarded")


class Kube:
    """Get, list, create, merge-patch, delete and watch any kind, namespaced, as dicts."""

    def __init__(
        self, api_client: ApiClient, request_timeout: tuple[float, float] = REQUEST_TIMEOUT
    ) -> None:
        self.api_client = api_client
        self.dyn = DynamicClient(api_client)
        # (connect, read) seconds for every call but watches (which time out server-side): an
        # API server that drops packets must fail a job, not hang a worker thread forever.
        self.request_timeout = request_timeout
        self._timeout = urllib3.Timeout(connect=request_timeout[0], read=request_timeout[1])
        self._auth: tuple[float, tuple[str, str] | None] | None = None  # (read at, header)
        self._clock = time.monotonic  # when the credentials were read (tests inject theirs)
        self._resources: dict[tuple[str, str], Any] = {}
        self._events = Recorded()  # the Events this client wrote last (`event`)
        self._line: lines.TheiaLine | None = None
        self._line_lock = threading.Lock()
        self._date_seen: tuple[str, float] | None = None  # (Date, monotonic at arrival)

    def bounded(self, limit: float) -> Kube:
        """A client on the same connection whose every call gives up within `limit` seconds
        per wait (`bounded_timeout`): for calls that must end before a deadline."""
        bounded = Kube(self.api_client, bounded_timeout(limit, self.request_timeout))
        bounded._line = self._line  # the same cluster: the same line, not asked again
        return bounded

    # --- Theia Cloud's line ---------------------------------------------------------------

    def theia_group(self) -> tuple[list[str], dict[str, list[str]]]:
        """The theia.cloud group as the discovery API describes it: its versions in the API
        server's priority order (preferred first) and the kinds each serves; ([], {}) when the
        group is not served at all. Asked of the server each time (no discovery cache)."""
        try:
            group = self._get_path(f"/apis/{v.GROUP}")
        except KubeError as exc:
            if exc.status == 404:
                return [], {}
            raise
        versions = [str(gv.get("version")) for gv in group.get("versions") or []
                    if isinstance(gv, dict) and gv.get("version")]
        kinds: dict[str, list[str]] = {}
        for version in versions:
            listing = self._get_path(f"/apis/{v.GROUP}/{version}")
            kinds[version] = [str(r.get("kind")) for r in listing.get("resources") or []
                              if isinstance(r, dict) and "/" not in str(r.get("name", ""))]
        return versions, kinds

    def line(self) -> lines.TheiaLine | None:
        """The Theia Cloud line of this client's cluster (`warmpool.pool.lines`), read once
        and then kept: None while the cluster serves AppDefinition or Session at no version
        warmpool knows (asked again next time). A cluster whose Theia Cloud is upgraded to
        another line while warmpool runs needs warmpool restarted, as Theia Cloud's own
        operator does."""
        with self._line_lock:
            if self._line is None:
                self._line = lines.choose_line(*self.theia_group())
                if self._line is not None:
                    log.info("Theia Cloud line of %s: %s", self.api_client.configuration.host,
                             self._line.describe())
            return self._line

    def served_api_version(self, api_version: str, kind: str) -> str:
        """The apiVersion `kind` is sent at on this cluster: for Theia Cloud's AppDefinition
        and Session, the group's version of the cluster's line, whatever version the caller
        named (the vocabulary names warmpool's own, v1beta11); anything else as given. The
        one place a Theia Cloud version is chosen, so every read, watch and write of one
        cluster uses the same."""
        group, _, _ = api_version.rpartition("/")
        if group != v.GROUP or kind not in lines.KNOWN:
            return api_version
        line = self.line()
        version = line.version_of(kind) if line is not None else None
        if version is None:
            raise ResourceNotFoundError(
                f"the cluster serves no {kind} ({v.GROUP}) at a version warmpool reads "
                f"({', '.join(lines.KNOWN[kind])}); `warmpool scheduler` says what to do")
        return f"{group}/{version}"

    def _get_path(self, path: str) -> Obj:
        """GET a discovery document (`_send`: the client's credentials included)."""
        body = self._send("GET", path)
        return body if isinstance(body, dict) else {}

    def _res(self, api_version: str, kind: str) -> Any:
        api_version = self.served_api_version(api_version, kind)
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self.dyn.resources.get(api_version=api_version, kind=kind)
        return self._resources[key]

    def resolve(self, kinds: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Look up each (apiVersion, kind) now, so no job pays for it; the ones the server
        does not serve, returned (a job that needs one fails with the server's answer).

        Why: the dynamic client learns a kind from discovery the first time it is used, and a
        kind its discovery cache lacks sends it through every API group of the server, one
        GET each (17 on the test control plane, ~200 ms at 10 ms a request), on the thread
        of the job that used it. A worker's first claim paid that before its deciding write.
        """
        missing = []
        for api_version, kind in kinds:
            try:
                self._res(api_version, kind)
            except ResourceNotFoundError:
                missing.append((api_version, kind))
        return missing

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` of `api_version` (its CRD is installed)."""
        return not self.resolve([(api_version, kind)])

    def _send(
        self, method: str, path: str, query: builtins.list[tuple[str, str]] | None = None,
        body: Any = None, content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Obj:
        """One request on the client's connection pool; the answer as a dict (every answer of
        the API server here is a JSON object: the resource, a list, or a Status).

        As the official client sends it: its host, default headers (User-Agent) and
        credentials (`_credentials`), the pool's retries of a failed connection, and
        (connect, read) timeouts. An answer >= 400 raises (`_refusal`); a connection that
        fails raises urllib3's error, as before."""
        cfg = self.api_client.configuration
        headers = {**self.api_client.default_headers, "Accept": accept}
        credentials = self._credentials()
        if credentials is not None:
            headers[credentials[0]] = credentials[1]
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = cfg.host + path + (f"?{urlencode(query)}" if query else "")
        try:
            resp = self.api_client.rest_client.pool_manager.urlopen(
                method, url, body=data, headers=headers, timeout=self._timeout,
                redirect=False)
        except urllib3.exceptions.SSLError as exc:  # the client's ApiException(status=0)
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
        self._note_date(resp)
        if resp.status >= 400:
            if resp.status == 401:
                self._auth = None  # a token that expired or rotated: the next call reads anew
            raise _refusal(resp.status, resp.data, resp.reason)
        answer: Obj = json.loads(resp.data)
        return answer

    def _credentials(self) -> tuple[str, str] | None:
        """The bearer token header of the client's configuration, read at most once every
        `CREDENTIALS_SECONDS` (and again after a 401); None with client certificates alone.

        Why not on every request, as the official client does: its configuration's refresh
        hook (`refresh_api_key_hook`, set by the kubeconfig loader) assigns the host again,
        and that setter scans the whole process environment for proxy variables: 4 % of a
        worker's CPU under churn (issue #28's profile). Tokens rotate on a scale of minutes
        (a service account's projected token is renewed at 80 % of its hour; an exec
        plugin's carries its expiry, and the hook runs the plugin again once it passed), and
        client-go itself keeps a token file's contents for a minute."""
        now = self._clock()
        cached = self._auth
        if cached is None or now - cached[0] >= CREDENTIALS_SECONDS:
            bearer = self.api_client.configuration.auth_settings().get("BearerToken")
            header = ((str(bearer["key"]), str(bearer["value"]))
                      if bearer and bearer.get("value") else None)
            self._auth = cached = (now, header)
        return cached[1]

    def _path(self, api_version: str, kind: str, namespace: str | None,
              name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of a kind's collection or of one object (discovery says it)."""
        res = self._res(api_version, kind)
        if subresource:
            res = res.subresources[subresource]
        path: str = res.path(name=name, namespace=namespace)
        return path

    def _note_date(self, resp: Any) -> None:
        """Keep the ``Date`` of an answer with when it arrived (`latest_date`)."""
        headers = getattr(resp, "headers", None)
        date = headers.get("Date") if headers is not None else None
        if isinstance(date, str):
            self._date_seen = (date, time.monotonic())

    def latest_date(self) -> tuple[str, float] | None:
        """The ``Date`` header of the last answer this client received, with this host's
        `time.monotonic()` at its arrival; None before any. Every answer of the API server
        carries its clock's time: a busy client knows it without asking (`ApiServerClock`)."""
        return self._date_seen

    def date_header(self) -> str | None:
        """The ``Date`` header of a response of the API server (a GET of ``/version``: no RBAC
        needed, nothing written), as sent; `warmpool.kube.clock` parses and bounds it."""
        # Without preloading, the client hands back urllib3's response, headers and all.
        resp: Any = VersionApi(self.api_client).get_code(
            _preload_content=False, _request_timeout=self.request_timeout)
        try:
            header = resp.headers.get("Date")
        finally:
            resp.release_conn()
        return header if isinstance(header, str) else None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return self._send("GET", self._path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, *,
        label_selector: str | None = None, resource_version: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """All items (one page; the pools here are thousands, not millions) and the list's RV.

        `resource_version` says where the API server may answer from (Kubernetes 1.20, no
        `limit` sent): None reads etcd (a consistent read: etcd returns every object of the
        kind in the namespace and the server applies the selector after decoding them all,
        the cost the claim and release paths must not pay); "0" any state its watch cache
        holds (possibly old); any other version its watch cache once it has caught up to it,
        so the answer is not older than that version. Each caller says in code why the
        freshness it asks for is enough.

        A kind's watch cache moves with that kind's changes, and with etcd's progress
        notifications where the API server uses them (EfficientWatchResumption: on by
        default from 1.21; the local control plane turns it on). One that has not caught up
        within 3 s answers 504 ("Too large resource version"): the LIST is then sent to etcd,
        so the answer is never older than asked, only dearer.

        `field_selector` "metadata.name=<name>" makes the server read that one object's key
        (its registry's single-name path), not scan the kind: a consistent read of one
        object through the LIST verb."""
        _check_preconditions(kind, "(list)", resource_version=resource_version)
        path = self._path(api_version, kind, namespace)
        query = [(k, val) for k, val in (("labelSelector", label_selector),
                                         ("fieldSelector", field_selector)) if val is not None]
        try:
            body = self._send("GET", path, query + (
                [] if resource_version is None else [("resourceVersion", resource_version)]))
        except KubeError as exc:
            if resource_version is None or exc.status != 504:
                raise
            log.info("%s LIST at %s: the watch cache is behind (%s); asking etcd", kind,
                     resource_version, exc)
            body = self._send("GET", path, query)
        return self._typed(body, api_version, kind), str(meta_of(body).get("resourceVersion"))

    def _typed(self, body: Obj, api_version: str, kind: str) -> builtins.list[Obj]:
        """A list's items, each saying its kind and the apiVersion it was served at (a list
        of a built-in kind leaves both out): the model copies a Theia Cloud object's into
        owner references to it."""
        served = self.served_api_version(api_version, kind)
        items = body.get("items") or []
        for item in items:
            item.setdefault("apiVersion", served)
            item.setdefault("kind", kind)
        return items

    def list_pages(
        self, api_version: str, kind: str, namespace: str | None, *,
        label_selector: str | None = None, field_selector: str | None = None,
        page_size: int = 500, metadata_only: bool = False,
    ) -> Iterator[tuple[builtins.list[Obj], str]]:  # `list` here: the method above
        """The items in pages of `page_size`, each with the list's resourceVersion.

        Every page of one list is served from the same snapshot, so the resourceVersion of
        the last page is the one to watch from. A continuation that expired (410) raises
        Gone; the caller lists again from the start. `metadata_only`: each item's metadata
        alone (`METADATA_ONLY_LIST`), a PartialObjectMetadata as the server sends it (the
        caller types it, as a metadata-only watch's objects: `Reflector`).
        """
        path = self._path(api_version, kind, namespace)
        token: str | None = None
        while True:
            query = [(k, val) for k, val in (("labelSelector", label_selector),
                                             ("fieldSelector", field_selector))
                     if val is not None]
            query.append(("limit", str(page_size)))
            if token:
                query.append(("continue", token))
            body = self._send("GET", path, query, accept=(
                METADATA_ONLY_LIST if metadata_only else "application/json"))
            meta = meta_of(body)
            yield self._typed(body, api_version, kind), str(meta.get("resourceVersion"))
            token = meta.get("continue")
            if not token:
                return

    def create(self, body: Mapping[str, Any], *, metadata_only: bool = False) -> Obj:
        """POST `body`; the created object as the server answered it. `metadata_only`: ask
        for its metadata alone (`METADATA_ONLY`), typed as `body`'s kind: for a caller that
        keeps nothing else of the answer (its version, its cache's metadata-only copy)."""
        # A Theia Cloud object goes at the cluster's version of its kind, said in its body too
        # (the server refuses a body whose apiVersion is not the endpoint's).
        api_version = self.served_api_version(body["apiVersion"], body["kind"])
        path = self._path(api_version, body["kind"],
                          namespace_of(body) or None)  # None: cluster-scoped
        answer = self._send("POST", path, body={**body, "apiVersion": api_version},
                            accept=METADATA_ONLY if metadata_only else "application/json")
        return as_kind(answer, api_version, body["kind"]) if metadata_only else answer

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any],
        *, resource_version: str | None = None, status: bool = False, dry_run: bool = False,
        metadata_only: bool = False,
    ) -> Obj:
        """A JSON merge patch; with `resource_version` the server refuses it (409) if stale.
        `dry_run`: the server checks and answers as if it wrote (dryRun=All), stores nothing.
        `metadata_only`: the answer is the patched object's metadata alone (as `create`).

        An empty `resource_version` raises ValueError: the server would take it as no
        precondition at all, so a write meant to be guarded would be applied unguarded (an
        object read without its version); None is how a caller asks for no precondition."""
        _check_preconditions(kind, name, resource_version=resource_version)
        body = dict(patch)
        if resource_version is not None:
            body["metadata"] = {**body.get("metadata", {}), "resourceVersion": resource_version}
        path = self._path(api_version, kind, namespace, name, "status" if status else None)
        answer = self._send("PATCH", path, [("dryRun", "All")] if dry_run else None, body,
                            MERGE_PATCH,
                            accept=METADATA_ONLY if metadata_only else "application/json")
        return (as_kind(answer, self.served_api_version(api_version, kind), kind)
                if metadata_only else answer)

    def json_patch(
        self, api_version: str, kind: str, namespace: str, name: str,
        ops: builtins.list[dict[str, Any]], *, status: bool = False,
    ) -> Obj:
        """An RFC 6902 JSON patch: its `test` operations are preconditions on any field (the
        status subresource honours no metadata in a merge patch); a failed test is a 422."""
        path = self._path(api_version, kind, namespace, name, "status" if status else None)
        return self._send("PATCH", path, body=ops, content_type=JSON_PATCH)

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *,
        uid: str | None = None, resource_version: str | None = None,
    ) -> bool:
        """Delete with preconditions; False if it was already gone. A stale precondition: 409.
        An empty precondition raises ValueError, as in `merge_patch` (None: not asked for)."""
        _check_preconditions(kind, name, uid=uid, resource_version=resource_version)
        preconditions = {k: val for k, val in (("uid", uid), ("resourceVersion", resource_version))
                         if val is not None}
        body: dict[str, Any] = {
            "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
        }
        if preconditions:
            body["preconditions"] = preconditions
        try:
            # The answer (the object as deleted, or a Status) is not read: its metadata alone
            # is asked for, so the server encodes, and this process decodes, the least.
            self._send("DELETE", self._path(api_version, kind, namespace, name), body=body,
                       accept=METADATA_ONLY)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def watch(
        self, api_version: str, kind: str, namespace: str | None, *, resource_version: str,
        label_selector: str | None = None, field_selector: str | None = None,
        timeout_seconds: int = 300, metadata_only: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Raw watch events ({type, object} dicts, bookmarks included) from `resource_version`;
        `metadata_only`: each object a PartialObjectMetadata (`METADATA_ONLY`), its metadata
        alone, as the server sends it (the caller types it).

        The server ends the watch after `timeout_seconds`; a client-side read timeout a little
        beyond that ends one whose connection died silently (a dropped NAT entry, a half-open
        TCP stream), which would otherwise block its reader forever. The dynamic client's
        own `watch` cannot pass a request timeout, so this streams its `get` directly.
        """
        res = self._res(api_version, kind)
        read_timeout = timeout_seconds + WATCH_READ_MARGIN
        try:
            for event in kube_watch.Watch().stream(
                res.get, namespace=namespace, label_selector=label_selector,
                field_selector=field_selector, resource_version=resource_version,
                serialize=False,
                timeout_seconds=timeout_seconds, allow_watch_bookmarks=True,
                _request_timeout=(self.request_timeout[0], read_timeout),
                **({"header_params": {"Accept": METADATA_ONLY}} if metadata_only else {}),
            ):
                raw = event.get("raw_object") or {}
                if event.get("type") == "ERROR":
                    if raw.get("code") == 410:
                        raise Gone(raw.get("message", "resourceVersion too old"))
                    raise KubeError(raw.get("code"), raw.get("message", "watch error"))
                yield {"type": event["type"], "object": raw}
        except DynamicApiError as exc:
            raise _wrap(exc) from None
        except ApiException as exc:
            # With a server-side timeout the watch's first response can be a plain 410 that
            # the dynamic client does not wrap (a resourceVersion compacted away).
            if exc.status == 410:
                raise Gone(str(exc.reason)) from None
            raise KubeError(exc.status, str(exc.reason)) from None

    def event(
        self, namespace: str, regarding: Mapping[str, str], reason: str, message: str,
        *, warning: bool, component: str = "warmpool",
    ) -> None:
        """Record one more occurrence of a core/v1 Event, aggregated per cause
        (`warmpool.kube.events`): the cause's one Event is created, or its count raised.
        Best effort, since an event must never fail a reconcile.

        Safe against a concurrent writer: the count is raised under the resourceVersion this
        process last wrote or read (a 409: read again, decide again), and a create racing
        another create is a 409 too. An Event the server let expire (its TTL) is a 404 to
        the patch: created again."""
        if "apiVersion" in regarding:  # a Theia Cloud object: the version the cluster serves
            regarding = {**regarding, "apiVersion": self.served_api_version(
                regarding["apiVersion"], regarding.get("kind", ""))}
        cause = Cause(namespace, dict(regarding), reason, warning, component)
        name = event_name(cause)
        known = self._events.get(name)
        try:
            for _ in range(_EVENT_ATTEMPTS):
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                write = plan_event(cause, message, now, known)
                try:
                    if isinstance(write, CreateEvent):
                        written = self.create(write.body)
                    else:
                        written = self.merge_patch("v1", "Event", namespace, write.name,
                                                   write.patch,
                                                   resource_version=write.resource_version)
                except Conflict:
                    # Raised or created by another writer since: read it, decide again.
                    known = self.get("v1", "Event", namespace, name)
                    continue
                except KubeError as exc:
                    if exc.status != 404 or known is None:
                        raise
                    known = None  # expired since this process wrote it: create it anew
                    continue
                self._events.wrote(name, written)
                return
            self._events.forget(name)
            log.warning("could not record event %s: its count kept changing", reason)
        except (KubeError, Conflict) as exc:
            self._events.forget(name)
            log.warning("could not record event %s: %s", reason, exc)
