"""A fault-injecting proxy in front of a kube-apiserver, for chaos tests and benchmarks.

Clients talk plain HTTP to 127.0.0.1:<port> (`proxy.kubeconfig_path` points there, with the
upstream's bearer token); every request is forwarded over HTTPS to the real API server
(its self-signed certificate is not verified: loopback test clusters only). Responses are
streamed as they arrive, so watches (chunked, one event per chunk) work unbuffered.

Faults, settable at any time from any thread (`proxy.set(...)`, `proxy.reset()`), drawn
from one seeded RNG:

| setting | effect |
|---|---|
| `latency`, `jitter` | every request waits latency + uniform(0, jitter) seconds first |
| `p_409` | a mutating request (POST/PUT/PATCH/DELETE) is answered 409 Conflict, not forwarded |
| `p_500`, `p_429` | answered 500 / 429 (with `Retry-After: retry_after`), not forwarded |
| `scope` | which requests `p_500`, `p_429` and `p_drop` apply to: "mutating" or "all" |
| `p_drop` | the connection is closed without an answer, before forwarding |
| `p_lost_response` | a write is forwarded (it takes effect), then its connection is closed |
| `p_drop_watch`, `drop_watch_after` | a watch stream is cut after uniform(0, drop_watch_after) s |
| `watch_delay`, `watch_delay_client` | watch events reach that client (None: all) that late |
| `clock_offset` | every response's `Date` says the server's time plus that many seconds |

`clock_offset` moves the cluster's clock as its clients read it (`warmpool.kube.clock` reads
the `Date` header and nothing else of the server's time), while the objects' timestamps stay
the server's: a test makes minutes of the cluster's time pass in a second, and the controller
under test still compares the server's times through its production path.

`watch_delay` holds each chunk a watch stream reads from the server (an event, or a few) for
that many seconds before relaying it, in order, while the stream goes on reading: a watch-fed
cache falls behind by that much, its connection healthy (chunks held when the setting is
lowered still wait their time, and those after them wait behind them).

and actions: `hold(client, method, path)` (the next matching requests of that client wait,
unforwarded, until `release()`: a writer frozen between its decision and its write, then
let go; see `Hold`), `cut_watches()` (cut every open watch stream now), `stall_watches()`
(every open watch stream goes silent with its connection left open, as when a NAT entry or a
peer dies without a FIN; held until the client gives up or the proxy stops),
`outage(seconds, mode)`: for `seconds`, "refuse" closes the listening socket and every open
connection (clients get connection refused), "503" answers everything with 503 Service
Unavailable and cuts watches.

Clients: the proxy's first port is client "main" (`kubeconfig_path`); `add_client(name)` listens
on one more port and returns a kubeconfig for it, so a fault can single out one process (the
API server cannot tell the proxy's clients apart, and neither can the proxy by anything else).

`proxy.writes(client)` lists the writes a client sent that reached the server, each with its
answer (what a test reads to show a late write refused). `proxy.stats()` counts requests and
each injected fault; `proxy.events` keeps the latest
injected faults with timestamps (for a failing test's history). `proxy.traffic(client)` counts
requests and response body bytes by verb (GET, LIST, WATCH, POST, PUT, PATCH, DELETE, OTHER:
a GET of a collection is a LIST, a GET with `?watch=` a WATCH, counted once however long it
streams; its bytes are counted as they are relayed), as an immutable `Traffic` whose
difference of two snapshots is the traffic in between (what the benchmarks report per claim).

    with ApiProxy(upstream=cluster.server, token=cluster.token, seed=7) as proxy:
        kube = Kube(connect(str(proxy.kubeconfig_path)))
        proxy.set(latency=0.01, p_500=0.05)
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import http.client
import json
import random
import socket
import socketserver
import ssl
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Hop-by-hop headers (RFC 9110 §7.6.1) are the proxy's own business on each side.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "proxy-connection",
})
NO_BODY_STATUS = frozenset({204, 304})
REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
           502: "InternalError", 503: "ServiceUnavailable"}


@dataclass(frozen=True)
class Faults:
    """What the proxy currently injects (see the module docstring); all off by default."""

    latency: float = 0.0
    jitter: float = 0.0
    p_409: float = 0.0
    p_500: float = 0.0
    p_429: float = 0.0
    retry_after: int = 1
    scope: str = "mutating"
    p_drop: float = 0.0
    p_lost_response: float = 0.0
    p_drop_watch: float = 0.0
    drop_watch_after: float = 5.0
    watch_delay: float = 0.0
    watch_delay_client: str | None = None
    clock_offset: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("p_") and not 0.0 <= value <= 1.0:
                raise ValueError(f"{f.name} must be a probability in [0, 1], got {value!r}")
            if f.name in ("latency", "jitter", "drop_watch_after", "retry_after",
                          "watch_delay") and value < 0:
                raise ValueError(f"{f.name} must be >= 0, got {value!r}")
        if self.scope not in ("mutating", "all"):
            raise ValueError(f"scope must be 'mutating' or 'all', got {self.scope!r}")

    def active(self) -> dict[str, Any]:
        """The settings that differ from the defaults (for logs)."""
        default = Faults()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def _shifted_date(value: str, offset: float) -> str:
    """An HTTP date `offset` seconds later (the upstream's value when it is not one)."""
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return value
    return email.utils.format_datetime(parsed + timedelta(seconds=offset), usegmt=True)


def status_body(code: int, message: str) -> bytes:
    """A Kubernetes `Status` object, so clients report the error as the API server would."""
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": REASONS.get(code, "InternalError"), "code": code,
    }).encode()


