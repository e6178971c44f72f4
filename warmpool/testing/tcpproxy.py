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
        link.stall("up")    # silence, one way: nothing the client sends reaches the server
        link.stall("down")  # ... or nothing the server sends reaches the client
        link.stall()        # both ways: a pulled cable, a dead switch port, a paused peer
        link.delay(0.5)     # every chunk, each way, forwarded half a second after it arrived
        link.heal()         # all of the above undone; what a stall held flows on

Bytes are relayed as they arrive, both ways, one thread per direction. A severed proxy keeps
its listening socket (the port stays ours, so the process's URL stays valid) but closes every
connection it accepts at once: the client sees a reset or EOF, as from a dead path whose
peer answers, rather than a hang. `stats()` counts connections accepted, relayed, refused and
cut.

A stall is the other way a link fails, and the one that hangs clients: no reset, no EOF,
connections stay open and new ones are accepted (the proxy's kernel answers the handshake, as
a NAT or load balancer in the path would), and bytes in a stalled direction are read no
further, so they wait in the socket buffers and the sender's writes block once those are
full. With "up" stalled a request never reaches the server; with "down" stalled the server
acts on it and the client never hears. `heal()` lets held bytes flow on, in order, as TCP's
retransmissions would after a link comes back, unless an endpoint gave up meanwhile (its
timeout closed the connection: then what it had sent still arrives, then its FIN). No kernel
queueing discipline is needed (the machines this runs on have no `netem`).

`delay(seconds)`: each chunk, each way, is forwarded no sooner than `seconds` after the proxy
read it (a slow link: latency, not loss; order kept).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from types import TracebackType

#: The directions a link can be stalled in: "up" is client -> server, "down" the replies.
DIRECTIONS = ("up", "down")


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
        self._stalled: set[str] = set()  # directions whose bytes are held (see `stall`)
        self._delay = 0.0  # seconds each chunk waits before it is forwarded
        self._flow = threading.Condition(self._lock)  # wakes pumps on heal/cut/stop

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
        with self._lock:
            self._flow.notify_all()
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
        """Undo every fault: new connections relayed, stalled bytes flow on, no delay."""
        with self._lock:
            self._severed = False
            self._stalled.clear()
            self._delay = 0.0
            self._flow.notify_all()

    def stall(self, direction: str = "both") -> None:
        """Stop forwarding "up" (client -> server), "down" (server -> client) or "both",
        leaving every connection open and accepting new ones: a silent link, until `heal()`."""
        ways = set(DIRECTIONS) if direction == "both" else {direction}
        if not ways <= set(DIRECTIONS):
            raise ValueError(f"direction must be 'up', 'down' or 'both', not {direction!r}")
        with self._lock:
            self._stalled |= ways
            self._counts["stalls"] += 1

    def stalled(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._stalled)

    def delay(self, seconds: float) -> None:
        """Forward each chunk `seconds` after it was read (0: at once), until `heal()`."""
        if seconds < 0:
            raise ValueError(f"a delay cannot be negative: {seconds!r}")
        with self._lock:
            self._delay = seconds
            self._flow.notify_all()

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
            self._flow.notify_all()  # a pump held by a stall sees its pair cut
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
        way = "down" if replies else "up"
        try:
            while self._may_read(way, pair):
                data = src.recv(65536)
                read_at = time.monotonic()
                if not data:
                    break
                if replies and self._drop(data):
                    break
                if not self._may_send(way, pair, read_at):
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._pairs.discard(pair)
        for sock in pair:
            _close(sock)

    def _may_read(self, way: str, pair: tuple[socket.socket, socket.socket]) -> bool:
        """Wait while `way` is stalled (reading nothing, so the sender's buffers fill as on
        a silent link); False once the pair is cut or the proxy stops."""
        with self._lock:
            self._flow.wait_for(lambda: way not in self._stalled or pair not in self._pairs
                                or self._stopped.is_set())
            return pair in self._pairs and not self._stopped.is_set()

    def _may_send(self, way: str, pair: tuple[socket.socket, socket.socket],
                  read_at: float) -> bool:
        """Hold a chunk read before a stall began until it heals, and a delayed one until its
        time; False once the pair is cut or the proxy stops."""
        with self._lock:
            while True:
                if pair not in self._pairs or self._stopped.is_set():
                    return False
                if way in self._stalled:
                    self._flow.wait()
                    continue
                due = read_at + self._delay - time.monotonic()
                if due <= 0:
                    return True
                self._flow.wait(due)

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
