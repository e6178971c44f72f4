"""Apply a plan's actions, in order, each one only while the lease is still held.

Every write carries a precondition (resourceVersion, or uid + resourceVersion for deletes, or
must-not-exist for creates), so a plan decided on a stale read fails with Conflict instead of
clobbering; the caller then observes and decides again. Every create and patch of an instance's
own objects and routes also stamps the lease's fence on the object, so a holder whose lease has
expired can tell that a newer holder has been here (see ``check_fence``). What is not the
instance's gets its precondition alone: a Session (resourceVersion and uid), its pods (uid and
resourceVersion, only the instance's own Deployment's: `warmpool.pool.pods`), the shared Ingress.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.kube.guard import Guard
from warmpool.kube.observe import METADATA_ONLY_KINDS
from warmpool.kube.pacing import Pacer
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import (
    Action,
    AnnotateSession,
    Create,
    Delete,
    Patch,
    ProbeUrl,
    RefreshPods,
    Report,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.availability import ProbeTarget
from warmpool.pool.fence import fence_reports, read_fences
from warmpool.pool.instances import InstanceView
from warmpool.pool.meta import meta_of, name_of, resource_version_of, uid_of
from warmpool.pool.model import Session
from warmpool.pool.parts import Part
from warmpool.pool.pods import controller_of, foreign_pod_message, split_pods

log = logging.getLogger(__name__)


class FenceRegression(Exception):
    """An object was last written under a newer lease than ours: we must not write.

    Either we are a stale holder (our lease lapsed, say in a long pause, and someone else took
    it) or Redis lost the lease and its fence counter and handed us a low fence while an older
    holder may still be acting. Both are two holders at once; the job stops, and its retry
    takes a fresh lease whose fence is above what the objects carry (``check_fence`` lifted
    the counter)."""


def observed_fence(view: InstanceView, ours: int = 0) -> int:
    """The highest fence the instance's objects carry, for a holder of fence `ours`: only
    values of the bounded grammar of `warmpool.pool.fence` count (ASCII digits, at most 19,
    no more than a lift can reach unless not above `ours`); a foreign one counts as none."""
    return read_fences(view, ours).seen


def check_fence(
    view: InstanceView, guard: Guard, report: Callable[[list[Report]], None] | None = None,
) -> None:
    """Refuse to act on an instance written under a fence higher than ours.

    A higher fence is never harmless, even while our lease looks valid by our own clock: if
    Redis lost its data (a restart without persistence, a failover, an eviction), the counter
    started over and our "valid" lease may be one of two. So we raise, after lifting the
    counter to the fence seen (``guard.lift_fence``): the retry's lease then carries a higher
    fence than every object of the instance, and goes on. The lift is best effort: if it
    fails, the retry is refused again and lifts then.

    The annotations are written by anyone with `patch` on the objects: they are read with
    the bounded grammar of `warmpool.pool.fence` (what bounds them is said there). A foreign
    value is ignored here (it can neither stop this instance nor lift the counter every key
    shares) and, like a lift far above ours, handed to `report` as a Warning event naming
    the object and the field (the caller's executor sends it; None: not reported).
    """
    reading = read_fences(view, guard.fence)
    reports = fence_reports(view.id, reading, guard.fence)
    if reports and report is not None:
        try:
            report(reports)
        except Exception:  # an event must never stop a reconcile (as `Kube.event`)
            log.exception("instance %s: reporting its fence annotations failed", view.id)
    seen = reading.seen
    if seen <= guard.fence:
        return
    try:
        guard.lift_fence(seen)
    except Exception:
        log.exception("instance %s: lifting the fence counter to %s failed", view.id, seen)
    raise FenceRegression(f"instance {view.id} was written under fence {seen}, "
                          f"ours is {guard.fence}")


class RouteWriteFailed(KubeError):
    """A Session's route could not be created or patched (not a conflict): the caller tells
    the Session (Java's "Failed to edit HTTPRoute.") before the job fails or gives up."""


class WriteSink(Protocol):
    """Who hears of each write: the reader, so the job's next reads see its own writes."""

    def wrote(self, obj: dict[str, Any]) -> None: ...

    def deleted(self, kind: str, namespace: str, name: str, uid: str) -> None: ...


class PodSource(Protocol):
    """Where a refresh finds an instance's pods without a request: a worker's cache
    (`warmpool.kube.reader.Reader.instance_pods`)."""

    def instance_pods(
        self, namespace: str, app_selector: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None: ...


class Prober(Protocol):
    """Who watches a holder's URL until its instance answers (the process's probe runner)."""

    def submit(self, target: ProbeTarget) -> bool: ...


#: How often a reset or refresh writes one pod that keeps changing under it (`_on_own_pod`).
_POD_ATTEMPTS = 3

#: The writes of one run (`_waves`) are sent from here; shared by a process's worker threads.
_FAN_OUT = ThreadPoolExecutor(32, thread_name_prefix="write")
#: A refresh's or reset's ReplicaSet LIST, sent beside its pod LIST (`_own_pods`). Apart from
#: `_FAN_OUT`, whose threads wait on these: a task here never waits on another.
_READS = ThreadPoolExecutor(16, thread_name_prefix="read")


def _waves(actions: list[Action]) -> list[list[Action]]:
    """Split a plan into runs that may be sent at once, keeping the plan's order between runs.

    Patches and creates of distinct objects other than the external Service and the route
    share a run: the external Service's writes are the ones a plan's deletes and pod resets
    are guarded by (a claim's deciding write, a retirement's first delete), so they stand
    alone, in their place. What follows a claim's completing writes (`_follows_completion`:
    the pod refresh, the Session's annotation, the holder's route) is one run of its own, each
    at most once: each needs the completing writes answered first and none needs another.
    - The refresh asks the pods to re-read the allow-list those wrote.
    - The annotation follows them (I1).
    - The route: a path to the instance must never reach an allow-list that lets anyone
      else in. Once the completing writes are answered the ConfigMap is the holder's, and a
      pod that has not re-read it yet holds the list its instance was freed with, which is
      empty: a release empties the list, then deletes every pod that could hold an older one,
      then frees the external Service, and only then can a deciding write take the instance.
      Until the pod re-reads, the path answers 403 to everyone, and the holder learns its URL
      only from the status, which comes after this run. (Sending the route after the
      refresh was answered never meant the pod had re-read: its kubelet does that later.)
    Deletes, pod resets, status writes and events each stand alone, in order. Two writes to
    one object never share a run (the second is guarded by the first one's answer).
    """
    waves: list[list[Action]] = []
    run: list[Action] = []
    seen: set[tuple[str, str]] = set()

    def close() -> None:
        nonlocal run, seen
        if run:
            waves.append(run)
        run, seen = [], set()

    for action in actions:
        follows = _follows_completion(action)
        if follows is not None:
            # Joins a run of the other follow-ups only: never one of writes, never its twin.
            in_run = [_follows_completion(a) for a in run]
            if None in in_run or follows in in_run:
                close()
            run.append(action)
            continue
        if any(_follows_completion(a) is not None for a in run):
            close()
        target = _parallel_target(action)
        if target is None or target in seen:
            close()
            if target is None:
                waves.append([action])
                continue
        run.append(action)
        seen.add(target)
    close()
    return waves


def _owner_missing(pods: Iterable[Mapping[str, Any]], sets: Iterable[Mapping[str, Any]]
                   ) -> bool:
    """Whether a pod (not being deleted) is controlled by a ReplicaSet `sets` lacks."""
    listed = {uid_of(rs) for rs in sets}
    for pod in pods:
        ctrl = controller_of(pod)
        if (ctrl is not None and ctrl[0] == "ReplicaSet" and ctrl[2] not in listed
                and not meta_of(pod).get("deletionTimestamp")):
            return True
    return False


def _follows_completion(action: Action) -> str | None:
    """Which of the writes that follow a claim's completing writes `action` is (`_waves`):
    "refresh", "annotation" or "route"; None for any other."""
    match action:
        case RefreshPods():
            return "refresh"
        case AnnotateSession():
            return "annotation"
        case Create(part=Part.ROUTE) | Patch(part=Part.ROUTE):
            return "route"
    return None


def _parallel_target(action: Action) -> tuple[str, str] | None:
    """The object an action writes, if it may share a run with others; else None."""
    match action:
        case Patch(part=part, name=name) if part not in _ALONE:
            return (part.kind, name)
        case Create(part=part, body=body) if part not in _ALONE:
            return (part.kind, name_of(body))
    return None


#: Parts whose writes never join a run of other parts' writes: the external Service (what a
#: plan's deletes and resets are guarded by), the route (it runs only with what follows the
#: completing writes: `_waves`) and the shared Ingress (one object for every instance).
_ALONE = (Part.EXTERNAL_SERVICE, Part.ROUTE, Part.INGRESS)


class Executor:
    """Applies actions; `written` collects the job's guarded writes as (field, version) pairs,
    `"<Kind>/<name>" -> resourceVersion` or `"<Kind>/<name>#gone" -> uid`, so the queue can tell
    the watch events they cause from anyone else's (a job's own writes do not re-run it)."""

    def __init__(
        self, kube: Kube, namespace: str, guard: Guard, sink: WriteSink | None = None,
        prober: Prober | None = None, pacer: Pacer | None = None,
        pods: PodSource | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.guard = guard
        self.sink = sink
        self.pods = pods  # None: a refresh LISTs the pods (a tool, a test, no cache)
        self.prober = prober  # None: URL probes are not this caller's (a tool, a test)
        # Bulk work's writes wait here while claims do (`warmpool.kube.pacing`); None: a
        # claim's, or a caller's that is never paced (a tool, a test, pacing off).
        self.pacer = pacer
        self.written: list[tuple[str, str]] = []
        self.reset: set[str] = set()  # the app selectors whose pods this plan has reset
        # The version each of this plan's own writes left, by (kind, name): a second write to
        # the same object in one plan is guarded by the first one's result, not by the read
        # (which the first write has made old). The first write checked the read.
        self._versions: dict[tuple[str, str], str] = {}

    def session_version(self, session: Session | None) -> str | None:
        """The resourceVersion `session` is at as far as this plan knows: the one its own
        last write of the Session left, else the one the plan was decided on."""
        if session is None:
            return None
        return self._versions.get((v.SESSION_KIND, session.name), session.resource_version)

    def _wrote(self, kind: str, obj: dict[str, Any]) -> None:
        """A write's answer: its version guards this plan's next write of the object and
        tells the queue the event is ours; the sink (a worker's cache) keeps what it keeps of
        such an object. Nothing else of it is read, so a Service's or a Deployment's answer
        is asked for as metadata alone (`METADATA_ONLY_KINDS`: all a cache keeps of them)."""
        obj.setdefault("kind", kind)
        rv = resource_version_of(obj)
        if rv:
            self.written.append((f"{kind}/{name_of(obj)}", rv))
            self._versions[(kind, name_of(obj))] = rv
        if self.sink is not None:
            self.sink.wrote(obj)

    def _deleted(self, kind: str, name: str, uid: str) -> None:
        self.written.append((f"{kind}/{name}#gone", uid))
        if self.sink is not None:
            self.sink.deleted(kind, self.namespace, name, uid)

    def _fenced(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        annotations = dict(metadata.get("annotations") or {})
        annotations[v.ANNOTATION_FENCE] = str(self.guard.fence)
        return {**metadata, "annotations": annotations}

    def _since(self, action: ResetPods | RefreshPods) -> str | None:
        """Where the pod and ReplicaSet LISTs of a reset or refresh are answered from
        (`Kube.list`): the API server's watch cache, never an etcd scan of the namespace.

        A reset asks for a list not older than the newest resourceVersion this plan's own
        writes left. It follows the release's emptied allow-list (or a guarded write put
        before it, `decide._guard_reset`): every pod that could have served the previous
        holder existed when that write was made, so such a list has them all; a pod created
        later started after access was cut, or by the ReplicaSet after our own deletes.
        None (an etcd read) only for a plan with no write before its reset, which `decide`
        makes only where a read from the server came first.

        A refresh takes the watch cache as it is ("0": no wait for it to catch up, on the
        claim's path). The stamp only asks a pod to re-read the allow-list this plan has
        just written, which its kubelet does by itself within its sync period: a pod the
        watch cache does not show yet (made within its lag of milliseconds) only lets its
        new holder in a little later, and lets no one else in.

        Every write to a listed pod still carries its uid and resourceVersion, so a list
        older than the pod only costs a 409."""
        if isinstance(action, RefreshPods):
            return "0"
        versions = [int(rv) for rv in self._versions.values() if rv.isdigit()]
        return str(max(versions)) if versions else None

    def _pods(self, app_selector: str, since: str | None) -> list[dict[str, Any]]:
        pods, _ = self.kube.list("v1", "Pod", self.namespace,
                                 label_selector=f"{v.LABEL_APP}={app_selector}",
                                 resource_version=since)
        return pods

    def _pod_named(self, app_selector: str, name: str) -> list[dict[str, Any]]:
        """The pod `name` if it still carries the label, from etcd: one key read."""
        pods, _ = self.kube.list("v1", "Pod", self.namespace,
                                 label_selector=f"{v.LABEL_APP}={app_selector}",
                                 field_selector=f"metadata.name={name}")
        return pods

    def _replica_sets(self, app_selector: str, since: str | None) -> list[dict[str, Any]]:
        sets, _ = self.kube.list("apps/v1", "ReplicaSet", self.namespace,
                                 label_selector=f"{v.LABEL_APP}={app_selector}",
                                 resource_version=since)
        return sets

    def _own_pods(self, action: ResetPods | RefreshPods) -> list[Mapping[str, Any]]:
        """The pods of the Deployment the decision saw (`warmpool.pool.pods.split_pods`); a
        Warning for each other pod that carries the instance's label. A refresh reads them
        from the worker's cache (`self.pods`) where it has them; a reset, and a refresh
        without, sends two LISTs by that label (pods, ReplicaSets), each the size of one
        instance's pods, answered by the API server's watch cache (`_since` says how fresh,
        and why that is enough)."""
        self.guard.ensure_held()  # the lease, checked again right before the pods are read
        cached = (self.pods.instance_pods(self.namespace, action.app_selector)
                  if isinstance(action, RefreshPods) and self.pods is not None else None)
        if cached is not None and (not cached[0] or not _owner_missing(*cached)):
            # A refresh may act on any state a cache once held (`_since`: the API server's
            # watch cache as it is would do as well), so the worker's own serves, and a
            # claim costs no LIST. A pod whose ReplicaSet the cache has not seen yet (both
            # made within its lag) is not taken for foreign: the LISTs below decide.
            return self._split_own(action, *cached)
        since = self._since(action)
        # Both at once: one round trip on a claim's path, not two. Each list is at `since`
        # or later, but the two watch caches lag apart: a pod listed whose ReplicaSet the
        # other list lacks (both made within that lag) would count as foreign, so the
        # ReplicaSets are then read from etcd (rare: the usual list has every owner; a
        # foreign pod naming a ReplicaSet that does not exist costs its own instance's
        # refreshes and resets that one LIST each, and is reported as foreign).
        sets_read = _READS.submit(contextvars.copy_context().run, self._replica_sets,
                                  action.app_selector, since)
        pods = self._pods(action.app_selector, since)
        sets = sets_read.result()
        if not pods:
            return []
        if since is not None and _owner_missing(pods, sets):
            sets = self._replica_sets(action.app_selector, None)
        return self._split_own(action, pods, sets)

    def _split_own(
        self, action: ResetPods | RefreshPods, pods: list[dict[str, Any]],
        sets: list[dict[str, Any]],
    ) -> list[Mapping[str, Any]]:
        """The Deployment's own of `pods`, by `sets`; a Warning for each of the others."""
        split = split_pods(pods, sets, action.deployment, action.deployment_uid)
        for pod in split.foreign:
            self._apply(Report("ForeignPod", foreign_pod_message(
                pod, action.app_selector, action.deployment or "(unknown)"),
                regarding={"kind": "Pod", "name": name_of(pod), "apiVersion": "v1"}))
        return list(split.own)

    def _on_own_pod(
        self, action: ResetPods | RefreshPods, pod: Mapping[str, Any],
        write: Callable[[Mapping[str, Any]], None],
    ) -> None:
        """`write` the pod at the version listed. A pod changed since (its kubelet writes its
        status) is read again and written at its new version only while it is still the
        same pod (uid), with the label, of the same Deployment; a few tries, then the
        Conflict is the plan's (it reads again and decides again)."""
        for attempt in range(_POD_ATTEMPTS):
            try:
                write(pod)
                return
            except Conflict:
                if attempt + 1 == _POD_ATTEMPTS:
                    raise
            # Read again from etcd: the version that made the listed one stale is unknown,
            # and a watch cache behind it would hand back the refused version. By its name
            # and the label, through LIST (no other verb on pods), so the server reads that
            # one pod's key rather than scan every pod of the namespace: a kubelet's status
            # write between the list and the write is routine under churn (the churn
            # benchmark at 12-20 Sessions/s: 3-10 in a 90 s window, and they were the only
            # etcd scans the controller sent).
            current = next((p for p in self._pod_named(action.app_selector, name_of(pod))
                            if uid_of(p) == uid_of(pod)), None)
            if current is None:
                return  # gone, or relabelled: not the instance's pod any more
            sets = self._replica_sets(action.app_selector, self._since(action))
            split = split_pods([current], sets, action.deployment, action.deployment_uid)
            if not split.own:
                return  # no longer the Deployment's, or already being deleted: leave it
            pod = current

    def _delete_pod(self, pod: Mapping[str, Any]) -> None:
        self.kube.delete("v1", "Pod", self.namespace, name_of(pod), uid=uid_of(pod),
                         resource_version=resource_version_of(pod))
        if self.sink is not None:
            # This process's claims stop counting the pod as warm at once, not when its
            # deletion's event arrives (another process's cache learns it by its watch).
            self.sink.deleted("Pod", self.namespace, name_of(pod), uid_of(pod))

    def _stamp_pod(self, pod: Mapping[str, Any], now: str) -> None:
        try:
            self.kube.merge_patch("v1", "Pod", self.namespace, name_of(pod),
                                  {"metadata": {"annotations": {v.ANNOTATION_REFRESH: now}}},
                                  resource_version=resource_version_of(pod))
        except KubeError as exc:  # a pod that went away needs no refresh
            if exc.status != 404:
                raise

    def _set_status(
        self, name: str, status: Mapping[str, Any], uid: str, first: bool, rv: str
    ) -> dict[str, Any]:
        """Merge `status` into the Session's, if it still has `uid` (and, with `rv`, is still
        at that resourceVersion): a JSON patch that tests them, then adds each field (or, for
        a Session without a status yet, the status). The status subresource honours no
        resourceVersion in a merge patch, so the version is a `test` too; a failed test and a
        missing /status are one 422 to the server, without detail, so a 422 is told apart by
        reading the Session: another uid (re-created), another version (Conflict: the caller
        reads again and decides again, never overwrites), else the status was missing."""
        if not uid:
            return self.kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, self.namespace,
                                         name, {"status": dict(status)}, status=True)
        tests: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        if rv:
            tests.append({"op": "test", "path": "/metadata/resourceVersion", "value": rv})
        whole = [*tests, {"op": "add", "path": "/status", "value": dict(status)}]
        fields = [*tests, *({"op": "add", "path": f"/status/{k}", "value": val}
                            for k, val in status.items())]
        try:
            return self.kube.json_patch(v.SESSION_API_VERSION, v.SESSION_KIND, self.namespace,
                                        name, whole if first else fields, status=True)
        except KubeError as exc:
            if exc.status != 422:
                raise
            current = self.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, self.namespace,
                                    name)
            if current is None or uid_of(current) != uid:
                raise
            if rv and resource_version_of(current) != rv:
                raise Conflict(f"Session {name} changed since its status was decided "
                               f"(version {rv}, now {resource_version_of(current)})") from exc
            if first:
                raise
        # Read with a status that it no longer has: write the whole of it.
        return self.kube.json_patch(v.SESSION_API_VERSION, v.SESSION_KIND, self.namespace,
                                    name, whole, status=True)

    def apply(self, actions: Iterable[Action]) -> int:
        """Apply in order; returns the number of writes. Raises Conflict on a stale precondition.

        Order is kept where it has a meaning: each run of writes that nothing orders among
        themselves (`_waves`) is sent at once, and a run starts only after the one before it
        has been answered. A claim's four completing patches are one run; its pod refresh (two
        LISTs at once, then the pod's patch), annotation and route the next; then its
        status: about six round trips, not eleven. A
        failure in a run is raised once the whole run has been answered (the writes that
        went through are recorded, as a sequential plan's earlier writes are); the next
        attempt reads again.

        A pod refresh is sent with its run but waited for only at the end of the plan, so the
        runs after it (a claim's status: HANDLED and the URL) do not wait for its reads and
        stamps. Nothing reads its answer: it needs the completing writes answered, which
        they are when its run starts, and the pod re-reads its allow-list when its kubelet
        gets to it, whether the stamp was answered before the status or after. It is still
        sent whatever becomes of the rest of its run (a route or an annotation refused), as
        before: a plan decided again finds the allow-list written and refreshes nothing.
        Its failure is the plan's, once every write has been answered; the lease is held
        until then (the job releases it only after `apply` returns). Measured (bench claim,
        100 instances, alone): one claim at a time, create -> HANDLED p50 122-128 ms waiting
        for it, 103-104 ms not.

        A bulk job's run first waits for the pacer (one token per write it sends) while
        claims wait; the lease is checked after that wait, right before the run is sent.
        """
        writes = 0
        behind: list[Future[int]] = []  # the refreshes sent, waited for at the end
        failure: BaseException | None = None
        try:
            for wave in _waves(list(actions)):
                writes += self._apply_wave(wave, behind)
        except BaseException as exc:
            failure = exc
        for future in behind:
            try:
                writes += future.result()
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return writes

    def _apply_wave(self, wave: list[Action], behind: list[Future[int]]) -> int:
        """Send one run and wait for its answers; a refresh's future goes to `behind`."""
        if self.pacer is not None:
            self.pacer.admit(sum(1 for a in wave if not isinstance(a, ProbeUrl)))
        self.guard.ensure_held()
        if len(wave) == 1 and not isinstance(wave[0], RefreshPods):
            return self._apply(wave[0])
        # Each in a copy of this thread's context: its log lines name the job's key
        # and fence (warmpool.logs.job_context) as the plan's other lines do.
        futures: list[Future[int]] = []
        for action in wave:
            future = _FAN_OUT.submit(contextvars.copy_context().run, self._apply, action)
            (behind if isinstance(action, RefreshPods) else futures).append(future)
        writes = 0
        failure: BaseException | None = None
        for future in futures:
            try:
                writes += future.result()
            except BaseException as exc:  # the first failure, after all have answered
                failure = failure or exc
        if failure is not None:
            raise failure
        return writes

    def _apply(self, action: Action) -> int:
        """Send one action; how many objects it wrote (a probe or an event: none)."""
        match action:
            case Create():
                return self._create(action)
            case Patch():
                return self._patch(action)
            case Delete():
                return self._delete(action)
            case ResetPods():
                return self._reset_pods(action)
            case RefreshPods():
                return self._refresh_pods(action)
            case AnnotateSession():
                return self._annotate_session(action)
            case SetSessionStatus():
                return self._set_session_status(action)
            case ProbeUrl(target=target):
                # Not a write: the probe writes status.url later, uid-tested, and only while
                # the Session still holds the instance (warmpool.controller.availability).
                if self.prober is not None:
                    self.prober.submit(target)
                return 0
            case Report():
                return self._report(action)
        return 1

    def _create(self, action: Create) -> int:
        part, body = action.part, action.body
        # Safe on a stale read: the server refuses a create whose name exists (409).
        try:
            created = self.kube.create({**body, "metadata": self._fenced(body["metadata"])},
                                       metadata_only=part.kind in METADATA_ONLY_KINDS)
        except KubeError as exc:
            if part is Part.ROUTE:
                raise RouteWriteFailed(exc.status, str(exc)) from exc
            raise
        self._wrote(part.kind, created)
        log.info("created %s %s", part.kind, name_of(body))
        return 1

    def _patch(self, action: Patch) -> int:
        part, name, patch = action.part, action.name, action.patch
        # The shared Ingress is not the instance's: it gets no fence (a fence is one
        # instance's lease, and the Ingress is every instance's and Helm's).
        body = patch if part is Part.INGRESS else {
            **patch, "metadata": self._fenced(patch.get("metadata", {}))}
        # Safe on a stale read: the resourceVersion we decided on is the precondition.
        try:
            patched = self.kube.merge_patch(
                part.api_version, part.kind, self.namespace, name, body,
                resource_version=self._versions.get((part.kind, name),
                                                    action.resource_version),
                metadata_only=part.kind in METADATA_ONLY_KINDS)
        except KubeError as exc:
            if exc.status == 404:
                raise Conflict(f"{part.kind} {name} vanished") from exc
            if part in (Part.ROUTE, Part.INGRESS):
                raise RouteWriteFailed(exc.status, str(exc)) from exc
            raise
        self._wrote(part.kind, patched)
        log.info("patched %s %s (%s)", part.kind, name, action.why)
        return 1

    def _delete(self, action: Delete) -> int:
        part, name, uid = action.part, action.name, action.uid
        # Safe on a stale read: uid and resourceVersion are both preconditions.
        found = self.kube.delete(part.api_version, part.kind, self.namespace, name, uid=uid,
                                 resource_version=self._versions.get((part.kind, name),
                                                                     action.resource_version))
        self._deleted(part.kind, name, uid)
        if not found and part is Part.EXTERNAL_SERVICE:
            # The external Service's delete guards the deletes after it (a retirement's,
            # `decide._claim_guard_first`): at the version read, a claim since makes the
            # server refuse it. Found gone, it guards nothing. Someone else deleted it (by
            # hand, the chaos tier), and the read may predate a claim whose other four
            # objects the plan would now delete at the versions it read, which a cache whose
            # Service watch lags its ConfigMap watch holds as they are now
            # (docs/reliability.md, finding 20). The caller reads the server and decides
            # again (`unguarded_deletes`: no Service there, so nothing is deleted unread).
            raise Conflict(f"{part.kind} {name} was already gone: its guard vanished")
        log.info("deleted %s %s (%s)", part.kind, name, action.why)
        return 1

    def _reset_pods(self, action: ResetPods) -> int:
        # Safe on a stale read: only the pods of the Deployment the decision saw
        # (`_own_pods`: the ownership chain, uid by uid, and the pod-template-hash),
        # so a foreign pod with the label, or one of a Deployment re-created since, is
        # never deleted; each delete carries the listed pod's uid and
        # resourceVersion, so a pod created after the listing, or changed since, is
        # not touched unchecked (`_on_own_pod`). A plan always has a guarded write
        # before its reset (`decide`'s `_guard_reset`, or a read from the server
        # where nothing can guard), so a reset decided on a stale read is stopped by
        # that write's 409 first, and the lease is checked right before the listing.
        pods = self._own_pods(action)
        for pod in pods:
            self._on_own_pod(action, pod, self._delete_pod)
        self.reset.add(action.app_selector)
        log.info("reset %d pod(s) of %s", len(pods), action.deployment or action.app_selector)
        return len(pods)

    def _refresh_pods(self, action: RefreshPods) -> int:
        # Safe on a stale read: the annotation only asks the pod to re-read its
        # mounted allow-list, which a guarded write of this plan has just set (on a
        # stale plan that write was refused and this is never reached); and only the
        # Deployment's own pods are stamped, each at the version listed.
        now = datetime.now(UTC).isoformat()
        pods = self._own_pods(action)
        for pod in pods:
            self._on_own_pod(action, pod, functools.partial(self._stamp_pod, now=now))
        return len(pods)

    def _annotate_session(self, action: AnnotateSession) -> int:
        name, annotations, rv = action.session, action.annotations, action.resource_version
        # Safe on a stale read: the Session's resourceVersion is the precondition (a
        # Session changed since, or re-created under the same name, gets a 409).
        patch = {"metadata": {"annotations": annotations}}
        try:
            annotated = self.kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND,
                                              self.namespace, name, patch,
                                              resource_version=rv or None)
        except KubeError as exc:
            # A Session deleted during its claim: its instance is released by the
            # next reconcile of that instance, which its deletion queues.
            if exc.status != 404:
                raise
            log.info("Session %s went away before its annotation", name)
            return 0
        if rv:
            self._wrote(v.SESSION_KIND, annotated)
        elif self.sink is not None:
            self.sink.wrote(annotated)
        log.info("annotated Session %s with %s", name, annotations)
        return 1

    def _set_session_status(self, action: SetSessionStatus) -> int:
        name, status, uid, rv = action.session, action.status, action.uid, action.resource_version
        # Safe on a stale read: it tests the Session's uid (a Session re-created under
        # the name since must not be told it holds its predecessor's instance) and
        # the resourceVersion the decision read (or the one this plan's own write of
        # the Session left): a Session changed since gets a Conflict, and the caller
        # reads it again and decides again; a stale claim cannot write HANDLING or
        # ERROR over HANDLED.
        try:
            updated = self._set_status(
                name, status, uid, action.first,
                self._versions.get((v.SESSION_KIND, name), rv) if rv else "")
        except KubeError as exc:
            if exc.status == 422 and uid:
                log.info("Session %s was re-created: its status is not ours to write", name)
                return 0
            if exc.status != 404:  # a Session deleted meanwhile needs no status
                raise
        else:
            if rv and resource_version_of(updated):
                self._versions[(v.SESSION_KIND, name)] = resource_version_of(updated)
            if self.sink is not None:
                self.sink.wrote(updated)
        if "operatorStatus" in status:
            log.info("Session %s is %s: %s", name, status["operatorStatus"],
                     status.get("operatorMessage"))
        else:
            log.info("Session %s: status %s written", name, ", ".join(sorted(status)))
        return 1

    def _report(self, action: Report) -> int:
        regarding, warning = action.regarding, action.warning
        # A Warning is something a person must look at; a Normal event (a claim, a
        # release) is the record of work done, logged at INFO with the Session's uid.
        session_uid = (regarding.get("uid") if regarding.get("kind") == v.SESSION_KIND
                       else None)
        log.log(logging.WARNING if warning else logging.INFO, "%s: %s", action.reason,
                action.message, extra={"session_uid": session_uid} if session_uid else None)
        ns = self.namespace
        self.kube.event(ns, regarding or {"kind": "Namespace", "name": ns}, action.reason,
                        action.message, warning=warning)
        return 0
