"""The session URL probe (session-lifecycle.md §2): its schedule, rule and settings, and the
keyed job run as the queue runs it, on a manual clock and a scripted fetch (no network, no
sleeps)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from warmpool.controller.availability import ProbeKeys, ProbeState, probe_url
from warmpool.controller.result import Outcome, Result
from warmpool.keys import ProbeKey
from warmpool.pool import vocabulary as v
from warmpool.pool.availability import (
    DEFAULT_SCHEDULE,
    GIVE_UP_ERROR,
    ProbeSettings,
    ProbeTarget,
    Readiness,
    Schedule,
    session_url,
)
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import AppDefinition, Session, parse_appdefinition, parse_session
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

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


# -- the keyed job (issue #29), on a manual clock and a scripted fetch


class Script:
    """A fetch that answers each attempt from a list (then None), and the writes."""

    def __init__(self, answers: list[int | None]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.writes: list[tuple[str, str]] = []
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


class States:
    """`ProbeStates` in memory, on a clock the test moves."""

    def __init__(self) -> None:
        self.t_ms = 0
        self.kept: dict[tuple[str, str], ProbeState] = {}

    def now_ms(self) -> int:
        return self.t_ms

    def get(self, namespace: str, uid: str) -> ProbeState | None:
        return self.kept.get((namespace, uid))

    def put(self, namespace: str, uid: str, state: ProbeState, ttl: float) -> None:
        self.kept[(namespace, uid)] = state

    def drop(self, namespace: str, uid: str) -> None:
        self.kept.pop((namespace, uid), None)


def _appdef() -> AppDefinition:
    body = appdef_body("ns1", "java", appdef_spec("java"))
    body["metadata"].update(uid="uid-java", generation=1)
    parsed = parse_appdefinition(body)
    assert isinstance(parsed, AppDefinition), parsed
    return parsed


APPDEF = _appdef()


class Holder:
    """The job's reader: Session s1 (uid-1) holding instance 3 of `java`, until `lets_go`."""

    def __init__(self) -> None:
        self.holds = True
        self.url = ""

    def session(self, namespace: str, name: str, *, fresh: bool = False) -> Session | None:
        body = session_body("ns1", "s1", session_spec("s1", "jane@example.com", "java"))
        body["metadata"].update(uid="uid-1", annotations={v.ANNOTATION_INSTANCE_ID: "3"})
        body["status"] = {"operatorStatus": "HANDLED", "url": self.url}
        return parse_session(body) if name == "s1" else None

    def holdings(self, namespace: str, uid: str) -> list[tuple[str, int]]:
        return [("java", 3)] if self.holds and uid == "uid-1" else []

    def appdef(self, namespace: str, name: str, **kw: object) -> AppDefinition | None:
        return APPDEF if name == "java" else None


KEY = ProbeKey("ns1", "s1")
SETTINGS = PoolSettings()


def run_once(reader: Holder, script: Script, states: States, schedule: str,
             fetch: Callable[[str], int | None] | None = None) -> Result:
    return probe_url(reader, KEY, SETTINGS,  # type: ignore[arg-type]
                     ProbeSettings(schedule=Schedule.parse(schedule)), states=states,
                     writes=script, fetch=fetch or script.fetch)


def drive(script: Script, schedule: str = "2x0.5,2x1,1x30", reader: Holder | None = None,
          fetch: Callable[[str], int | None] | None = None) -> list[float]:
    """Run the probe key to its end as the queue would, each run at its `requeue_after`;
    the delays it asked for."""
    reader, states, delays = reader or Holder(), States(), []
    while True:
        result = run_once(reader, script, states, schedule, fetch)
        if result.requeue_after is None:
            return delays
        delays.append(result.requeue_after)
        states.t_ms += int(result.requeue_after * 1000)


def test_a_200_writes_the_url_once_on_the_schedules_delays() -> None:
    script = Script([None, 503, 200])
    assert drive(script) == [0.5, 0.5, 1.0]
    assert script.calls == [SETTINGS.session_url(APPDEF, 3)] * 3
    assert script.writes == [("url", "uid-1")]


def test_a_run_before_its_attempt_is_due_only_waits_the_rest() -> None:
    """An instance's reconcile queues the key again: that run sends no GET."""
    script, states, reader = Script([503, 200]), States(), Holder()
    assert run_once(reader, script, states, "3x1").requeue_after == 1.0
    states.t_ms = 400
    early = run_once(reader, script, states, "3x1")
    assert early.outcome is Outcome.SCHEDULED and early.requeue_after == 0.6
    assert script.calls == []


def test_an_armed_flag_makes_the_next_status_ready() -> None:
    script = Script([302, None, 503])
    drive(script)
    assert len(script.calls) == 3 and script.writes == [("url", "uid-1")]


def test_a_schedule_that_never_answers_gives_up_after_its_last_attempt() -> None:
    script = Script([503] * 10)
    assert drive(script) == [0.5, 0.5, 1.0, 1.0, 30.0]
    assert len(script.calls) == 5
    assert script.writes == [("give_up", "uid-1")]


def test_a_session_that_no_longer_holds_its_instance_is_neither_probed_nor_written() -> None:
    for answers in ([200], [503] * 5):
        script, reader = Script(answers), Holder()
        reader.holds = False
        assert drive(script, reader=reader) == []
        assert script.calls == [] and script.writes == []


def test_a_probe_ends_at_the_first_run_after_its_session_lets_go() -> None:
    script, states, reader = Script([503] * 5), States(), Holder()
    states.t_ms += int(run_once(reader, script, states, "3x1").requeue_after * 1000)  # type: ignore[operator]
    assert run_once(reader, script, states, "3x1").requeue_after == 1.0
    assert len(script.calls) == 1
    reader.holds = False  # released: the next run sends no GET and ends the probe
    states.t_ms += 1000
    ended = run_once(reader, script, states, "3x1")
    assert ended.outcome is Outcome.SKIPPED and ended.requeue_after is None
    assert len(script.calls) == 1 and script.writes == []


def test_a_failed_write_is_tried_again_after_the_next_get() -> None:
    script = Script([200, 200, 200])
    script.fail_writes = 1
    drive(script)
    assert len(script.calls) == 2 and script.writes == [("url", "uid-1")]


def test_a_fetch_that_raises_counts_as_no_status() -> None:
    script = Script([None, 200])

    def fetch(url: str) -> int | None:
        status = script.fetch(url)
        if len(script.calls) == 1:
            raise ConnectionError("boom")
        return status

    drive(script, "3x1", fetch=fetch)
    assert len(script.calls) == 2 and script.writes == [("url", "uid-1")]


def test_an_instances_plan_names_the_probe_key_as_a_follow_up() -> None:
    probes = ProbeKeys()
    target = ProbeTarget("ns1", "s1", "uid-1", 3, "instance.example.org/java-app-3/")
    assert probes.submit(target) and probes.submit(target)
    assert probes.follow_ups() == [(KEY, None)]


def test_the_give_up_error_is_the_services_own() -> None:
    assert GIVE_UP_ERROR == "551:Unable to launch session within time limit."
