"""Which pods are an instance's own: the only pods a reset deletes or a refresh stamps.

The `app=<selector>` label finds an instance's pods, but anyone who can create a pod can put
that label on it, and a Deployment re-created since the decision has pods of its own. A pod
is the instance's when the ownership chain the controllers wrote says so, uid by uid:

    Pod --controller--> ReplicaSet --controller--> Deployment (the name and uid decided on)

and the pod's `pod-template-hash` label is its ReplicaSet's. Everything else that carries
the label is foreign: left alone (the caller reports it). Pure: the executor lists the pods
and ReplicaSets and asks this module.

What bounds each read: ownerReferences, labels and names are written by anyone with `patch`
on pods or ReplicaSets, but the API server types them (strings, a boolean `controller`), and
they are only compared for equality here, never parsed; a pod without a readable chain is
simply not the instance's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmpool.pool.meta import labels_of, meta_of, owner_refs, uid_of
from warmpool.pool.naming import split_instance_name

#: The label the ReplicaSet controller puts on a ReplicaSet and each of its pods.
POD_TEMPLATE_HASH = "pod-template-hash"

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodSplit:
    """The pods carrying an instance's `app=` label, split by whose they are."""

    #: Pods of the decided Deployment (not already being deleted).
    own: tuple[Obj, ...]
    #: Pods that carry the label but are not the Deployment's (someone else's, or of another
    #: Deployment of that name): never touched, reported.
    foreign: tuple[Obj, ...]


def controller_of(obj: Obj) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the object's controller reference, or None."""
    for ref in owner_refs(obj):
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return (str(ref.get("kind") or ""), str(ref.get("name") or ""),
                    str(ref.get("uid") or ""))
    return None


def split_pods(
    pods: Iterable[Obj], replica_sets: Sequence[Obj], deployment: str, deployment_uid: str,
) -> PodSplit:
    """Split `pods` into the Deployment's own and the rest (`PodSplit`).

    `replica_sets`: the ReplicaSets listed with the same label. A decision that names no
    Deployment uid owns nothing: without it no chain can be checked. Pods already being
    deleted are neither reset nor refreshed again, and not reported."""
    hashes: dict[str, str] = {}
    if deployment and deployment_uid:
        for rs in replica_sets:
            if controller_of(rs) == ("Deployment", deployment, deployment_uid):
                hashes[uid_of(rs)] = labels_of(rs).get(POD_TEMPLATE_HASH, "")
    own: list[Obj] = []
    foreign: list[Obj] = []
    for pod in pods:
        if meta_of(pod).get("deletionTimestamp"):
            continue
        ctrl = controller_of(pod)
        template_hash = hashes.get(ctrl[2], "") if ctrl and ctrl[0] == "ReplicaSet" else ""
        if template_hash and labels_of(pod).get(POD_TEMPLATE_HASH) == template_hash:
            own.append(pod)
        else:
            foreign.append(pod)
    return PodSplit(tuple(own), tuple(foreign))


def foreign_pod_message(pod: Obj, selector: str, deployment: str) -> str:
    """The Warning for a pod that carries an instance's label and is not its Deployment's."""
    ctrl = controller_of(pod)
    owner = f"controlled by {ctrl[0]} {ctrl[1]!r}" if ctrl else "with no controller"
    return (f"Pod {str(meta_of(pod).get('name'))[:253]} carries the label app={selector} of a "
            f"pool instance but is not a pod of its Deployment {deployment} ({owner[:300]}): "
            "left alone; the instance's resets and refreshes never touch it")


# --- whether an instance's pod is warm --------------------------------------------------------

#: The container waiting reasons that mean a pod will not start by itself: the image cannot
#: be pulled, or the container keeps failing. A kubelet writes them; anyone with `patch` on
#: pods/status could write any text, so a reason is only compared with these, never shown
#: unless it is one of them.
FAILURE_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError",
    "RunContainerError",
})


class Warmth:
    """What an instance's pod is, for a claim: ready now, coming, or not coming by itself."""

    WARM = "warm"
    STARTING = "starting"
    FAILING = "failing"


@dataclass(frozen=True, slots=True)
class PodState:
    """What a claim and the pool's health read of one pod (`strip_pod_status` keeps it)."""

    ready: bool
    #: One of `FAILURE_REASONS` a container is waiting with, else "".
    failure: str = ""


