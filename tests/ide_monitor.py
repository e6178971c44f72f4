"""An IDE's activity monitor as a process of its own, as it runs in an instance's pod:
`python -m tests.ide_monitor PORT STATE LOG`.

Answers `GET /monitor/activity/lastActivity` with the epoch milliseconds that the JSON file
STATE maps the request's bearer token to (re-read at every request, so a test changes what
the IDE says by rewriting it; a token it lacks: 404), and `POST /monitor/activity/popup` and
`POST /monitor/message` with 200. Every request is appended to LOG as a JSON line: method,
path, token, body. It listens on 127.0.0.1:PORT, which the workers reach through the holder's
Service address (`tests.service_ips` stands in for kube-proxy there), and prints "ready"."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: One request as the monitor saw it: method, path, the raw Authorization header, the
#: Content-Type header, the body.
Request = tuple[str, str, str, str, str]


def monitor_handler(
    last_activity: Callable[[str], int | None], record: Callable[[Request], None],
) -> type[http.server.BaseHTTPRequestHandler]:
    """The monitor's HTTP handler: `last_activity(token)` answers the GET (None: 404), every
    request goes to `record` first. In-process servers of the tests use it too."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _record(self) -> str:
            auth = self.headers.get("Authorization", "")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            record((self.command, self.path, auth, self.headers.get("Content-Type", ""), body))
            return auth.removeprefix("Bearer ")

        def do_GET(self) -> None:
            value = last_activity(self._record())
            if self.path != "/monitor/activity/lastActivity" or value is None:
                self.send_response(404)
                self.end_headers()
                return
            data = str(value).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self._record()
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def serve(port: int, state: Path, log: Path) -> None:
    lock = threading.Lock()

    def record(request: Request) -> None:
        method, path, auth, _, body = request
        with lock, log.open("a") as out:
            out.write(json.dumps({"method": method, "path": path,
                                  "token": auth.removeprefix("Bearer "), "body": body}) + "\n")

    def last_activity(token: str) -> int | None:
        value = json.loads(state.read_text() or "{}").get(token)
        return None if value is None else int(value)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port),
                                             monitor_handler(last_activity, record))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
