"""A TCP proxy that a test can sever: one process's link to Redis (or any TCP server) cut
while everyone else's stays up -- a network partition of one host, on loopback.

    with TcpProxy(("127.0.0.1", 6379)) as link:
        url = f"redis://127.0.0.1:{link.port}/0"   # give this URL to the process to cut off
        ...
        link.sever()   # every open connection reset, new ones refused (closed on accept)
        ...
        link.heal()    # new connections are relayed again
        link.lose_reply(b"marker")  # the next reply holding b"marker" is dropped, its
                                    # connection closed: the server acted, the client never
                                    # heard (a reply lost with a dying host or link)

Bytes are relayed as they arrive, both ways, one thread per direction. A severed proxy keeps
its listening socket (the port stays ours, so the process's URL stays valid) but closes every
connection it accepts at once: the client sees a reset or EOF, as from a dead path whose
peer answers, rather than a hang. `stats()` counts connections accepted, relayed, refused and
cut.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from types import TracebackType


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1", port: int = 0
                 ) -> None:
        self.upstream = upstream
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._severed = False
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._counts: Counter[str] = Counter()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._lose: bytes | None = None  # drop the next server reply containing this

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"tcpproxy-{self.port}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        self._cut_all()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- the switch -----------------------------------------------------------------------

    @property
    def severed(self) -> bool:
        with self._lock:
            return self._severed

    def sever(self) -> int:
        """Cut the link now: every open connection closed, new ones closed on accept until
        `heal()`. Returns how many open connections were cut."""
        with self._lock:
            self._severed = True
        return self._cut_all()

    def heal(self) -> None:
        with self._lock:
            self._severed = False

    def lose_reply(self, marker: bytes) -> None:
        """Drop the next chunk the server sends that contains `marker`, and close that
        connection: whatever the request did on the server stands, its answer is lost."""
        with self._lock:
            self._lose = marker

    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    # --- internals ------------------------------------------------------------------------

    def _cut_all(self) -> int:
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
            self._counts["cut"] += len(pairs)
        for pair in pairs:
            for sock in pair:
                _close(sock)
        return len(pairs)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._counts["accepted"] += 1
                refuse = self._severed
                if refuse:
                    self._counts["refused"] += 1
            if refuse:
                _close(client)
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True,
                             name=f"tcpproxy-{self.port}-conn").start()

    def _connect(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=5)
            server.settimeout(None)
        except OSError:
            _close(client)
            return
        pair = (client, server)
        with self._lock:
            if self._severed:  # severed while we dialed
                self._counts["refused"] += 1
                refuse = True
            else:
                self._pairs.add(pair)
                self._counts["relayed"] += 1
                refuse = False
        if refuse:
            _close(client)
            _close(server)
            return
        threading.Thread(target=self._pump, args=(server, client, pair, True),
                         daemon=True).start()
        self._pump(client, server, pair)

    def _pump(self, src: socket.socket, dst: socket.socket,
              pair: tuple[socket.socket, socket.socket], replies: bool = False) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self._drop(data):
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._pairs.discard(pair)
        for sock in pair:
            _close(sock)

    def _drop(self, data: bytes) -> bool:
        with self._lock:
            if self._lose is None or self._lose not in data:
                return False
            self._lose = None
            self._counts["lost_replies"] += 1
            return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
