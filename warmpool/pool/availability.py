"""When a claimed Session's URL may be written: the probe's schedule, rule and settings.

Pure: the GETs, the timer and the writes are `warmpool.controller.availability`'s. The contract
is session-lifecycle.md §2: Java EC probes `https://<url>` up to 309 times over an hour and
writes `status.url` once the instance answers; ours does the same with TLS verified, timeouts,
no redirects followed, and a Warning event and `status.error` when it gives up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Java EC's schedule (AddedHandlerUtil.java): the sleep before each of its 309 attempts.
DEFAULT_SCHEDULE_TEXT = "60x0.5,60x1,24x2.5,60x5,105x30"
#: A schedule longer than this is a typo (Java's has 309 attempts).
MAX_ATTEMPTS = 100_000

#: The statuses that set no flag (the instance is not there yet); any other one does.
RETRY_STATUSES = frozenset({404, 500, 503})

#: What the REST service writes when its own wait times out (DefaultSessionResourceClient):
#: ours writes the same when the probe gives up, so the service stops waiting.
GIVE_UP_ERROR = "551:Unable to launch session within time limit."
GIVE_UP_REASON = "URLNotAvailable"

ENV_ENABLED = "WARMPOOL_URL_PROBE"
ENV_CA_BUNDLE = "WARMPOOL_URL_PROBE_CA_BUNDLE"
ENV_SCHEDULE = "WARMPOOL_URL_PROBE_SCHEDULE"
ENV_TIMEOUT = "WARMPOOL_URL_PROBE_TIMEOUT"
DEFAULT_TIMEOUT = 5.0


def _seconds(text: str) -> float | None:
    """A finite, non-negative number of seconds, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True, slots=True, repr=False)
class Schedule:
    """The delay before each attempt: `delays[i]` seconds pass between the previous attempt
    (or the submit, for the first) and attempt i + 1."""

    delays: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.delays:
            raise ValueError("a probe schedule needs at least one attempt")
        if len(self.delays) > MAX_ATTEMPTS:
            raise ValueError(f"a probe schedule has at most {MAX_ATTEMPTS} attempts, "
                             f"not {len(self.delays)}")
        if not all(math.isfinite(d) and d >= 0 for d in self.delays):
            raise ValueError("a probe schedule's delays are finite numbers >= 0")

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """`"<attempts>x<seconds>,..."`, e.g. `"60x0.5,60x1"`: 60 attempts each 0.5 s after the
        one before, then 60 each 1 s after. Whitespace around groups is ignored."""
        if not text.strip():
            raise ValueError("empty probe schedule: expected <attempts>x<seconds>,..., "
                             f"e.g. {DEFAULT_SCHEDULE_TEXT}")
        delays: list[float] = []
        for i, raw in enumerate(text.split(","), start=1):
            group = raw.strip()
            where = f"probe schedule {text!r}, group {i} ({group!r})"
            count_text, x, seconds_text = group.partition("x")
            if not x or not count_text.strip() or not seconds_text.strip():
                raise ValueError(f"{where}: expected <attempts>x<seconds>, e.g. 60x0.5")
            count_text, seconds_text = count_text.strip(), seconds_text.strip()
            if not count_text.isdigit() or not count_text.isascii() or int(count_text) < 1:
                raise ValueError(f"{where}: attempts must be a whole number >= 1, "
                                 f"not {count_text!r}")
            seconds = _seconds(seconds_text)
            if seconds is None:
                raise ValueError(f"{where}: seconds must be a finite number >= 0, "
                                 f"not {seconds_text!r}")
            count = int(count_text)
            if len(delays) + count > MAX_ATTEMPTS:
                raise ValueError(f"probe schedule {text!r}: more than {MAX_ATTEMPTS} attempts")
            delays.extend([seconds] * count)
        return cls(tuple(delays))

    @property
    def attempts(self) -> int:
        return len(self.delays)

    @property
    def total(self) -> float:
        """Seconds from the submit to the last attempt, not counting the attempts' own time."""
        return math.fsum(self.delays)

    def delay_before(self, attempt: int) -> float:
        """The delay before `attempt` (1-based)."""
        if not 1 <= attempt <= len(self.delays):
            raise IndexError(f"attempt {attempt} is not in 1..{len(self.delays)}")
        return self.delays[attempt - 1]

    def __str__(self) -> str:
        """The compact form `parse` reads (and reads back exactly), runs of one delay merged."""
        groups: list[tuple[int, float]] = []
        for delay in self.delays:
            if groups and groups[-1][1] == delay:
                groups[-1] = (groups[-1][0] + 1, delay)
            else:
                groups.append((1, delay))
        return ",".join(f"{n}x{repr(d).removesuffix('.0')}" for n, d in groups)

    def __repr__(self) -> str:
        return f"Schedule.parse({str(self)!r})"