def is_watch(path: str) -> bool:
    query = parse_qs(urlsplit(path).query)
    return any(val.lower() in ("true", "1") for val in query.get("watch", []))


#: The verbs `Traffic` counts by (a LIST and a WATCH are GETs on the wire).
VERBS = ("GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE", "OTHER")
MAIN_CLIENT = "main"


def _resource_path(path: str) -> tuple[list[str], bool] | None:
    """The segments after /api/<version> or /apis/<group>/<version>, with a leading
    namespaces/<ns> taken off, and whether it was a deprecated /watch/ path (None: not a
    resource path, e.g. /version, /openapi/v2)."""
    parts = [x for x in urlsplit(path).path.split("/") if x]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return None
    watch = rest[:1] == ["watch"]
    if watch:
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    return rest, watch


def _resource_of(path: str) -> str:
    """The resource a request names: the kind's plural with its subresource
    ("sessions/status"), "(other)" for a path that names none (discovery)."""
    res = _resource_path(path)
    segments = res[0] if res is not None else []
    return "/".join([segments[0], *segments[2:3]]) if segments else "(other)"


def verb_of(method: str, path: str) -> str:
    """The API verb of one request, from its method and URL: a GET of a collection
    (`/api/v1/namespaces/ns/configmaps`, `/api/v1/namespaces`) is a LIST, any GET with
    `?watch=true` (or on a deprecated /watch/ path) a WATCH; discovery GETs are GETs."""
    if method != "GET":
        return method if method in MUTATING else "OTHER"
    res = _resource_path(path)
    if is_watch(path) or (res is not None and res[1]):
        return "WATCH"
    return "LIST" if res is not None and len(res[0]) == 1 else "GET"


def etcd_list_kind(path: str) -> str:
    """How a LIST that goes to etcd (`list_goes_to_etcd`) asked: "one object" (a field
    selector naming one object, `metadata.name=`: the server reads that key alone, not a
    scan), "pages" (a limit or a continuation: how every reflector lists) or "consistent"
    (no resourceVersion, no limit: a scan the caller wanted fresh)."""
    query = parse_qs(urlsplit(path).query)
    fields = (query.get("fieldSelector") or [""])[-1]
    if fields.startswith("metadata.name=") and "," not in fields:
        return "one object"
    paged = bool(query.get("continue")) or (query.get("limit") or [""])[-1] not in ("", "0")
    return "pages" if paged else "consistent"


def list_goes_to_etcd(path: str) -> bool:
    """Whether kube-apiserver 1.20 sends this LIST on to etcd rather than answer it from its
    watch cache, by its query alone (the cacher's `shouldDelegateList`): no resourceVersion
    (a consistent read), a continuation, a limit with any resourceVersion but "0", or an
    exact match. The API server's own counters say how many LISTs etcd answered; this says
    which client's request each was, for the ones that passed through the proxy."""
    query = parse_qs(urlsplit(path).query)
    rv = (query.get("resourceVersion") or [""])[-1]
    limit = (query.get("limit") or [""])[-1]
    return (rv == "" or bool(query.get("continue"))
            or (limit not in ("", "0") and rv != "0")
            or (query.get("resourceVersionMatch") or [""])[-1] == "Exact")


