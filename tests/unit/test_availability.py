"""The session URL probe (session-lifecycle.md §2): its schedule, rule and settings, and the
runner driven by a manual clock and a scripted fetch (no network, no sleeps)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from tests.waiting import wait_for
from warmpool.controller.availability import ProbeRunner
from warmpool.pool.availability import (
    DEFAULT_SCHEDULE,
    GIVE_UP_ERROR,
    ProbeSettings,
    ProbeTarget,
    Readiness,
    Schedule,
    session_url,
)

# -- the schedule


def test_the_default_schedule_is_javas_309_attempts_over_an_hour() -> None:
    s = DEFAULT_SCHEDULE
    assert s.attempts == 309
    assert s.total == 3600
    assert [s.delay_before(n) for n in (1, 60)] == [0.5, 0.5]
    assert [s.delay_before(n) for n in (61, 120)] == [1, 1]
    assert [s.delay_before(n) for n in (121, 144)] == [2.5, 2.5]
    assert [s.delay_before(n) for n in (145, 204)] == [5, 5]
    assert [s.delay_before(n) for n in (205, 309)] == [30, 30]
    assert str(s) == "60x0.5,60x1,24x2.5,60x5,105x30"
    assert Schedule.parse(str(s)) == s
    with pytest.raises(IndexError):
        s.delay_before(310)
    with pytest.raises(IndexError):
        s.delay_before(0)


def test_a_schedule_is_parsed_from_its_compact_form() -> None:
    s = Schedule.parse(" 2x0.25 , 1x3,1x0 ")
    assert s.delays == (0.25, 0.25, 3.0, 0.0)
    assert s.attempts == 4 and s.total == 3.5
    assert str(s) == "2x0.25,1x3,1x0"
    assert Schedule.parse("3x1,2x1") == Schedule.parse("5x1")
    odd = Schedule((0.1, 0.30000000000000004))
    assert Schedule.parse(str(odd)) == odd  # the compact form reads back exactly


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty probe schedule: expected <attempts>x<seconds>,..., e.g. 60x0.5,60x1,24x2.5,"
         "60x5,105x30"),
    ("  ", "empty probe schedule"),
    ("60", "probe schedule '60', group 1 ('60'): expected <attempts>x<seconds>, e.g. 60x0.5"),
    ("60x0.5,", "probe schedule '60x0.5,', group 2 (''): expected <attempts>x<seconds>"),
    ("60x", "group 1 ('60x'): expected <attempts>x<seconds>"),
    ("x1", "group 1 ('x1'): expected <attempts>x<seconds>"),
    ("60X1", "group 1 ('60X1'): expected <attempts>x<seconds>"),
    ("0x1", "group 1 ('0x1'): attempts must be a whole number >= 1, not '0'"),
    ("1.5x1", "group 1 ('1.5x1'): attempts must be a whole number >= 1, not '1.5'"),
    ("-2x1", "attempts must be a whole number >= 1, not '-2'"),
    ("1x1,2xabc", "probe schedule '1x1,2xabc', group 2 ('2xabc'): seconds must be a finite "
                  "number >= 0, not 'abc'"),
    ("2x-1", "seconds must be a finite number >= 0, not '-1'"),
    ("2xnan", "seconds must be a finite number >= 0, not 'nan'"),
    ("2xinf", "seconds must be a finite number >= 0, not 'inf'"),
    ("2x1x1", "seconds must be a finite number >= 0, not '1x1'"),
    ("100001x1", "probe schedule '100001x1': more than 100000 attempts"),
])
def test_a_bad_schedule_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        Schedule.parse(text)
    assert message in str(err.value)


def test_a_schedule_needs_an_attempt_and_sane_delays() -> None:
    with pytest.raises(ValueError, match="at least one attempt"):
        Schedule(())
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        Schedule((1.0, -0.5))


# -- the rule


@pytest.mark.parametrize(("statuses", "ready_at"), [
    ([200], 1),
    ([404, 500, 503, 200], 4),
    ([None, None, 200], 3),
    ([302, 503], 2),  # a status outside {404, 500, 503} arms; the next status of any kind wins
    ([302, 404], 2),
    ([401, 500], 2),
    ([403, 302], 2),
    ([302, None, None, 503], 4),  # attempts without a status neither count nor disarm
    ([404, 503, 500, 404], None),  # the "not there yet" statuses never arm
    ([None, None, None], None),
    ([502], None),  # armed, but no next attempt
    ([201, 200], 2),
])
def test_the_decision_rule(statuses: list[int | None], ready_at: int | None) -> None:
    state = Readiness()
    got = None
    for n, status in enumerate(statuses, start=1):
        ready, state = state.observe(status)
        if ready:
            got = n
            break
    assert got == ready_at


def test_the_rule_state_is_immutable() -> None:
    fresh = Readiness()
    ready, armed = fresh.observe(302)
    assert not ready and armed.primed and not fresh.primed
    assert armed.observe(None) == (False, armed)
    assert fresh.observe(503) == (False, fresh)


# -- the URL and the settings


@pytest.mark.parametrize(("host", "path", "url"), [
    ("instance.theia.example.org", "/java-17-latest-1",
     "instance.theia.example.org/java-17-latest-1/"),
    ("instance.example.org", "/instances/java_17-1/", "instance.example.org/instances/java_17-1/"),
    ("localhost:8443", "/a-1", "localhost:8443/a-1/"),
])
def test_the_session_url_has_no_scheme_and_a_trailing_slash(host: str, path: str, url: str
                                                            ) -> None:
    assert session_url(host, path) == url


def test_settings_default_to_javas_schedule_with_the_probe_on() -> None:
    s = ProbeSettings.from_env({"PATH": "/bin", "WARMPOOL_URL_PROBE_SCHEDULE": "  "})
    assert s == ProbeSettings()
    assert s.enabled and s.ca_bundle is None and s.schedule == DEFAULT_SCHEDULE
    assert s.timeout == 5.0


def test_settings_from_the_environment() -> None:
    s = ProbeSettings.from_env({
        "WARMPOOL_URL_PROBE": " Off ", "WARMPOOL_URL_PROBE_CA_BUNDLE": "/etc/ca/gateway.pem",
        "WARMPOOL_URL_PROBE_SCHEDULE": "3x0.1,1x2", "WARMPOOL_URL_PROBE_TIMEOUT": "2.5",
    })
    assert s == ProbeSettings(enabled=False, ca_bundle="/etc/ca/gateway.pem",
                              schedule=Schedule((0.1, 0.1, 0.1, 2.0)), timeout=2.5)
    assert ProbeSettings.from_env({"WARMPOOL_URL_PROBE": "ON"}).enabled


@pytest.mark.parametrize(("name", "value", "message"), [
    ("WARMPOOL_URL_PROBE", "yes", "WARMPOOL_URL_PROBE must be 'on' or 'off', not 'yes'"),
    ("WARMPOOL_URL_PROBE", "1", "WARMPOOL_URL_PROBE must be 'on' or 'off', not '1'"),
    ("WARMPOOL_URL_PROBE_SCHEDULE", "60x", "WARMPOOL_URL_PROBE_SCHEDULE: probe schedule '60x', "
                                           "group 1 ('60x'): expected <attempts>x<seconds>"),
    ("WARMPOOL_URL_PROBE_TIMEOUT", "0", "WARMPOOL_URL_PROBE_TIMEOUT must be a number of "
                                        "seconds > 0, not '0'"),
    ("WARMPOOL_URL_PROBE_TIMEOUT", "5s", "WARMPOOL_URL_PROBE_TIMEOUT must be a number of "
                                         "seconds > 0, not '5s'"),
    ("WARMPOOL_URL_PROBE_TIMEOUT", "-1", "WARMPOOL_URL_PROBE_TIMEOUT must be"),
    ("WARMPOOL_URL_PROBE_TIMEOUT", "inf", "WARMPOOL_URL_PROBE_TIMEOUT must be"),
])
def test_bad_settings_name_their_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        ProbeSettings.from_env({name: value})
    assert str(err.value).startswith(message)


def test_settings_refuse_a_bad_timeout() -> None:
    with pytest.raises(ValueError, match="probe timeout"):
        ProbeSettings(timeout=0)


# -- the runner, on a manual clock


def soon(predicate: Callable[[], object], message: str = "") -> object:
    """The runner's threads act within milliseconds here: poll often."""
    return wait_for(predicate, timeout=5, interval=0.002, message=message)