DEFAULT_SCHEDULE = Schedule.parse(DEFAULT_SCHEDULE_TEXT)


@dataclass(frozen=True, slots=True)
class Readiness:
    """Java's rule (AddedHandlerUtil.java:223-232), as an immutable state.

    A 200 is ready. Any other HTTP status outside `RETRY_STATUSES` (a 302 from oauth2-proxy, a
    401, a 403) sets `primed`, and the next attempt that gets any HTTP status at all is ready.
    An attempt without a status (connection refused, a timeout, a TLS failure) changes nothing.
    """

    primed: bool = False

    def observe(self, status: int | None) -> tuple[bool, Readiness]:
        """(ready, the state for the next attempt) after an attempt that got `status`."""
        if status is None:
            return False, self
        if status == 200 or self.primed:
            return True, self
        if status in RETRY_STATUSES:
            return False, self
        return False, Readiness(primed=True)


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One probe: Session `session` (uid `uid`) of `namespace` holds instance `instance` (of
    AppDefinition `app_definition`, when the caller knows it), to be opened at `url`."""

    namespace: str
    session: str
    uid: str
    instance: int
    url: str  # no scheme: the probe GETs https://<url>
    app_definition: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """What one probe runs for: a second submit with the same key is the same probe."""
        return (self.namespace, self.uid)


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """Whether and how the URL is probed. Off: `status.url` is written with HANDLED."""

    enabled: bool = True
    ca_bundle: str | None = None  # PEM file of CAs trusted besides the system's
    schedule: Schedule = field(default=DEFAULT_SCHEDULE)
    timeout: float = DEFAULT_TIMEOUT  # seconds, for the connect and for each read

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"probe timeout must be a finite number of seconds > 0, "
                             f"not {self.timeout!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProbeSettings:
        """From `WARMPOOL_URL_PROBE` (`on`/`off`), `WARMPOOL_URL_PROBE_CA_BUNDLE` (a path),
        `WARMPOOL_URL_PROBE_SCHEDULE` (`Schedule.parse`) and `WARMPOOL_URL_PROBE_TIMEOUT`
        (seconds); unset or blank means the default. A bad value raises ValueError naming
        its variable."""

        def get(name: str) -> str:
            return environ.get(name, "").strip()

        enabled = True
        if raw := get(ENV_ENABLED):
            if raw.lower() not in ("on", "off"):
                raise ValueError(f"{ENV_ENABLED} must be 'on' or 'off', not {raw!r}")
            enabled = raw.lower() == "on"
        schedule = DEFAULT_SCHEDULE
        if raw := get(ENV_SCHEDULE):
            try:
                schedule = Schedule.parse(raw)
            except ValueError as exc:
                raise ValueError(f"{ENV_SCHEDULE}: {exc}") from None
        timeout = DEFAULT_TIMEOUT
        if raw := get(ENV_TIMEOUT):
            seconds = _seconds(raw)
            if seconds is None or seconds == 0:
                raise ValueError(f"{ENV_TIMEOUT} must be a number of seconds > 0, not {raw!r}")
            timeout = seconds
        return cls(enabled=enabled, ca_bundle=get(ENV_CA_BUNDLE) or None, schedule=schedule,
                   timeout=timeout)


def session_url(instances_host: str, path: str) -> str:
    """The Session's `status.url`: `instancesHost` + the route's path with a trailing slash,
    and no scheme (clients open `https://<url>`), e.g. `instance.example.org/java-17-latest-1/`
    (IngressManager.java:165)."""
    return instances_host + (path if path.endswith("/") else path + "/")
