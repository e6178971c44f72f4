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