class ManualClock:
    """Time stands still until the test moves it. `deadline` is when the runner's timer
    asked to be woken (None: it waits for a submit), so a test moves time to the next due
    attempt exactly, and can read the delays the runner chose."""

    def __init__(self) -> None:
        self.t = 0.0
        self.deadline: float | None = None
        self._conds: set[threading.Condition] = set()

    def now(self) -> float:
        return self.t

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        self._conds.add(cond)
        self.deadline = None if timeout is None else self.t + timeout
        cond.wait()

    def advance_to_deadline(self) -> float:
        """Move to the timer's deadline (once it has one) and wake it; returns the step."""
        deadline = soon(lambda: self.deadline, "a due attempt")
        step = deadline - self.t
        self.t, self.deadline = deadline, None
        for cond in self._conds:
            with cond:
                cond.notify_all()
        return step


class Script:
    """A fetch that answers each URL's attempts from a list (then None), and the writes."""

    def __init__(self, answers: list[int | None], holds: bool = True) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.writes: list[tuple[str, str]] = []
        self.holds = holds
        self.fail_writes = 0

    def fetch(self, url: str) -> int | None:
        n = len(self.calls)
        self.calls.append(url)
        return self.answers[n] if n < len(self.answers) else None

    def write_url(self, target: ProbeTarget) -> None:
        if self.fail_writes:
            self.fail_writes -= 1
            raise RuntimeError("API server unavailable")
        self.writes.append(("url", target.uid))

    def give_up(self, target: ProbeTarget) -> None:
        self.writes.append(("give_up", target.uid))

    def still_holds(self, target: ProbeTarget) -> bool:
        return self.holds


