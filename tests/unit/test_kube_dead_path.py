"""Every API client notices a lost path to the API server within DEAD_PATH_SECONDS (warmpool.
kube.api): keep-alives for an idle connection (a watch between events), TCP_USER_TIMEOUT for a
request never acknowledged; and a call that must end before a deadline is bounded by it."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

from warmpool.kube.api import (
    DEAD_PATH_SECONDS,
    REQUEST_TIMEOUT,
    bounded_timeout,
    connect,
)


def test_the_clients_sockets_carry_the_dead_path_bounds(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    api = connect(str(kubeconfig))
    options = set(api.rest_client.pool_manager.connection_pool_kw["socket_options"])
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options
    assert (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PATH_SECONDS * 1000) in options
    assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in options  # urllib3's own kept
    knobs = {opt: value for level, opt, value in options if level == socket.IPPROTO_TCP}
    assert knobs[socket.TCP_KEEPIDLE] + knobs[socket.TCP_KEEPINTVL] * knobs[
        socket.TCP_KEEPCNT] <= DEAD_PATH_SECONDS


def test_a_bound_never_lengthens_a_timeout_and_is_at_least_a_second() -> None:
    assert bounded_timeout(100.0) == REQUEST_TIMEOUT
    assert bounded_timeout(3.0) == (3.0, 3.0)
    assert bounded_timeout(0.1) == (1.0, 1.0)
