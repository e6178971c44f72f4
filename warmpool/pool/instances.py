"""What an observed instance is, and who holds it: the model every layer reads.

`InstanceView` (the five objects of one instance as read), the owner-reference predicates, the
traces a holder leaves, and `HolderIndex` (pool-spec §4 `claimant`). Pure, like the decisions
that use it; the cache, the claim, the status command and the invariant checker read it too,
which is why it is not part of `decide`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.emails import same_user
from warmpool.pool.meta import annotations_of, labels_of, owner_refs
from warmpool.pool.model import Session
from warmpool.pool.parts import PARTS, Part

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class InstanceView:
    """The observed objects of instance `id` (None where an object does not exist)."""

    id: int
    objects: Mapping[Part, Obj | None]
    # The session routes (HTTPRoutes) to this instance: those whose rules send to its external
    # Service, and each holder's own route wherever it points. Not one of the five objects:
    # `existing` and `complete` ignore them. Empty where routes are not in use.
    routes: tuple[Obj, ...] = ()
    # Whether its Deployment's pod is Ready (`warmpool.pool.pods.Warmth`), where the reader
    # knows its pods; None: unknown. What a claim's status tells the user (a cold start).
    warmth: str | None = None

    def get(self, part: Part) -> Obj | None:
        return self.objects.get(part)

    def existing(self) -> list[tuple[Part, Obj]]:
        return [(p, o) for p in PARTS if (o := self.objects.get(p)) is not None]

    @property
    def complete(self) -> bool:
        return all(self.objects.get(p) is not None for p in PARTS)



def refs(obj: Obj | None) -> list[dict[str, Any]]:
    return [dict(r) for r in owner_refs(obj)]


def _is_theia_ref(ref: Mapping[str, Any], kind: str) -> bool:
    return ref.get("kind") == kind and str(ref.get("apiVersion", "")).startswith(v.GROUP + "/")


def is_session_ref(ref: Mapping[str, Any]) -> bool:
    return _is_theia_ref(ref, v.SESSION_KIND)


def is_appdef_ref(ref: Mapping[str, Any], appdef_name: str | None = None) -> bool:
    """A reference to the AppDefinition `appdef_name` (to any AppDefinition when None)."""
    return _is_theia_ref(ref, v.APPDEF_KIND) and appdef_name in (None, ref.get("name"))


def is_foreign_ref(ref: Mapping[str, Any], appdef_name: str) -> bool:
    return not is_session_ref(ref) and not is_appdef_ref(ref, appdef_name)


def has_ref(ref_list: Sequence[Mapping[str, Any]], ref: Mapping[str, Any]) -> bool:
    """References are matched by (name, uid), as the garbage collector matches them."""
    return any(r.get("name") == ref["name"] and r.get("uid") == ref["uid"] for r in ref_list)


def emails_of(obj: Obj | None) -> str:
    return ((obj or {}).get("data") or {}).get(v.EMAILS_KEY) or ""


def holder_trace(part: Part, obj: Obj) -> bool:
    """Whether one object still carries a trace of a holder: a Session reference, a session
    label (Services) or an e-mail (the allow-list). Per object, so a cache can keep it as an
    index and a claim need not look at every instance to find the free ones."""
    if any(is_session_ref(r) for r in refs(obj)):
        return True
    if part.is_service and any(k in labels_of(obj) for k in v.SESSION_LABEL_KEYS):
        return True
    return part is Part.EMAIL_CONFIGMAP and bool(emails_of(obj).strip())


def release_markers(instance: InstanceView) -> bool:
    """True while any trace of a holder remains on any of the instance's objects."""
    return any(holder_trace(part, obj) for part, obj in instance.existing())


