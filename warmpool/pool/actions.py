"""What a decision asks the executor to do. Plain data: tests compare plans, not API calls.

Every write to an existing object names the resourceVersion it was decided on, so the API server
rejects it (409) if anything changed since: a stale decision can never be applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warmpool.pool.availability import ProbeTarget
from warmpool.pool.parts import Part


@dataclass(frozen=True, slots=True)
class Create:
    part: Part
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Patch:
    """A JSON merge patch, applied only if the object is still at `resource_version`."""

    part: Part
    name: str
    resource_version: str
    patch: dict[str, Any]
    why: str


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete with uid and resourceVersion preconditions."""

    part: Part
    name: str
    uid: str
    resource_version: str
    why: str


@dataclass(frozen=True, slots=True)
class ResetPods:
    """Delete the instance's pods so that the Deployment starts a clean one (release).

    Only pods of the Deployment the decision saw (`deployment`, `deployment_uid`): those a
    ReplicaSet owned by that very Deployment controls, with that ReplicaSet's
    pod-template-hash. Anything else that carries the `app=` label (a pod of someone else's,
    or of a Deployment re-created since) is left alone, with a Warning."""

    app_selector: str
    deployment: str = ""
    deployment_uid: str = ""


@dataclass(frozen=True, slots=True)
class RefreshPods:
    """Stamp the instance's pods so the kubelet re-reads the mounted allow-list sooner; the
    same pods as `ResetPods` would reset, no others."""

    app_selector: str
    deployment: str = ""
    deployment_uid: str = ""


@dataclass(frozen=True, slots=True)
class AnnotateSession:
    session: str
    annotations: dict[str, str | None]  # None removes one
    # The Session's version the decision read: the write is refused if it changed since.
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class SetSessionStatus:
    session: str
    status: dict[str, Any]
    # The uid of the Session the decision was about: one re-created under the same name since
    # is not written (its own claim reports on it).
    uid: str = ""
    # The Session had no status of ours when read (NEW): the write creates the status.
    first: bool = False
    # The Session's resourceVersion the decision read: the write is refused (Conflict) if the
    # Session changed since, so a stale decision cannot write HANDLING or ERROR over the
    # HANDLED a later one wrote. Empty: no such test (a write that reports no decision of a
    # claim, such as the URL probe's status.url, which tests the holder itself).
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class ProbeUrl:
    """Have the process's URL probe watch for the holder's instance to answer, then write
    `status.url` (session-lifecycle §2). Writes nothing itself and never blocks: a probe
    already running for the Session is left to go on."""

    target: ProbeTarget


@dataclass(frozen=True, slots=True)
class Report:
    """An Event (and log line) for a person: something the controller will not fix itself."""

    reason: str
    message: str
    warning: bool = True
    regarding: dict[str, str] = field(default_factory=dict)


Action = (
    Create | Patch | Delete | ResetPods | RefreshPods | AnnotateSession | SetSessionStatus
    | ProbeUrl | Report
)