@dataclass(frozen=True)
class Traffic:
    """Requests and response body bytes by verb (`VERBS`), as counted by the proxy.

    Snapshots subtract: `proxy.traffic() - before` is what passed in between. Watch streams
    count as one request each (when they open) and their bytes as relayed, so a window's
    WATCH bytes are the events its open watches delivered during it."""

    requests: Mapping[str, int] = field(default_factory=dict)
    bytes: Mapping[str, int] = field(default_factory=dict)

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic({k: self.requests.get(k, 0) - other.requests.get(k, 0) for k in VERBS},
                       {k: self.bytes.get(k, 0) - other.bytes.get(k, 0) for k in VERBS})

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic({k: self.requests.get(k, 0) + other.requests.get(k, 0) for k in VERBS},
                       {k: self.bytes.get(k, 0) + other.bytes.get(k, 0) for k in VERBS})

    def total_requests(self, watches: bool = False) -> int:
        """Every request (watch streams only with `watches`)."""
        return sum(n for k, n in self.requests.items() if watches or k != "WATCH")

    def total_bytes(self, watches: bool = False) -> int:
        """Every response byte (watch streams' only with `watches`)."""
        return sum(n for k, n in self.bytes.items() if watches or k != "WATCH")


class _Cut(Exception):
    """The connection was (deliberately) cut: end the handler without writing anything."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    # --- connection bookkeeping ---------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.proxy = self.server.proxy
        self.client = self.server.client
        self.verb = "OTHER"
        self.watched = ""  # a watch stream's resource (`_resource_of`), once per request
        self.upstream: http.client.HTTPSConnection | None = None
        self.proxy._track(self.connection, True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.proxy._track(self.connection, False)
        self._close_upstream()

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: the proxy's stats and events say what happened

    def _close_upstream(self) -> None:
        if self.upstream is not None:
            with contextlib.suppress(Exception):
                self.upstream.close()
            self.upstream = None

    def _connection(self) -> http.client.HTTPSConnection:
        if self.upstream is None:
            p = self.proxy
            self.upstream = http.client.HTTPSConnection(
                p.upstream_host, p.upstream_port, context=p.ssl_context, timeout=p.timeout)
        return self.upstream

    def _cut(self) -> None:
        """Close the client connection without a word (what a network failure looks like)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Cut()

    # --- requests -----------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _read_body(self) -> bytes | None:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        return None

    def _handle(self) -> None:
        try:
            self._serve()
        except _Cut:
            return
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    def _serve(self) -> None:
        p = self.proxy
        body = self._read_body()
        method, path = self.command, self.path
        watch = method == "GET" and is_watch(path)
        self.verb = verb_of(method, path)
        self.watched = _resource_of(path) if self.verb == "WATCH" else ""
        plan = p._plan(method, path, watch, self.client, self.verb)
        if plan.outage:
            return self._answer(503, "the API server is unavailable (injected outage)",
                                retry_after=p.faults().retry_after)
        if plan.delay:
            p.sleep(plan.delay)
        if plan.drop:
            self._cut()
        if plan.status:
            return self._answer(plan.status, f"injected {plan.status} by the test proxy",
                                retry_after=plan.retry_after)
        held = p._take_hold(self.client, method, path, body)
        try:
            resp = self._forward(method, path, body)
        except (OSError, http.client.HTTPException) as exc:
            p._record("upstream_error", method, path)
            if held is not None:
                held.answered(502)
            return self._answer(502, f"the test proxy could not reach the API server: {exc}")
        if held is not None:
            held.answered(resp.status)
        p._count_shape(self.verb, path, resp.status)
        if self.verb == "LIST" and list_goes_to_etcd(path):
            p._count_etcd_list(self.client, path)
        if method in MUTATING:
            p._wrote(self.client, method, path, resp.status)
        if method == "DELETE" and 200 <= resp.status < 300:
            p._deleted_path(path, body)  # before the reply: the server has deleted it anyway
        if plan.lost_response:
            resp.close()
            self._close_upstream()
            self._cut()
        self._relay(resp, watch, plan.cut_watch_after)

    def _answer(self, code: int, message: str, retry_after: int | None = None) -> None:
        data = status_body(code, message)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None and code in (429, 503):
            self.send_header("Retry-After", str(retry_after))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
            self.proxy._count_bytes(self.client, self.verb, len(data))
        self.wfile.flush()

    def _forward(self, method: str, path: str, body: bytes | None) -> http.client.HTTPResponse:
        p = self.proxy
        headers = {k: val for k, val in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = p.upstream_netloc
        if p.token and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = f"Bearer {p.token}"
        if body is not None:
            headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):
            reused = self.upstream is not None
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # An idle keep-alive connection the server had closed: once more on a new one.
                self._close_upstream()
                if attempt == 2 or not reused:
                    raise
            except Exception:
                self._close_upstream()
                raise
        raise AssertionError("unreachable")

    def _relay(self, resp: http.client.HTTPResponse, watch: bool,
               cut_after: float | None) -> None:
        self.send_response_only(resp.status, resp.reason)
        length = resp.getheader("Content-Length")
        no_body = self.command == "HEAD" or resp.status in NO_BODY_STATUS or resp.status < 200
        offset = self.proxy.faults().clock_offset
        for k, val in resp.getheaders():
            if k.lower() in HOP_BY_HOP or k.lower() == "content-length":
                continue
            if k.lower() == "date" and offset:
                val = _shifted_date(val, offset)
            self.send_header(k, val)
        if no_body:
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            resp.read()
            self.wfile.flush()
            return
        if length is not None and not watch:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            p = self.proxy
            p._count_bytes(self.client, self.verb, len(data))
            return
        self._stream(resp, watch, cut_after)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        self.proxy._count_bytes(self.client, self.verb, len(data))
        if self.watched:
            self.proxy._count_watch_bytes(self.watched, len(data))

    def _stream(self, resp: http.client.HTTPResponse, watch: bool,
                cut_after: float | None) -> None:
        """Relay a body as it arrives, re-chunked; a watch can be cut at any moment."""
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        p = self.proxy
        stream = _Stream(self, resp)
        if watch:
            p._watch_started(stream, cut_after)
        try:
            while True:
                try:
                    data = resp.read1(65536)
                except (http.client.IncompleteRead, OSError, ValueError):
                    data = b""
                    stream.cut = stream.cut or not resp.isclosed()
                if not data or stream.cut:
                    break
                if stream.stalled.is_set():
                    stream.released.wait()  # relay nothing more, close nothing
                    break
                delay = p._watch_delay(self.client) if watch else 0.0
                if delay and stream.line is None:
                    stream.line = _DelayLine(self, stream, p.clock)
                    p._record("watch_delay", "GET", stream.path)
                if stream.line is not None:  # once delayed, always: the order is kept
                    stream.line.put(data, p.clock() + delay)
                    p._count("watch_delayed_chunks")
                else:
                    self._write_chunk(data)
            if stream.line is not None:
                stream.line.drain()  # what it still holds, at its time; then the end
            if stream.stalled.is_set() and not stream.cut:
                stream.released.wait()
            if stream.cut:
                self._close_upstream()
                self._cut()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            if stream.line is not None:
                stream.line.stop()  # the handler is done: its line writes nothing more
            if watch:
                p._watch_ended(stream)
            if stream.cut:
                self.close_connection = True