TARGET = ProbeTarget(namespace="ns1", session="s1", uid="uid-1", instance=3,
                     url="instance.example.org/java-app-3/", app_definition="java")


@pytest.fixture
def run() -> Iterator[Callable[..., tuple[ProbeRunner, ManualClock]]]:
    made: list[ProbeRunner] = []

    def make(script: Script, schedule: str = "2x0.5,2x1,1x30") -> tuple[ProbeRunner, ManualClock]:
        clock = ManualClock()
        runner = ProbeRunner(ProbeSettings(schedule=Schedule.parse(schedule)),
                             still_holds=script.still_holds, write_url=script.write_url,
                             give_up=script.give_up, fetch=script.fetch, clock=clock, workers=2)
        made.append(runner)
        return runner, clock

    yield make
    for runner in made:
        runner.stop(timeout=5)


def drive(runner: ProbeRunner, clock: ManualClock, script: Script) -> list[float]:
    """Run `TARGET`'s probe to its end, attempt by attempt; the delays the timer waited."""
    steps: list[float] = []
    while runner.probing(TARGET.namespace, TARGET.uid):
        before = len(script.calls)
        steps.append(clock.advance_to_deadline())
        soon(lambda b=before: len(script.calls) > b, "the attempt's GET")
        # The attempt's outcome: the probe over, or its next attempt scheduled.
        soon(lambda: runner.in_flight() == 0, "the attempt's outcome")
    return steps


def test_a_200_writes_the_url_once_on_the_schedules_delays(run) -> None:
    script = Script([None, 503, 200])
    runner, clock = run(script)
    assert runner.submit(TARGET)
    assert drive(runner, clock, script) == [0.5, 0.5, 1.0]
    assert script.calls == [TARGET.url] * 3
    assert script.writes == [("url", "uid-1")]
    assert len(runner) == 0


def test_a_second_submit_of_a_running_probe_is_a_no_op(run) -> None:
    script = Script([404, 404, 200])
    runner, clock = run(script)
    assert runner.submit(TARGET)
    assert not runner.submit(TARGET)
    assert not runner.submit(ProbeTarget("ns1", "s1", "uid-1", 3, "other.example.org/x/"))
    assert len(runner) == 1
    drive(runner, clock, script)
    assert script.calls == [TARGET.url] * 3 and script.writes == [("url", "uid-1")]
    assert runner.submit(TARGET)  # once over, the same Session may be probed again


