"""The control plane a cluster benchmark runs against: a private one (its own temporary
state directory), the latency proxy in front of it, a direct client, and fresh namespaces set
up as a Theia Cloud namespace is."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

from bench.report import say
from warmpool.cluster import local
from warmpool.kube.api import Kube, connect
from warmpool.pool import vocabulary as v
from warmpool.testing import apiproxy
from warmpool.testing.world import create_namespace


def quiet_warnings() -> None:
    """The local cluster's certificate is self-signed on purpose: no warning per request."""
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    logging.getLogger("urllib3").setLevel(logging.ERROR)


@contextlib.contextmanager
def private_cluster(tag: str, start_delay: float = 0.0) -> Iterator[local.ClusterInfo]:
    """A fresh local control plane of our own (temporary state directory), stopped after.
    `start_delay`: seconds its fake kubelet keeps each pod Pending before Ready (a warm pod
    is then worth something: issue #28's "claims on a warm pod")."""
    state = Path(tempfile.mkdtemp(prefix=f"warmpool-bench-{tag}-"))
    t = time.monotonic()
    info = local.up(state, watch_cache=True, die_with_parent=True,
                    kubelet_args=("--start-delay", f"{start_delay:g}") if start_delay else ())
    say(f"control plane {info.server} up in {time.monotonic() - t:.0f}s ({state})")
    try:
        yield info
    finally:
        try:
            local.down(state)
        finally:
            shutil.rmtree(state, ignore_errors=True)


def _proxy_without_nagle() -> None:
    """Workaround, until the proxy sets it itself: its handler writes a response's headers and
    body in separate sends, so with Nagle's algorithm on, every response waits for the
    client's delayed ACK (~40 ms on Linux); measured here: 1.5 ms direct, 57 ms through the
    proxy with no latency set. TCP_NODELAY on the accepted sockets (the standard library's
    own switch) removes that, so `latency=0.01` means 10 ms."""
    handler = getattr(apiproxy, "_Handler", None)
    if handler is not None and not getattr(handler, "disable_nagle_algorithm", False):
        handler.disable_nagle_algorithm = True


@contextlib.contextmanager
def latency_proxy(info: local.ClusterInfo, latency: float = 0.01,
                  seed: int = 7) -> Iterator[apiproxy.ApiProxy]:
    _proxy_without_nagle()
    with apiproxy.ApiProxy(upstream=info.server, token=info.token, seed=seed) as proxy:
        proxy.set(latency=latency)
        yield proxy


def direct_kube(info: local.ClusterInfo) -> Kube:
    return Kube(connect(str(info.kubeconfig)))


#: An oauth2-proxy configuration like the one Theia Cloud's chart installs in the namespace
#: (`oauth2-proxy-config`), with the placeholders the controller fills in per instance, and
#: without `email_domains`: the controller refuses it (issue #27) with a Warning on every
#: instance it builds, events the benchmark would count as the pool's cost (the 12-04 run did).
PROXY_TEMPLATE = "\n".join([
    'http_address = "0.0.0.0:5000"',
    'upstreams = ["http://127.0.0.1:placeholder-port/"]',
    'redirect_url = "https://placeholder/oauth2/callback"',
    'provider = "keycloak-oidc"',
    'oidc_issuer_url = "https://keycloak.example.com/realms/TheiaCloud"',
    'client_id = "theia-cloud"',
    'cookie_secret = "0123456789abcdef0123456789abcdef"',
    'cookie_secure = "true"',
    'authenticated_emails_file = "/emails/authenticated-emails-list"',
    'skip_provider_button = "true"',
    'pass_access_token = "true"',
    'pass_authorization_header = "true"',
    'set_authorization_header = "true"',
    'reverse_proxy = "true"',
    'ssl_upstream_insecure_skip_verify = "true"',
    'custom_templates_dir = "/templates"',
    'scope = "openid profile email"',
]) + "\n"


def new_namespace(kube: Kube, prefix: str) -> str:
    """A fresh namespace, with the `oauth2-proxy-config` ConfigMap a Theia Cloud namespace
    has (without it every reconcile's template read is a 404)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create_namespace(kube, name)  # returns once Pods can be made there
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": v.NAMESPACE_PROXY_TEMPLATE, "namespace": name},
                 "data": {v.PROXY_CONFIG_KEY: PROXY_TEMPLATE}})
    return name
