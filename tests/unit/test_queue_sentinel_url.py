"""redis+sentinel:// URLs: the grammar, the client they make (no server needed: a Sentinel
client connects lazily), the failover retry budget, and that the CLI never shows their
passwords."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from warmpool import config
from warmpool.queue import redis_conn
from warmpool.queue.redis_conn import (
    FailoverRetry,
    SentinelURL,
    connect,
    is_sentinel_url,
    parse_sentinel_url,
)


def test_hosts_service_and_db() -> None:
    spec = parse_sentinel_url("redis+sentinel://s1:26380,s2,[::1]:26381/mymaster/2")
    assert spec == SentinelURL(sentinels=(("s1", 26380), ("s2", 26379), ("::1", 26381)),
                               service="mymaster", db=2)


def test_credentials_are_the_data_nodes_and_the_sentinels_have_their_own() -> None:
    spec = parse_sentinel_url("redis+sentinel://app:p%40ss%2Fw@s1/svc"
                              "?sentinel_username=sent&sentinel_password=s3cret")
    assert (spec.username, spec.password) == ("app", "p@ss/w")  # percent-decoded
    assert (spec.sentinel_username, spec.sentinel_password) == ("sent", "s3cret")
    assert spec.options == {}  # the Sentinel credentials are not data-node options
    assert parse_sentinel_url("redis+sentinel://:pw@s1/svc").username is None


def test_query_options_are_parsed_by_redis_py() -> None:
    spec = parse_sentinel_url("redis+sentinel://s1/svc/1?socket_timeout=2.5"
                              "&health_check_interval=5&db=4")
    assert spec.options == {"socket_timeout": 2.5, "health_check_interval": 5}
    assert spec.db == 4  # ?db= wins over the path, as on redis:// URLs


def test_tls_scheme_and_case() -> None:
    spec = parse_sentinel_url("REDISS+SENTINEL://s1/svc?ssl_cert_reqs=required")
    assert spec.tls and spec.options == {"ssl_cert_reqs": "required"}
    assert is_sentinel_url("Redis+Sentinel://s1/svc")
    assert not is_sentinel_url("redis://h:6379/0")
    assert not is_sentinel_url("unix:///tmp/sock")


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel://s1:26379", "no service name"),
    ("redis+sentinel://s1:26379/", "no service name"),
    ("redis+sentinel:///svc", "no Sentinel host"),
    ("redis+sentinel://s1:notaport/svc", "no valid port"),
    ("redis+sentinel://s1:70000/svc", "no valid port"),
    ("redis+sentinel://s1/svc/zero", "not a number"),
    ("redis+sentinel://s1/svc/0/extra", "too many path segments"),
    ("redis://s1/svc", r"starts with redis\+sentinel://"),
])
def test_malformed_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


def test_connect_makes_a_master_for_client_without_touching_the_network() -> None:
    client = connect("redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/svc/3"
                     "?sentinel_password=sp")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "svc" and pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"]) == (3, "pw")
    assert isinstance(kwargs["retry"], FailoverRetry)
    assert kwargs["retry"].budget == redis_conn.FAILOVER_WAIT
    assert issubclass(pool.connection_class, redis_conn._SentinelConnection)
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
    sent = sentinels[0].connection_pool.connection_kwargs
    assert sent["password"] == "sp"  # the Sentinels' password, not the data nodes'
    assert sent["socket_connect_timeout"] == 5.0  # the same connect timeout as the data nodes


def test_caller_options_and_failover_wait_reach_the_sentinel_client() -> None:
    client = connect("redis+sentinel://127.0.0.1:1/svc", socket_timeout=10.0,
                     failover_wait=2.0)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 10.0 and kwargs["retry"].budget == 2.0
    # a plain URL ignores failover_wait rather than handing it to redis-py
    assert connect("redis://127.0.0.1:1/0", failover_wait=2.0).connection_pool


class _Clock:
    """time.monotonic and time.sleep for the retry: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(redis_conn.time, "monotonic", c.monotonic)
    monkeypatch.setattr(redis_conn.time, "sleep", c.sleep)
    return c


def test_failover_retry_rides_through_until_the_new_primary_answers(clock: _Clock) -> None:
    failures = iter([redis.ConnectionError("refused")] * 15)
    disconnects: list[Exception] = []

    def attempt() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "PONG"

    assert FailoverRetry(10.0).call_with_retry(attempt, disconnects.append) == "PONG"
    assert len(disconnects) == 15  # every failure closed the connection before the next try
    assert max(clock.slept) <= 0.5  # capped backoff: the new primary is found soon after


def test_failover_retry_gives_up_after_its_budget(clock: _Clock) -> None:
    calls = 0

    def attempt() -> str:
        nonlocal calls
        calls += 1
        raise redis.ConnectionError("no master")

    start = clock.now
    with pytest.raises(redis.ConnectionError, match="no master"):
        FailoverRetry(3.0).call_with_retry(attempt, lambda e: None)
    assert clock.now - start == pytest.approx(3.0)
    assert calls > 6  # many quick tries, not a handful of long waits


def test_failover_retry_does_not_retry_command_errors(clock: _Clock) -> None:
    calls = 0

    def attempt() -> str:
        nonlocal calls
        calls += 1
        raise redis.ResponseError("WRONGTYPE")

    with pytest.raises(redis.ResponseError):
        FailoverRetry(3.0).call_with_retry(attempt, lambda e: None)
    assert calls == 1 and clock.slept == []


def test_the_cli_never_shows_sentinel_passwords() -> None:
    url = "redis+sentinel://:pw@s1:26379,s2:26379/svc/0?sentinel_password=sp&socket_timeout=1"
    assert config.redact_url(url) == ("redis+sentinel://:***@s1:26379,s2:26379/svc/0"
                                      "?sentinel_password=***&socket_timeout=1")
    assert config.redact_url("rediss+sentinel://u:pw@s1/svc") == "rediss+sentinel://u:***@s1/svc"
    assert config.redact_url("redis://h/0?password=pw") == "redis://h/0?password=***"


def test_the_cli_calls_a_malformed_sentinel_url_a_bad_value() -> None:
    with pytest.raises(config.BadValue, match=r"no service name.*redis\+sentinel://") as exc:
        config.connect_redis("redis+sentinel://:pw@s1:26379", "--redis-url")
    assert ":pw@" not in exc.value.message and ":***@" in exc.value.message
