"""`scheduler.cli`: options, defaults and the SIGTERM path, with the run loop faked."""

from __future__ import annotations

import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from scheduler import cli


def test_parse_namespaces() -> None:
    assert cli.parse_namespaces(()) is None
    assert cli.parse_namespaces(("",)) is None
    assert cli.parse_namespaces(("a,b", "c", " b ,d,")) == ["a", "b", "c", "d"]


class FakeScheduler:
    made: list[FakeScheduler] = []
    checked: list[tuple[Any, ...]] = []  # check_servers' arguments, one entry per run

    def __init__(self, kube_factory: Any, producer: Any, config: Any,
                 epoch: Any = None) -> None:
        self.config = config
        self.producer = producer
        self.epoch = epoch
        self.started = self.stopped = False
        FakeScheduler.made.append(self)

    def start(self) -> FakeScheduler:
        self.started = True
        # What a SIGTERM from outside does, once the command waits.
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return self

    def stop(self) -> None:
        self.stopped = True

    def healthy(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.stopped

    def status(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeScheduler]]:
    FakeScheduler.made.clear()
    FakeScheduler.checked.clear()
    monkeypatch.setattr(cli, "Scheduler", FakeScheduler)
    monkeypatch.setattr(cli, "check_servers",
                        lambda *args, **kw: FakeScheduler.checked.append((args, kw)))
    monkeypatch.setattr(cli, "schedules_served", lambda kubeconfig: True)
    monkeypatch.setattr(cli, "settled_routes", lambda kubeconfig, pool: pool)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield FakeScheduler
    for s, h in handlers.items():
        signal.signal(s, h)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    base = {"WARMPOOL_NAMESPACE": "", "WARMPOOL_LEASE_NAMESPACE": "",
            "WARMPOOL_REDIS_URL": "redis://127.0.0.1:1/0", "KUBECONFIG": "/nonexistent"}
    return CliRunner().invoke(cli.scheduler, ["--health-port", "0", *args],
                              env={**base, **(env or {})}, catch_exceptions=False)


def test_namespaces_from_the_environment_and_lease_defaults(fake) -> None:
    result = invoke([], env={"WARMPOOL_NAMESPACE": "team-a,team-b"})
    assert result.exit_code == 0, result.output
    (s,) = fake.made
    assert s.started and s.stopped
    assert list(s.config.namespaces) == ["team-a", "team-b"]
    lead = s.config.leader
    assert lead.namespace == "team-a" and lead.name == "warmpool-scheduler"
    assert (lead.lease_duration, lead.renew_deadline, lead.retry_period) == (15, 10, 2)
    assert str(os.getpid()) in lead.identity
    assert s.config.resync_period == 60 and s.config.watch_timeout == (300, 600)
    # The scheduler creates the Redis epoch and reads it every epoch_period (2 s).
    assert s.epoch is not None and s.epoch.create and s.config.epoch_period == 2.0
    assert s.epoch.key == s.producer.layout.epoch
    assert "health=http://127.0.0.1:" in result.output
    assert "namespaces=team-a,team-b" in result.output
    # Checked before starting: the watched namespaces and the Lease's, Redis, Theia Cloud's
    # kinds, then what the settled routing needs (here kept at httproute: the HTTPRoute CRD).
    from warmpool.kube import kinds
    from warmpool.pool.builders import PoolSettings

    assert fake.checked == [(("redis://127.0.0.1:1/0",), {
        "kube": True, "kubeconfig": "/nonexistent",
        "namespaces": ["team-a", "team-b", "team-a"],
        "kinds": kinds.theia()}),
        ((None,), {"kube": True, "kubeconfig": "/nonexistent",
                   "kinds": kinds.required(PoolSettings())})]
    assert ("gateway.networking.k8s.io/v1", "HTTPRoute") in {
        k[:2] for k in kinds.required(PoolSettings())}
    assert ("gateway.networking.k8s.io/v1", "HTTPRoute") not in {
        k[:2] for k in kinds.required(PoolSettings(routes="none"))}


def test_all_namespaces_lease_in_default_or_configured(fake) -> None:
    assert invoke([]).exit_code == 0
    assert fake.made[-1].config.namespaces is None
    assert fake.made[-1].config.leader.namespace == "default"
    assert invoke([], env={"WARMPOOL_LEASE_NAMESPACE": "ops"}).exit_code == 0
    assert fake.made[-1].config.leader.namespace == "ops"
    assert invoke(["-n", "x", "--lease-namespace", "y", "--lease-duration", "30",
                   "--renew-deadline", "20", "--retry-period", "5", "--identity", "me",
                   "--resync-period", "60", "--queue", "q2"]).exit_code == 0
    s = fake.made[-1]
    assert s.config.leader.namespace == "y" and s.config.leader.identity == "me"
    assert (s.config.leader.lease_duration, s.config.leader.renew_deadline,
            s.config.leader.retry_period) == (30, 20, 5)
    assert s.config.resync_period == 60 and s.producer.settings.queue_name == "q2"


def test_no_leader_election(fake) -> None:
    assert invoke(["--no-leader-elect"]).exit_code == 0
    assert fake.made[-1].config.leader is None


@pytest.mark.parametrize("args", [["--lease-duration", "10"],
                                  ["--renew-deadline", "1.5"],
                                  ["--resync-period", "0"],
                                  ["--watch-timeout", "10", "5"]])
def test_bad_timings_are_refused(fake, args: list[str]) -> None:
    result = CliRunner().invoke(cli.scheduler, ["--health-port", "0", *args],
                                env={"WARMPOOL_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.exit_code == 2 and fake.made == []


def test_health_endpoints_are_served(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, int] = {}

    def start(self: FakeScheduler) -> FakeScheduler:
        self.started = True

        def probe() -> None:
            import re
            for line in out_lines:
                m = re.search(r"health=(http://\S+)", line)
                if m:
                    for path in ("/healthz", "/readyz", "/status"):
                        with urllib.request.urlopen(m.group(1) + path, timeout=5) as r:
                            seen[path] = r.status
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Timer(0.2, probe).start()
        return self

    out_lines: list[str] = []
    monkeypatch.setattr(FakeScheduler, "start", start)
    monkeypatch.setattr(cli.click, "echo", lambda msg="", **kw: out_lines.append(str(msg)))
    assert invoke([]).exit_code == 0
    assert seen == {"/healthz": 200, "/readyz": 200, "/status": 200}


def test_the_scheduler_runs_no_timers(fake) -> None:
    """Issue #29: timeouts and schedules are the workers' keyed jobs; the scheduler's config
    has no timer to set, and a timeout setting is not its to read."""
    assert invoke([], env={"WARMPOOL_ACTIVITY_TRACKER": "sometimes"}).exit_code == 0
    config = fake.made[-1].config
    assert not hasattr(config, "timeouts") and not hasattr(config, "schedule_margin")


def test_the_worker_refuses_a_bad_timeout_setting_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType,
) -> None:
    monkeypatch.setenv("WARMPOOL_ACTIVITY_TRACKER", "sometimes")
    with pytest.raises(ValueError, match="WARMPOOL_ACTIVITY_TRACKER must be on or off, "
                                         "got 'sometimes'"):
        handlers.check_settings()
