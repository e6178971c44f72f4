"""The example overlay's external Redis (deploy/overlays/example): a password and TLS verified
against the CA the overlay mounts. A real redis-server with TLS and requirepass, a CA made here
with openssl; the URL is the one the overlay documents, the probe is the rendered worker's
readiness probe, and the queue itself is reached through the same URL.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import redis

from tests.waiting import wait_for
from warmpool.cluster.local import free_port
from warmpool.queue import Layout
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "overlays" / "example"

pytestmark = pytest.mark.redis


def openssl(*args: str) -> None:
    out = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    d.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name}", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    return d / "ca.crt", d / "ca.key"


class TlsRedis:
    def __init__(self, url: str, ca: Path, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.ca, self.proc = url, ca, proc


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    server = shutil.which("redis-server")
    assert server, "redis-server is needed (.ci/run installs it)"
    ca, ca_key = make_ca(tmp_path / "ca", "warmpool-test-ca")
    key, csr, crt = tmp_path / "server.key", tmp_path / "server.csr", tmp_path / "server.crt"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
            str(key), "-out", str(csr))
    ext = tmp_path / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt))
    password = secrets.token_hex(16)
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(crt), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
         "--tls-auth-clients", "no", "--requirepass", password, "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = (f"rediss://:{password}@127.0.0.1:{port}/0"
           f"?ssl_cert_reqs=required&ssl_ca_certs={ca}")
    try:
        wait_for(lambda: connect(url).ping(), timeout=20, ignore=(redis.RedisError,),
                 message="the TLS redis-server")
        yield TlsRedis(url, ca, proc)
    finally:
        proc.terminate()
        proc.wait(10)


def documented_url() -> str:
    text = (EXAMPLE / "kustomization.yaml").read_text()
    (url,) = re.findall(r"rediss://[^'\s]+", text)
    return url


def as_documented(tls: TlsRedis) -> str:
    """The overlay's URL with this server's address and password, and the CA where the
    overlay mounts it (/etc/warmpool/redis-tls) mapped to this machine's file."""
    from tests.unit.test_deploy_manifests import kustomize

    objs = kustomize(EXAMPLE)
    worker = next(o for o in objs if o["kind"] == "Deployment"
                  and o["metadata"]["name"] == "warmpool-worker")
    (c,) = worker["spec"]["template"]["spec"]["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "redis-tls")["mountPath"]
    doc = urlsplit(documented_url())
    query = parse_qs(doc.query)
    assert query["ssl_cert_reqs"] == ["required"]
    assert query["ssl_ca_certs"] == [f"{mount}/ca.crt"]
    ours = urlsplit(tls.url)
    return doc._replace(netloc=ours.netloc,
                        query=doc.query.replace(f"{mount}/ca.crt", str(tls.ca))).geturl()


def readiness(url: str) -> int:
    """0 when the workers' readiness check (their /readyz: `workers.health.redis_ping`)
    passes on `url`, as the kubelet's probe would see it; 1 when it fails."""
    from workers.health import redis_ping

    try:
        return 0 if redis_ping(url)() else 1
    except redis.exceptions.RedisError:
        return 1


def test_the_documented_url_reaches_a_password_and_tls_redis(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    url = as_documented(tls_redis)
    assert readiness(url) == 0
    # The queue itself through the same URL: a key added and seen.
    settings = QueueSettings(redis_url=url)
    queue = KeyedQueue.from_settings(settings)
    queue.add("instance/ns/java/1")
    dirty = connect(url).smembers(Layout.of(settings).dirty)
    assert dirty == {b"instance/ns/java/1"}


def test_a_wrong_ca_a_wrong_password_or_no_tls_is_refused(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    url = as_documented(tls_redis)
    other_ca, _ = make_ca(tmp_path / "other", "someone-else")
    assert readiness(url.replace(str(tls_redis.ca), str(other_ca))) != 0
    parts = urlsplit(url)
    password = parts.password or ""
    assert password
    assert readiness(url.replace(f":{password}@", ":wrong@")) != 0
    plain = parts._replace(scheme="redis", query="").geturl()
    assert readiness(plain) != 0