def test_an_armed_flag_makes_the_next_status_ready(run) -> None:
    script = Script([302, None, 503])
    runner, clock = run(script)
    runner.submit(TARGET)
    drive(runner, clock, script)
    assert len(script.calls) == 3 and script.writes == [("url", "uid-1")]


def test_a_schedule_that_never_answers_gives_up_after_its_last_attempt(run) -> None:
    script = Script([503] * 10)
    runner, clock = run(script)
    runner.submit(TARGET)
    assert drive(runner, clock, script) == [0.5, 0.5, 1.0, 1.0, 30.0]
    assert len(script.calls) == 5
    assert script.writes == [("give_up", "uid-1")]


def test_a_session_that_no_longer_holds_its_instance_is_neither_probed_nor_written(
    run,
) -> None:
    for answers in ([200], [503] * 5):
        script = Script(answers, holds=False)
        runner, clock = run(script)
        runner.submit(TARGET)
        clock.advance_to_deadline()
        soon(lambda runner=runner: len(runner) == 0, "the probe to end")
        assert script.calls == [] and script.writes == []


def test_a_probe_ends_at_the_first_attempt_after_its_session_lets_go(run) -> None:
    script = Script([503] * 5)
    runner, clock = run(script)
    runner.submit(TARGET)
    clock.advance_to_deadline()
    soon(lambda: len(script.calls) == 1 and runner.in_flight() == 0, "the first GET")
    script.holds = False  # released: the next attempt sends no GET and ends the probe
    clock.advance_to_deadline()
    soon(lambda: len(runner) == 0, "the probe to end")
    assert len(script.calls) == 1 and script.writes == []


def test_a_failed_write_is_tried_again_after_the_next_get(run) -> None:
    script = Script([200, 200, 200])
    script.fail_writes = 1
    runner, clock = run(script)
    runner.submit(TARGET)
    drive(runner, clock, script)
    assert len(script.calls) == 2 and script.writes == [("url", "uid-1")]


def test_a_fetch_that_raises_counts_as_no_status(run) -> None:
    script = Script([None, 200])

    def fetch(url: str) -> int | None:
        status = script.fetch(url)
        if len(script.calls) == 1:
            raise ConnectionError("boom")
        return status

    clock = ManualClock()
    runner = ProbeRunner(ProbeSettings(schedule=Schedule.parse("3x1")),
                         still_holds=script.still_holds, write_url=script.write_url,
                         give_up=script.give_up, fetch=fetch, clock=clock)
    try:
        runner.submit(TARGET)
        drive(runner, clock, script)
        assert len(script.calls) == 2 and script.writes == [("url", "uid-1")]
    finally:
        runner.stop(timeout=5)


def test_probes_of_several_sessions_interleave_on_one_timer(run) -> None:
    script = Script([])  # no status, ever: both run to their last attempt
    runner, clock = run(script, "3x1")
    other = ProbeTarget("ns1", "s2", "uid-2", 4, "instance.example.org/java-app-4/")
    runner.submit(TARGET)
    clock.advance_to_deadline()
    soon(lambda: len(script.calls) == 1 and runner.in_flight() == 0)
    runner.submit(other)  # due at t=2, as TARGET's second attempt
    for calls in (3, 5, 6):  # both at t=2 and t=3, the other alone at t=4
        clock.advance_to_deadline()
        soon(lambda n=calls: len(script.calls) == n)
        soon(lambda: runner.in_flight() == 0)
    assert len(runner) == 0
    assert sorted(script.writes) == [("give_up", "uid-1"), ("give_up", "uid-2")]
    assert clock.t == 4.0  # TARGET at 1, 2, 3; the other at 2, 3, 4


def test_cancel_and_stop_end_probes_without_a_write(run) -> None:
    script = Script([200])
    runner, _ = run(script)
    runner.submit(TARGET)
    assert runner.cancel("ns1", "uid-1") and not runner.cancel("ns1", "uid-1")
    runner.submit(ProbeTarget("ns1", "s2", "uid-2", 4, "x.example.org/a-4/"))
    runner.stop(timeout=5)
    assert len(runner) == 0 and not runner.submit(TARGET)
    assert script.calls == [] and script.writes == []


def test_the_give_up_error_is_the_services_own() -> None:
    assert GIVE_UP_ERROR == "551:Unable to launch session within time limit."