class _Stream:
    """An open streamed response, so it can be cut from another thread."""

    def __init__(self, handler: _Handler, resp: http.client.HTTPResponse) -> None:
        self.handler = handler
        self.resp = resp
        self.cut = False
        self.path = handler.path
        self.client = handler.client
        self.stalled = threading.Event()
        self.released = threading.Event()
        self.line: _DelayLine | None = None

    def cut_now(self) -> None:
        self.cut = True
        self.released.set()
        if self.line is not None:
            self.line.wake()
        for sock in (self.handler.connection, getattr(self.handler.upstream, "sock", None)):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stall(self) -> None:
        self.stalled.set()
        if self.line is not None:
            self.line.wake()


class _DelayLine:
    """The chunks of one delayed watch stream, each relayed at its due time, in order.

    The handler's thread keeps reading the server (so the server sees a healthy client) and
    `put`s what it reads; this line's own thread writes each chunk once the proxy's clock
    reaches its due time, and nothing after a cut or a stall. FIFO: a chunk read after the
    delay was lowered still waits for the ones before it, as one lagging cache would."""

    def __init__(self, handler: _Handler, stream: _Stream, clock: Callable[[], float]) -> None:
        self.handler, self.stream, self.clock = handler, stream, clock
        self.held: deque[tuple[float, bytes]] = deque()
        self.closed = False
        self.failed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"apiproxy-delay-{stream.client}")
        self._thread.start()

    def put(self, data: bytes, due: float) -> None:
        with self._cond:
            self.held.append((due, data))
            self._cond.notify_all()

    def events_held(self) -> int:
        """Watch events held now (the API server ends each with a newline)."""
        with self._cond:
            return sum(data.count(b"\n") for _, data in self.held)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.closed = True
            self.held.clear()
            self._cond.notify_all()

    def drain(self) -> None:
        """The upstream ended: relay what is held (at its time), then return."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self._thread.join()
        if self.failed:
            self.stream.cut = True

    def _next(self) -> bytes | None:
        """The next chunk once it is due; None when there is no more to write."""
        s = self.stream
        with self._cond:
            while True:
                if s.cut or s.stalled.is_set():
                    return None
                if self.held:
                    due, data = self.held[0]
                    wait = due - self.clock()
                    if wait <= 0:
                        self.held.popleft()
                        return data
                    # Short waits: the clock may be a test's, moved from outside.
                    self._cond.wait(min(wait, 0.05))
                elif self.closed:
                    return None
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while (data := self._next()) is not None:
            try:
                self.handler._write_chunk(data)
            except (OSError, ValueError):
                self.failed = True
                return


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False
    # socketserver's default listen backlog is 5: a worker opening a dozen connections at
    # once (its threads' writes sent together) overflowed it, and each connection beyond
    # waited for the client's SYN retransmission, a second, as if the API server were slow.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], proxy: ApiProxy, client: str) -> None:
        self.proxy = proxy
        self.client = client
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a cut connection is the point, not an error worth a traceback


@dataclass
class HeldRequest:
    method: str
    path: str
    body: bytes | None
    status: int | None = None  # the API server's answer, once released and forwarded
    hold: Hold | None = field(default=None, repr=False)

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    def answered(self, status: int) -> None:
        self.status = status
        if self.hold is not None:
            self.hold._notify()


class Hold:
    """Requests of one client that wait at the proxy, unforwarded, until `release()`.

    From `ApiProxy.hold(...)` on, the next `count` requests of `client` whose method is
    `method` (None: any) and whose URL path contains `path` (None: any) are held: the client
    has sent them and waits for the answer, the API server has not seen them. `wait_held(n)`
    returns once n are held (a test's deterministic "the writer is now between its decision
    and its write"); `release()` forwards them, and `wait_answered(n)` returns the held
    requests once the server has answered n of them (`HeldRequest.status`, e.g. 409 for a
    write whose resourceVersion precondition no longer holds)."""

    def __init__(self, client: str, method: str | None, path: str | None, count: int) -> None:
        self.client, self.method, self.path, self.count = client, method, path, count
        self.requests: list[HeldRequest] = []
        self._taken = 0  # requests matched so far (under the proxy's lock)
        self._released = threading.Event()
        self._cond = threading.Condition()

    def matches(self, client: str, method: str, path: str) -> bool:
        return (client == self.client and self._taken < self.count
                and (self.method is None or method == self.method)
                and (self.path is None or self.path in urlsplit(path).path))

    def release(self) -> None:
        self._released.set()

    def wait_held(self, n: int = 1, timeout: float = 30.0) -> list[HeldRequest]:
        return self._wait(lambda: len(self.requests) >= n, timeout, f"{n} held request(s)")

    def wait_answered(self, n: int = 1, timeout: float = 30.0) -> list[HeldRequest]:
        return self._wait(lambda: sum(r.status is not None for r in self.requests) >= n,
                          timeout, f"answers to {n} held request(s)")

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> list[HeldRequest]:
        with self._cond:
            if not self._cond.wait_for(done, timeout):
                raise TimeoutError(f"{what} after {timeout:g}s: {self.requests}")
            return list(self.requests)

    def _held(self, request: HeldRequest) -> None:
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()
        self._released.wait()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()


@dataclass(frozen=True)
class Write:
    """One write a client sent that reached the API server, and the server's answer: the
    server's side of "a late write was refused" (409: a precondition or the fence no longer
    held; 404: the object it named is gone)."""

    at: float  # time.time() when answered
    client: str
    method: str
    path: str
    status: int

    @property
    def refused(self) -> bool:
        return self.status >= 400


@dataclass
class _Plan:
    outage: bool = False
    delay: float = 0.0
    drop: bool = False
    status: int = 0
    retry_after: int | None = None
    lost_response: bool = False
    cut_watch_after: float | None = None


class ApiProxy:
    """The proxy; `start()`/`stop()` or a `with` block. See the module docstring."""

    def __init__(
        self,
        upstream: str,
        token: str | None = None,
        *,
        seed: int | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        kubeconfig_path: Path | None = None,
        timeout: float = 600.0,
        events: int = 2000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        timer: Callable[[float, Callable[[], None]], threading.Timer] = threading.Timer,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"upstream must be an https:// URL, got {upstream!r}")
        self.upstream = upstream
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 443
        self.upstream_netloc = parts.netloc
        self.token = token
        self.host = host
        self.port = port
        self.timeout = timeout
        self.ssl_context = ssl.create_default_context()
        self.ssl_context.check_hostname = False
        self.ssl_context.verify_mode = ssl.CERT_NONE
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._faults = Faults()
        self._counts: Counter[str] = Counter()
        self.clock = clock  # when a delayed watch chunk is due (a test may move it by hand)
        self.sleep = sleep  # how a request waits its latency (a test may record it instead)
        self.timer = timer  # ends an outage, cuts a watch (a test may record the delays)
        self._requests: Counter[tuple[str, str]] = Counter()  # (client, verb) -> requests
        self._bytes: Counter[tuple[str, str]] = Counter()  # (client, verb) -> body bytes
        self._shapes: Counter[tuple[str, str, int]] = Counter()  # see `shapes`
        self._watch_bytes: Counter[str] = Counter()  # see `watch_bytes`
        self._etcd_lists: Counter[tuple[str, str]] = Counter()  # see `etcd_lists`
        # Objects the proxied clients deleted (2xx from the server): path without query -> the
        # uids of the deletes' preconditions (None for a delete without one). A name is reused
        # by the next object of that name; the uid tells the two apart.
        self._deleted: dict[str, set[str | None]] = {}
        self.events: deque[tuple[float, str, str]] = deque(maxlen=events)
        self._connections: set[socket.socket] = set()
        self._watches: set[_Stream] = set()
        # client -> [port, kubeconfig path, its server, its thread]; "main" is the first
        self._listeners: dict[str, list[Any]] = {MAIN_CLIENT: [port, None, None, None]}
        self._outage: str | None = None
        self._outage_timer: threading.Timer | None = None
        self._holds: list[Hold] = []
        self._writes: deque[Write] = deque(maxlen=events)  # see `writes`
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._kubeconfig_path = kubeconfig_path

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kubeconfig_path(self) -> Path:
        if self._kubeconfig_path is None:
            raise RuntimeError("start the proxy first")
        return self._kubeconfig_path

    def start(self) -> ApiProxy:
        self._listen()
        if self._kubeconfig_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="warmpool-apiproxy-")
            self._kubeconfig_path = Path(self._tmp.name) / "kubeconfig"
        self.write_kubeconfig(self._kubeconfig_path)
        self._listeners[MAIN_CLIENT][1] = self._kubeconfig_path
        return self

    def add_client(self, name: str, kubeconfig_path: Path | None = None) -> Path:
        """Listen on one more port for client `name`; returns a kubeconfig that reaches the
        API server through it (for the processes a fault must single out)."""
        if name in self._listeners:
            raise ValueError(f"client {name!r} exists")
        path = kubeconfig_path
        if path is None:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="warmpool-apiproxy-")
            path = Path(self._tmp.name) / f"kubeconfig-{name}"
        self._listeners[name] = [0, path, None, None]
        self._listen_one(name)
        self.write_kubeconfig(path, name)
        return path

    def client_url(self, name: str = MAIN_CLIENT) -> str:
        return f"http://{self.host}:{self._listeners[name][0]}"

    def client_port(self, name: str = MAIN_CLIENT) -> int:
        return int(self._listeners[name][0])

    def write_kubeconfig(self, path: Path, client: str = MAIN_CLIENT,
                         server: str | None = None) -> Path:
        """A kubeconfig that reaches the API server through this proxy (as `client`), at
        `server` when given (a forwarder in front of the client's port, e.g. a host's link)."""
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy",
                          "cluster": {"server": server or self.client_url(client)}}],
            "users": [{"name": "proxy", "user": user}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy",
                                                      "namespace": "default"}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _listen(self) -> None:
        for name, entry in self._listeners.items():
            if entry[2] is None:
                self._listen_one(name)

    def _listen_one(self, name: str) -> None:
        entry = self._listeners[name]
        server = _Server((self.host, entry[0]), self, name)
        entry[0] = server.server_address[1]  # the same port again after an outage
        if name == MAIN_CLIENT:
            self.port = entry[0]
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name=f"apiproxy-{entry[0]}", daemon=True)
        thread.start()
        entry[2], entry[3] = server, thread

    def _unlisten(self) -> None:
        for entry in self._listeners.values():
            server, thread = entry[2], entry[3]
            entry[2] = entry[3] = None
            if server is not None:
                server.shutdown()
                server.server_close()
            if thread is not None:
                thread.join(5)

    def stop(self) -> None:
        if self._outage_timer is not None:
            self._outage_timer.cancel()
        self.release_holds()
        self._unlisten()
        self.cut_watches()
        self.cut_connections()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ApiProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- settings -----------------------------------------------------------------------

    def faults(self) -> Faults:
        with self._lock:
            return self._faults

    def set(self, **changes: Any) -> Faults:
        """Change some fault settings (the others stay); returns the previous settings."""
        with self._lock:
            before = self._faults
            self._faults = dataclasses.replace(before, **changes)
            return before

    def reset(self) -> Faults:
        """Back to a transparent proxy (an outage in progress is not ended: `end_outage`)."""
        with self._lock:
            before, self._faults = self._faults, Faults()
            return before

    @contextlib.contextmanager
    def faulty(self, **changes: Any) -> Iterator[ApiProxy]:
        """`with proxy.faulty(p_500=0.5): ...` sets faults for the block, then restores."""
        before = self.set(**changes)
        try:
            yield self
        finally:
            with self._lock:
                self._faults = before

    # --- actions ------------------------------------------------------------------------

    def outage(self, seconds: float | None, mode: str = "refuse") -> None:
        """Make the API server unreachable now; for `seconds` (None: until `end_outage`)."""
        if mode not in ("refuse", "503"):
            raise ValueError(f"outage mode must be 'refuse' or '503', got {mode!r}")
        self.end_outage()
        self._record("outage_" + mode, "-", f"{seconds}s")
        with self._lock:
            self._outage = mode
        if mode == "refuse":
            self._unlisten()
            self.cut_connections()
        else:
            self.cut_watches()
        if seconds is not None:
            self._outage_timer = self.timer(seconds, self.end_outage)
            self._outage_timer.daemon = True
            self._outage_timer.start()

    def end_outage(self) -> None:
        timer, self._outage_timer = self._outage_timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        with self._lock:
            mode, self._outage = self._outage, None
        if mode == "refuse":
            self._listen()
        if mode is not None:
            self._record("outage_end", "-", mode)

    @property
    def in_outage(self) -> str | None:
        with self._lock:
            return self._outage

    def hold(self, client: str = MAIN_CLIENT, method: str | None = None,
             path: str | None = None, count: int = 1) -> Hold:
        """Hold the next `count` matching requests of `client` before they are forwarded,
        until the returned `Hold` is released (see `Hold`). `stop()` releases every hold."""
        if client not in self._listeners:
            raise ValueError(f"no client {client!r}")
        hold = Hold(client, method.upper() if method else None, path, count)
        with self._lock:
            self._holds.append(hold)
        return hold

    def release_holds(self) -> None:
        """Release every hold (what is held now is forwarded) and hold nothing more."""
        with self._lock:
            holds, self._holds = self._holds, []
        for hold in holds:
            hold.release()

    def _take_hold(self, client: str, method: str, path: str, body: bytes | None
                   ) -> HeldRequest | None:
        with self._lock:
            hold = next((h for h in self._holds if h.matches(client, method, path)), None)
            if hold is None:
                return None
            hold._taken += 1
            request = HeldRequest(method, path, body, hold=hold)
            self._counts["held"] += 1
            self.events.append((time.time(), "held", f"{method} {path}"))
        hold._held(request)  # blocks this request's handler until the hold is released
        return request

    def cut_watches(self) -> int:
        """Cut every open watch stream now; returns how many."""
        with self._lock:
            streams = list(self._watches)
        for s in streams:
            self._record("watch_cut", "GET", s.path)
            s.cut_now()
        return len(streams)

    def stall_watches(self) -> int:
        """Silence every open watch stream (see the module docstring); returns how many."""
        with self._lock:
            streams = list(self._watches)
        for s in streams:
            self._record("watch_stall", "GET", s.path)
            s.stall()
        return len(streams)

    def cut_connections(self) -> int:
        with self._lock:
            conns = list(self._connections)
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return len(conns)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def shapes(self) -> Counter[tuple[str, str, int]]:
        """Requests so far by (verb, resource, status): the resource is the kind's plural
        with its subresource ("sessions/status"), so a benchmark can say which writes a
        cycle makes and which of them the server refused. Snapshots subtract."""
        with self._lock:
            return Counter(self._shapes)

    def watch_bytes(self) -> Counter[str]:
        """Bytes of events the watch streams relayed so far, by resource (the kind's
        plural, "pods"), every client's: which kinds' events the watchers decode. A watch
        for metadata alone counts what it was sent, its objects' metadata. Snapshots
        subtract."""
        with self._lock:
            return Counter(self._watch_bytes)

    def etcd_lists(self, client: str | None = None) -> Counter[str]:
        """LISTs so far whose query makes the API server answer them from etcd
        (`list_goes_to_etcd`), by resource and how they asked (`etcd_list_kind`: "pods
        pages", "pods consistent"), of one client (None: all of them): which of the LISTs
        etcd answered were a proxied client's. Snapshots subtract."""
        with self._lock:
            out: Counter[str] = Counter()
            for (c, resource), n in self._etcd_lists.items():
                if client is None or c == client:
                    out[resource] += n
            return out

    def _count_etcd_list(self, client: str, path: str) -> None:
        with self._lock:
            self._etcd_lists[(client, f"{_resource_of(path)} {etcd_list_kind(path)}")] += 1

    def _count_shape(self, verb: str, path: str, status: int) -> None:
        with self._lock:
            self._shapes[(verb, _resource_of(path), status)] += 1

    def _count_watch_bytes(self, resource: str, n: int) -> None:
        with self._lock:
            self._watch_bytes[resource] += n

    def traffic(self, client: str | None = None) -> Traffic:
        """Requests and response bytes by verb so far, of one client (None: all of them)."""
        with self._lock:
            req: Counter[str] = Counter()
            out: Counter[str] = Counter()
            for (c, verb), n in self._requests.items():
                if client is None or c == client:
                    req[verb] += n
            for (c, verb), n in self._bytes.items():
                if client is None or c == client:
                    out[verb] += n
        return Traffic({k: req[k] for k in VERBS}, {k: out[k] for k in VERBS})

    def writes(self, client: str | None = None) -> list[Write]:
        """The latest writes (POST, PUT, PATCH, DELETE) forwarded to the API server, of one
        client (None: all), oldest first, each with the server's answer."""
        with self._lock:
            return [w for w in self._writes if client is None or w.client == client]

    def _wrote(self, client: str, method: str, path: str, status: int) -> None:
        with self._lock:
            self._writes.append(Write(time.time(), client, method, path, status))

    def held_watch_events(self, client: str | None = None) -> int:
        """Watch events read from the server and not yet relayed (a `watch_delay`)."""
        with self._lock:
            lines = [s.line for s in self._watches
                     if s.line is not None and (client is None or s.client == client)]
        return sum(line.events_held() for line in lines)

    def deleted(self, path: str, uid: str | None = None) -> bool:
        """Whether a client of this proxy deleted the object at `path` (an API path such as
        /api/v1/namespaces/ns/services/name) -- the one with `uid`, when given and the delete
        named it in its preconditions: who deleted an object, when a test must know whether it
        was the system under test or the server's garbage collector."""
        with self._lock:
            uids = self._deleted.get(urlsplit(path).path, set())
        return bool(uids) and (uid is None or uid in uids or None in uids)

    def _deleted_path(self, path: str, body: bytes | None) -> None:
        uid = None
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            uid = (json.loads(body or b"{}").get("preconditions") or {}).get("uid")
        with self._lock:
            self._deleted.setdefault(urlsplit(path).path, set()).add(uid)

    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    # --- internals (called by handler threads) --------------------------------------------

    def _record(self, kind: str, method: str, path: str) -> None:
        with self._lock:
            self._counts[kind] += 1
            self.events.append((time.time(), kind, f"{method} {path}"))

    def _count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def _count_bytes(self, client: str, verb: str, n: int) -> None:
        with self._lock:
            self._bytes[(client, verb)] += n

    def _watch_delay(self, client: str) -> float:
        with self._lock:
            f = self._faults
        if f.watch_delay and f.watch_delay_client in (None, client):
            return f.watch_delay
        return 0.0

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(sock)
            else:
                self._connections.discard(sock)

    def _watch_started(self, stream: _Stream, cut_after: float | None) -> None:
        with self._lock:
            self._watches.add(stream)
        if cut_after is not None:
            def cut() -> None:
                if not stream.cut and stream in self._watches:
                    self._record("watch_cut", "GET", stream.path)
                    stream.cut_now()
            timer = self.timer(cut_after, cut)
            timer.daemon = True
            timer.start()

    def _watch_ended(self, stream: _Stream) -> None:
        with self._lock:
            self._watches.discard(stream)

    def _plan(self, method: str, path: str, watch: bool, client: str = MAIN_CLIENT,
              verb: str = "OTHER") -> _Plan:
        """Decide, under the lock and from the seeded RNG, what happens to one request."""
        plan = _Plan()
        with self._lock:
            f = self._faults
            rng = self._rng
            self._counts["requests"] += 1
            self._requests[(client, verb)] += 1
            if watch:
                self._counts["watches"] += 1
            if self._outage is not None:
                plan.outage = True
                kind = "outage_503"
            else:
                mutating = method in MUTATING
                scoped = mutating or f.scope == "all"
                kind = ""
                plan.delay = f.latency + (rng.uniform(0, f.jitter) if f.jitter else 0.0)
                if scoped and f.p_drop and rng.random() < f.p_drop:
                    plan.drop, kind = True, "dropped"
                elif mutating and f.p_409 and rng.random() < f.p_409:
                    plan.status, kind = 409, "409"
                elif scoped and f.p_500 and rng.random() < f.p_500:
                    plan.status, kind = 500, "500"
                elif scoped and f.p_429 and rng.random() < f.p_429:
                    plan.status, kind = 429, "429"
                    plan.retry_after = f.retry_after
                elif mutating and f.p_lost_response and rng.random() < f.p_lost_response:
                    plan.lost_response, kind = True, "lost_response"
                elif watch and f.p_drop_watch and rng.random() < f.p_drop_watch:
                    plan.cut_watch_after = rng.uniform(0, f.drop_watch_after)
                if plan.delay:
                    self._counts["delayed"] += 1
            if kind:
                self._counts[kind] += 1
                self.events.append((time.time(), kind, f"{method} {path}"))
        return plan
