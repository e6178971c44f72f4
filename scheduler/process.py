"""Run `python -m scheduler` as a child process and talk to its health endpoints (tests, demo).

The child prints one line with its health URL (it may be a free port); `start()` waits for it
and then for `/readyz`. `terminate()` is a SIGTERM (graceful: releases the Lease, exits 0),
`kill()` a SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_HEALTH = re.compile(r"health=(http://\S+)")
_METRICS = re.compile(r"metrics=(http://\S+)")
_IDENTITY = re.compile(r"identity=(\S+)")


class SchedulerProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        python: str = sys.executable,
        cwd: str | Path | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        self.args = list(args)
        self.wrapper = list(wrapper)  # e.g. `ip netns exec <ns>`: the command runs inside it
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.python = python
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.metrics_url: str | None = None
        self.identity: str | None = None
        self._log: IO[str] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0, ready: bool = True) -> SchedulerProcess:
        if self.log_path is not None:
            self._log = open(self.log_path, "a")  # noqa: SIM115 (closed in wait())
        self.proc = subprocess.Popen(
            # Free loopback ports by default (the caller's args come later and win): several
            # schedulers on one host must not race for 9090.
            [*self.wrapper, self.python, "-m", "scheduler", "--health-port", "0",
             "--metrics-host",
             "127.0.0.1", "--metrics-port", "0", *self.args],
            env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
            stderr=self._log or subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()  # the first line names the health URL
        m = _HEALTH.search(line)
        if not m:
            self.kill()
            raise RuntimeError(f"scheduler did not start: {line!r} (log: {self.log_path})")
        self.url = m.group(1)
        metrics = _METRICS.search(line)
        self.metrics_url = metrics.group(1) if metrics else None
        ident = _IDENTITY.search(line)
        self.identity = ident.group(1) if ident else None
        if ready:
            while self.get("/readyz")[0] != 200:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"scheduler exited with {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"scheduler not ready after {timeout}s")
                time.sleep(0.05)
        return self

    def get(self, path: str) -> tuple[int, str]:
        """(status, body); (0, error) when nothing answers."""
        assert self.url is not None
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        if code != 200:
            raise RuntimeError(f"/status: {code} {body}")
        return dict(json.loads(body))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            if self._log is not None:
                self._log.close()
                self._log = None
        return code

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it outlives `timeout`; always reaps the child."""
        if self.proc is None:
            return None
        if self.alive():
            self.terminate()
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.wait(10)
