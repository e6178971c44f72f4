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

and actions: `cut_watches()` (cut every open watch stream now), `stall_watches()` (every open
watch stream goes silent with its connection left open, as when a NAT entry or a peer dies
without a FIN; held until the client gives up or the proxy stops), `outage(seconds, mode)`: for
`seconds`, "refuse" closes the listening socket and every open connection (clients get
connection refused), "503" answers everything with 503 Service Unavailable and cuts watches.

`proxy.stats()` counts requests and each injected fault; `proxy.events` keeps the latest
injected faults with timestamps (for a failing test's history).

    with ApiProxy(upstream=cluster.server, token=cluster.token, seed=7) as proxy:
        kube = Kube(connect(str(proxy.kubeconfig_path)))
        proxy.set(latency=0.01, p_500=0.05)
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from collections.abc import Iterator
from dataclasses import dataclass
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

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("p_") and not 0.0 <= value <= 1.0:
                raise ValueError(f"{f.name} must be a probability in [0, 1], got {value!r}")
            if f.name in ("latency", "jitter", "drop_watch_after", "retry_after") and value < 0:
                raise ValueError(f"{f.name} must be >= 0, got {value!r}")
        if self.scope not in ("mutating", "all"):
            raise ValueError(f"scope must be 'mutating' or 'all', got {self.scope!r}")

    def active(self) -> dict[str, Any]:
        """The settings that differ from the defaults (for logs)."""
        default = Faults()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def status_body(code: int, message: str) -> bytes:
    """A Kubernetes `Status` object, so clients report the error as the API server would."""
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": REASONS.get(code, "InternalError"), "code": code,
    }).encode()


def is_watch(path: str) -> bool:
    query = parse_qs(urlsplit(path).query)
    return any(val.lower() in ("true", "1") for val in query.get("watch", []))


class _Cut(Exception):
    """The connection was (deliberately) cut: end the handler without writing anything."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    # --- connection bookkeeping ---------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.proxy = self.server.proxy
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
        plan = p._plan(method, path, watch)
        if plan.outage:
            return self._answer(503, "the API server is unavailable (injected outage)",
                                retry_after=p.faults().retry_after)
        if plan.delay:
            time.sleep(plan.delay)
        if plan.drop:
            self._cut()
        if plan.status:
            return self._answer(plan.status, f"injected {plan.status} by the test proxy",
                                retry_after=plan.retry_after)
        try:
            resp = self._forward(method, path, body)
        except (OSError, http.client.HTTPException) as exc:
            p._record("upstream_error", method, path)
            return self._answer(502, f"the test proxy could not reach the API server: {exc}")
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
        for k, val in resp.getheaders():
            if k.lower() in HOP_BY_HOP or k.lower() == "content-length":
                continue
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
            return
        self._stream(resp, watch, cut_after)

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
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if stream.cut:
                self._close_upstream()
                self._cut()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
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
        self.stalled = threading.Event()
        self.released = threading.Event()

    def cut_now(self) -> None:
        self.cut = True
        self.released.set()
        for sock in (self.handler.connection, getattr(self.handler.upstream, "sock", None)):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], proxy: ApiProxy) -> None:
        self.proxy = proxy
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a cut connection is the point, not an error worth a traceback


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
        # Objects the proxied clients deleted (2xx from the server): path without query -> the
        # uids of the deletes' preconditions (None for a delete without one). A name is reused
        # by the next object of that name; the uid tells the two apart.
        self._deleted: dict[str, set[str | None]] = {}
        self.events: deque[tuple[float, str, str]] = deque(maxlen=events)
        self._connections: set[socket.socket] = set()
        self._watches: set[_Stream] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._outage: str | None = None
        self._outage_timer: threading.Timer | None = None
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
        return self

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that reaches the API server through this proxy."""
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "proxy", "user": user}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy",
                                                      "namespace": "default"}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _listen(self) -> None:
        server = _Server((self.host, self.port), self)
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name=f"apiproxy-{self.port}", daemon=True)
        thread.start()
        self._server, self._thread = server, thread

    def _unlisten(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def stop(self) -> None:
        if self._outage_timer is not None:
            self._outage_timer.cancel()
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
            self._outage_timer = threading.Timer(seconds, self.end_outage)
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
            s.stalled.set()
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
            timer = threading.Timer(cut_after, cut)
            timer.daemon = True
            timer.start()

    def _watch_ended(self, stream: _Stream) -> None:
        with self._lock:
            self._watches.discard(stream)

    def _plan(self, method: str, path: str, watch: bool) -> _Plan:
        """Decide, under the lock and from the seeded RNG, what happens to one request."""
        plan = _Plan()
        with self._lock:
            f = self._faults
            rng = self._rng
            self._counts["requests"] += 1
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
