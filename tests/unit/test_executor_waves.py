"""`warmpool.kube.executor._waves`: which of a plan's writes are sent at once, and which keep
their order (the external Service's guarded writes first, deletes and resets alone)."""

from __future__ import annotations

from warmpool.kube.executor import _waves
from warmpool.pool.actions import (
    AnnotateSession,
    Create,
    Delete,
    Patch,
    RefreshPods,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.parts import Part


def patch(part: Part, name: str) -> Patch:
    return Patch(part, name, "1", {}, "test")


def test_a_claims_completing_patches_go_together_then_refresh_and_annotation() -> None:
    ext = patch(Part.EXTERNAL_SERVICE, "ext")
    rest = [patch(Part.INTERNAL_SERVICE, "int"), patch(Part.DEPLOYMENT, "dep"),
            patch(Part.PROXY_CONFIGMAP, "proxy"), patch(Part.EMAIL_CONFIGMAP, "email")]
    annotate = AnnotateSession("s1", {"x": "1"}, "5")
    refresh = RefreshPods("app")
    status = SetSessionStatus("s1", {"operatorStatus": "HANDLED"}, uid="u")
    assert _waves([ext, *rest, refresh, annotate, status]) == [
        [ext], rest, [refresh, annotate], [status]]
    # The annotation never goes with the completing patches (I1), before or after it, with or
    # without a refresh.
    assert _waves([*rest, annotate, status]) == [rest, [annotate], [status]]
    assert _waves([annotate, *rest]) == [[annotate], rest]
    assert _waves([refresh, annotate, *rest]) == [[refresh, annotate], rest]
    # A refresh asks the pods to re-read what the run before it wrote: no write joins it.
    assert _waves([refresh, patch(Part.EMAIL_CONFIGMAP, "email")]) == [
        [refresh], [patch(Part.EMAIL_CONFIGMAP, "email")]]


def test_the_holders_route_goes_with_the_refresh_never_with_the_completing_writes() -> None:
    rest = [patch(Part.DEPLOYMENT, "dep"), patch(Part.EMAIL_CONFIGMAP, "email")]
    annotate = AnnotateSession("s1", {"x": "1"}, "5")
    refresh = RefreshPods("app")
    route = Create(Part.ROUTE, {"metadata": {"name": "r"}})
    status = SetSessionStatus("s1", {"operatorStatus": "HANDLED"}, uid="u")
    assert _waves([*rest, refresh, annotate, route, status]) == [
        rest, [refresh, annotate, route], [status]]
    # A made instance has nothing to refresh: the annotation and the route still go together.
    assert _waves([*rest, annotate, route, status]) == [rest, [annotate, route], [status]]
    # Never before the completing writes are answered, whatever the plan's order.
    assert _waves([route, *rest]) == [[route], rest]
    # A stray route's delete keeps its place; two route writes never share a run.
    stray = Delete(Part.ROUTE, "old", "u9", "1", "stray")
    assert _waves([*rest, refresh, stray, route]) == [rest, [refresh], [stray], [route]]
    again = Patch(Part.ROUTE, "r", "2", {}, "test")
    assert _waves([refresh, route, again]) == [[refresh, route], [again]]


def test_deletes_and_resets_keep_their_order_behind_the_external_service() -> None:
    ext = Delete(Part.EXTERNAL_SERVICE, "ext", "u1", "1", "retire")
    others = [Delete(Part.DEPLOYMENT, "dep", "u2", "1", "retire"),
              Delete(Part.EMAIL_CONFIGMAP, "email", "u3", "1", "retire")]
    assert _waves([ext, *others]) == [[ext], [others[0]], [others[1]]]
    guard = patch(Part.EXTERNAL_SERVICE, "ext")
    reset = ResetPods("app")
    assert _waves([guard, patch(Part.DEPLOYMENT, "dep"), reset]) == [
        [guard], [patch(Part.DEPLOYMENT, "dep")], [reset]]


def test_two_writes_to_one_object_never_share_a_run() -> None:
    first, second = patch(Part.DEPLOYMENT, "dep"), patch(Part.DEPLOYMENT, "dep")
    other = patch(Part.PROXY_CONFIGMAP, "proxy")
    create = Create(Part.INTERNAL_SERVICE, {"metadata": {"name": "int"}})
    assert _waves([first, other, second, create]) == [[first, other], [second, create]]
