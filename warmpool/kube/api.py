"""The controller's window on the Kubernetes API: plain dicts over the official DynamicClient.

Decisions are computed on dicts exactly as the API server returns them, so one thin layer here
turns calls into dicts and API errors into the few outcomes the controller distinguishes
(not found, conflict, everything else), and nothing else in the code base imports the client.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import config as kube_config
from kubernetes import watch as kube_watch
from kubernetes.client import ApiClient, Configuration, VersionApi
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, ResourceNotFoundError

from warmpool.pool.meta import meta_of, namespace_of

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
Obj = dict[str, Any]


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


def not_served(exc: BaseException) -> bool:
    """Whether `exc` says the API server does not serve that kind (its CRD is not installed):
    discovery found no such resource, or the server answered 404 to a list."""
    return isinstance(exc, ResourceNotFoundError) or (
        isinstance(exc, KubeError) and exc.status == 404)


#: Connections kept open to the API server per client. The library's default (5 per CPU)
#: is below what a worker sends at once (8 threads, each sending a plan's independent writes
#: together): every request over it opened a new TLS connection and threw it away after.
CONNECTIONS = 64


def connect(kubeconfig: str | None = None) -> ApiClient:
    """An API client from a kubeconfig file, else in-cluster config (never the global default)."""
    cfg = Configuration()
    cfg.connection_pool_maxsize = CONNECTIONS
    if kubeconfig:
        return kube_config.new_client_from_config(config_file=kubeconfig,
                                                  client_configuration=cfg)
    try:
        kube_config.load_incluster_config(client_configuration=cfg)
    except kube_config.ConfigException:
        return kube_config.new_client_from_config(client_configuration=cfg)
    return ApiClient(cfg)


# s beyond a watch's server-side timeout before the client gives up reading from it
WATCH_READ_MARGIN = 30


def _check_preconditions(kind: str, name: str, **preconditions: str | None) -> None:
    """Refuse a precondition asked for but empty: it would be sent as none at all."""
    empty = sorted(k for k, val in preconditions.items() if val == "")
    if empty:
        raise ValueError(f"{kind} {name}: empty {' and '.join(empty)} precondition (the "
                         "object was read without it): the write would not be guarded")


class Kube:
    """Get, list, create, merge-patch, delete and watch any kind, namespaced, as dicts."""

    def __init__(
        self, api_client: ApiClient, request_timeout: tuple[float, float] = (5.0, 60.0)
    ) -> None:
        self.api_client = api_client
        self.dyn = DynamicClient(api_client)
        # (connect, read) seconds for every call but watches (which time out server-side): an
        # API server that drops packets must fail a job, not hang a worker thread forever.
        self.request_timeout = request_timeout
        self._resources: dict[tuple[str, str], Any] = {}

    def _res(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self.dyn.resources.get(api_version=api_version, kind=kind)
        return self._resources[key]

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` of `api_version` (its CRD is installed)."""
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            self._res(api_version, kind)
        except ResourceNotFoundError:
            return False
        return True

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Obj:
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            resp = fn(*args, serialize=False, **kwargs)
        except DynamicApiError as exc:
            raise _wrap(exc) from None
        return json.loads(resp.data)

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
            return self._call(self._res(api_version, kind).get, name=name, namespace=namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, *,
        label_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """All items (one page; the pools here are thousands, not millions) and the list's RV."""
        res = self._res(api_version, kind)
        body = self._call(res.get, namespace=namespace, label_selector=label_selector)
        return body.get("items") or [], str(meta_of(body).get("resourceVersion"))

    def list_pages(
        self, api_version: str, kind: str, namespace: str | None, *,
        label_selector: str | None = None, field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[tuple[builtins.list[Obj], str]]:  # `list` here: the method above
        """The items in pages of `page_size`, each with the list's resourceVersion.

        Every page of one list is served from the same snapshot, so the resourceVersion of
        the last page is the one to watch from. A continuation that expired (410) raises
        Gone; the caller lists again from the start.
        """
        res = self._res(api_version, kind)
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": page_size}
            if token:
                kwargs["_continue"] = token
            body = self._call(res.get, namespace=namespace, label_selector=label_selector,
                              field_selector=field_selector, **kwargs)
            meta = meta_of(body)
            yield body.get("items") or [], str(meta.get("resourceVersion"))
            token = meta.get("continue")
            if not token:
                return

    def create(self, body: Mapping[str, Any]) -> Obj:
        res = self._res(body["apiVersion"], body["kind"])
        return self._call(res.create, body=dict(body),
                          namespace=namespace_of(body) or None)  # None: cluster-scoped

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any],
        *, resource_version: str | None = None, status: bool = False, dry_run: bool = False,
    ) -> Obj:
        """A JSON merge patch; with `resource_version` the server refuses it (409) if stale.
        `dry_run`: the server checks and answers as if it wrote (dryRun=All), stores nothing.

        An empty `resource_version` raises ValueError: the server would take it as no
        precondition at all, so a write meant to be guarded would be applied unguarded (an
        object read without its version); None is how a caller asks for no precondition."""
        _check_preconditions(kind, name, resource_version=resource_version)
        body = dict(patch)
        if resource_version is not None:
            body["metadata"] = {**body.get("metadata", {}), "resourceVersion": resource_version}
        res = self._res(api_version, kind)
        if status:
            res = res.subresources["status"]
        return self._call(res.patch, body=body, name=name, namespace=namespace,
                          content_type=MERGE_PATCH, **({"dry_run": "All"} if dry_run else {}))

    def json_patch(
        self, api_version: str, kind: str, namespace: str, name: str,
        ops: builtins.list[dict[str, Any]], *, status: bool = False,
    ) -> Obj:
        """An RFC 6902 JSON patch: its `test` operations are preconditions on any field (the
        status subresource honours no metadata in a merge patch); a failed test is a 422."""
        res = self._res(api_version, kind)
        if status:
            res = res.subresources["status"]
        return self._call(res.patch, body=ops, name=name, namespace=namespace,
                          content_type=JSON_PATCH)

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
            self._call(self._res(api_version, kind).delete, name=name, namespace=namespace,
                       body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def watch(
        self, api_version: str, kind: str, namespace: str | None, *, resource_version: str,
        label_selector: str | None = None, field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[dict[str, Any]]:
        """Raw watch events ({type, object} dicts, bookmarks included) from `resource_version`.

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
        """Record a core/v1 Event; best effort, since an event must never fail a reconcile."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{regarding.get('name', 'warmpool')}.",
                         "namespace": namespace},
            "involvedObject": {**regarding, "namespace": namespace},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": component},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.create(body)
        except (KubeError, Conflict) as exc:
            log.warning("could not record event %s: %s", reason, exc)