class HolderIndex:
    """The live Sessions of one pool, indexed once, to find any of its instances' holders.

    Everything that looks at every instance of a pool (a claim, a status, a check) asks for
    each instance's holders; indexing the Sessions per question made that quadratic, which at
    a thousand instances cost a claim more than a second of CPU.
    """

    def __init__(self, appdef_name: str, sessions: Sequence[Session]) -> None:
        self.live = {s.uid: s for s in sessions if s.live and s.appdef == appdef_name}

    def of(self, instance: InstanceView) -> list[Session]:
        """Live Sessions holding the instance, the rightful one first (pool-spec §4 `claimant`).

        A Session holds k if k's external Service references it: that reference is the
        claim's deciding write. The `instance-id` annotation never makes a holder by itself
        (a hand edit, a Session re-created under the same name, an id past maxInstances would
        otherwise take an instance, or change its holder without a release). While the
        Service is missing (deleted by hand) the references the claim put on the other four
        objects stand in for it, so that it is recreated for its holder. One annotated with k
        comes first; ties by age.

        A Session whose spec.user changed since its deciding write (the Service's claimed-for
        annotation says for whom it was made) holds nothing: the instance is released, and
        the pod with the previous user's state never reaches the new user; the Session then
        claims a clean instance like any other. Users are compared as oauth2-proxy compares
        them (`emails.user_key`): a change of case only is the same person.

        While the Service is missing there is no claimed-for to read, and its running pod
        may have served someone: the allow-list says whom. A Session it names another user
        for (as oauth2-proxy compares) holds nothing, so the instance is released (its pod
        reset) rather than handed on with the previous user's pod; the Session then claims
        again (issue #27). An allow-list that names no one (emptied or deleted as well)
        cannot tell: the Session its references name keeps the instance, so nothing of a
        live Session's is deleted (with its AppDefinition gone, a release would delete the
        instance), and its plan resets the pod before it writes the allow-list again
        (`decide._claimed`), so whoever the pod served, its state never reaches the user.
        """
        ext = instance.get(Part.EXTERNAL_SERVICE)
        evidence = [ext] if ext is not None else [o for _, o in instance.existing()]
        uids = {r.get("uid") for o in evidence for r in refs(o) if is_session_ref(r)}
        claimed_for = annotations_of(ext).get(v.ANNOTATION_CLAIMED_FOR, "")
        # Bounded: the allow-list is compared with each candidate's spec.user for equality
        # (case aside), never parsed; a foreign value matches no Session.
        allowed = emails_of(instance.get(Part.EMAIL_CONFIGMAP)).strip()

        def rank(s: Session) -> tuple[int, str, str]:
            return (0 if s.instance_id == instance.id else 1, s.created, s.name)

        def user_unchanged(s: Session) -> bool:
            if ext is None:
                return not allowed or same_user(allowed, s.user)
            if (not claimed_for.startswith(f"{s.uid}/")
                    or claimed_for in (naming.claimed_for(s.uid, s.user),
                                       naming.claimed_for_as_spelt(s.uid, s.user))):
                return True
            # The annotation names another user for this Session. A real change of spec.user
            # leaves the allow-list naming the previous user (this plan is what rewrites it),
            # so an allow-list naming this Session's user says that the annotation, which
            # anyone with `patch` on Services can write, is what changed (the long tier with
            # hosts, seed 31: a hand-edited digest released a live user's instance and, above
            # minInstances, deleted it). The holding stands and the plan writes the annotation
            # back. An allow-list that names no one cannot tell: released, as before.
            return bool(allowed) and same_user(allowed, s.user)

        if ext is not None and not self.live.keys() & uids:
            # The Service references no live Session, yet says whom it was claimed for: a
            # reference removed by hand (anyone with `patch` on Services can). The holding
            # stands when all of our own traces agree: the claimed-for value names a live
            # Session of this pool and its user, exactly as a claim writes it, and that
            # Session is annotated with this instance. The plan then puts the reference back
            # (a patch at the Service's resourceVersion), instead of releasing a live user's
            # instance and deleting its objects (the chaos tier's hostile edits, issue #27).
            # A release never leaves both: it runs only for a Session that ended or whose user
            # changed, and a new claim overwrites claimed-for in its deciding write.
            uid = claimed_for.partition("/")[0]
            s = self.live.get(uid)
            if (s is not None and s.instance_id == instance.id
                    and claimed_for in (naming.claimed_for(s.uid, s.user),
                                        naming.claimed_for_as_spelt(s.uid, s.user))):
                uids = {uid}
        # the live Sessions' uids (str) among the referenced ones (a reference may lack one)
        return sorted((self.live[u] for u in self.live.keys() & uids
                       if user_unchanged(self.live[u])), key=rank)


def holders(
    instance: InstanceView, appdef_name: str, sessions: Sequence[Session]
) -> list[Session]:
    """`HolderIndex.of` for a single instance."""
    return HolderIndex(appdef_name, sessions).of(instance)