def strip_pod_status(status: object) -> dict[str, Any]:
    """The part of a pod's status `pod_state` reads: the Ready condition and the failure
    reason of a waiting container (one of `FAILURE_REASONS`), nothing else; a cache keeps
    this instead of the whole status."""
    out: dict[str, Any] = {"ready": False}
    if not isinstance(status, Mapping):
        return out
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        out["ready"] = any(isinstance(c, Mapping) and c.get("type") == "Ready"
                           and c.get("status") == "True" for c in conditions)
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = status.get(key)
        for c in statuses if isinstance(statuses, list) else ():
            state = c.get("state") if isinstance(c, Mapping) else None
            waiting = state.get("waiting") if isinstance(state, Mapping) else None
            reason = waiting.get("reason") if isinstance(waiting, Mapping) else None
            if isinstance(reason, str) and reason in FAILURE_REASONS:
                out["failure"] = reason
                return out
    return out


def pod_state(pod: Obj) -> PodState:
    """A pod's `PodState`, from its status as a kubelet writes it or as stripped by
    `strip_pod_status` (the cache's copy): both shapes read the same."""
    status = pod.get("status")
    if isinstance(status, Mapping) and "ready" in status:
        failure = status.get("failure")
        return PodState(status.get("ready") is True,
                        failure if isinstance(failure, str) and failure in FAILURE_REASONS
                        else "")
    stripped = strip_pod_status(status)
    return PodState(stripped["ready"], stripped.get("failure", ""))


def deployment_of(pod: Obj) -> str | None:
    """The name of the Deployment `pod` is a current pod of (`is_current_pod`), read from the
    pod alone: its controller ReplicaSet's name less ``-<pod-template-hash>``; None for a pod
    being deleted or without that chain. What a cache indexes pods by."""
    if meta_of(pod).get("deletionTimestamp"):
        return None
    template_hash = labels_of(pod).get(POD_TEMPLATE_HASH, "")
    ctrl = controller_of(pod)
    if not (template_hash and ctrl and ctrl[0] == "ReplicaSet"
            and ctrl[1].endswith(f"-{template_hash}")):
        return None
    return ctrl[1][:-len(template_hash) - 1] or None


def combine(states: Iterable[PodState]) -> tuple[str, str]:
    """(`Warmth`, failure reason) of an instance from its current pods' states: WARM with any
    Ready; FAILING when none is and one waits for a failure reason; else STARTING."""
    failure = ""
    for state in states:
        if state.ready:
            return Warmth.WARM, ""
        failure = failure or state.failure
    return (Warmth.FAILING, failure) if failure else (Warmth.STARTING, "")


def is_current_pod(pod: Obj, deployment: str) -> bool:
    """Whether `pod` is one of Deployment `deployment`'s, by what the pod itself carries: its
    controller is the ReplicaSet named ``<deployment>-<pod-template-hash>`` (the name the
    Deployment controller gives its ReplicaSets) with the pod's own hash label, and it is not
    being deleted (a reset's pod is on its way out). Enough to tell warm from cold (a pod
    that fakes the chain only fakes readiness, which its own instance's claim then trusts);
    never enough for a write, which `split_pods` checks uid by uid."""
    return bool(deployment) and deployment_of(pod) == deployment


def warmth(pods: Iterable[Obj], deployment: str) -> tuple[str, str]:
    """(`Warmth`, failure reason) of an instance from the pods carrying its `app=` label:
    WARM with any of its Deployment's current pods Ready; FAILING when none is and one is
    waiting for a `FAILURE_REASONS` reason (named); else STARTING (no pod yet, or one being
    made: a reset's replacement)."""
    return combine(pod_state(pod) for pod in pods if is_current_pod(pod, deployment))


def warmth_by_instance(
    pods: Iterable[Obj], names: Sequence[tuple[int | None, str]],
) -> dict[int, tuple[str, str]]:
    """k -> (`Warmth`, failure reason) of each instance whose Deployment is named
    ``instance-<k>-<rest>`` for a (digits, rest) of `names` (digits: only ids of that many
    digits; None: any) and has a current pod (`deployment_of`), from a list of pods: what a
    cache keeps as an index, for a reader without one."""
    wanted = {rest: digits for digits, rest in names}
    states: dict[int, list[PodState]] = {}
    for pod in pods:
        split = split_instance_name(deployment_of(pod) or "")
        if split is None or split[1] not in wanted:
            continue
        digits = wanted[split[1]]
        if digits is None or len(str(split[0])) == digits:
            states.setdefault(split[0], []).append(pod_state(pod))
    return {k: combine(found) for k, found in states.items()}
