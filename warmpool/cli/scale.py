"""`warmpool scale`: the admin's way to resize a pool.

It changes only spec.minInstances (and spec.maxInstances with --max), with a JSON merge patch
carrying the resourceVersion it read, so a concurrent edit is never overwritten: a 409 makes it
read again, validate again and retry. Lowering minInstances below claimed ids is safe (that is
the defect warmpool fixes): claimed instances stay until their Session ends.

Before writing, the AppDefinition as it would be is checked by the controller's own validation
(`warmpool.pool.validate.validate_appdefinition`: the ceiling, min <= max, the rest of the
spec, selector collisions), so a change the controller would refuse is never written: an
invalid AppDefinition is left as it is by the controller (issue #27: `--min 5001` used to
be written, and froze the pool). `--dry-run` sends the patch with dryRun=All: the API server
checks and answers it, nothing is stored.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import click

from warmpool.cli.output import Output, output_options
from warmpool.config import KubeConfig, kube_options
from warmpool.errors import BadValue, CliError, NotFound
from warmpool.pool import vocabulary as v
from warmpool.pool.model import CEILING_SETTING, MAX_INSTANCES_CEILING, Invalid
from warmpool.pool.validate import validate_appdefinition

ATTEMPTS = 5


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_flags(min_n: int, max_n: int | None) -> None:
    """What can be told wrong before reading the AppDefinition."""
    if min_n < 0:
        raise BadValue(f"--min must be 0 or more, got {min_n}")
    if max_n is not None and max_n < 0:
        raise BadValue(f"--max must be 0 or more, got {max_n}")
    if max_n is not None and min_n > max_n:
        raise BadValue(f"--min {min_n} exceeds --max {max_n}; minInstances must not exceed "
                       "maxInstances")


def new_max(name: str, min_n: int, max_n: int | None, current_max: Any) -> int:
    """The maxInstances after scaling (checked against --min), or BadValue saying what to pass."""
    check_flags(min_n, max_n)
    if max_n is not None:
        return max_n
    current = _int(current_max)
    if current is None:
        raise BadValue(f"AppDefinition {name} has no integer spec.maxInstances "
                       f"({current_max!r}); pass --max as well")
    if min_n > current:
        raise BadValue(f"--min {min_n} exceeds {name}'s maxInstances {current}; pass "
                       f"--max {min_n} (or more) to raise it too")
    return current


def check_result(
    name: str, obj: Mapping[str, Any], spec_patch: Mapping[str, Any],
    namespace_appdefs: Sequence[Mapping[str, Any]], ceiling: int,
) -> None:
    """BadValue, in one line, if the controller would refuse AppDefinition `obj` once
    `spec_patch` is merged into its spec (the controller's validation, not a copy of it)."""
    after = copy.deepcopy(dict(obj))
    spec = after.get("spec")
    after["spec"] = {**(spec if isinstance(spec, Mapping) else {}), **spec_patch}
    verdict = validate_appdefinition(after, namespace_appdefs, max_instances_ceiling=ceiling)
    if isinstance(verdict, Invalid):
        raise BadValue(f"refused, nothing written: AppDefinition {name} would be invalid "
                       f"({verdict.message}), and the controller leaves an invalid pool as "
                       "it is")


@click.command("scale")
@click.argument("appdef")
@click.option("--min", "min_n", type=int, required=True, metavar="N",
              help="New spec.minInstances: the pool size (0 <= N <= max).")
@click.option("--max", "max_n", type=int, default=None, metavar="M",
              help="New spec.maxInstances [default: unchanged; N must not exceed it].")
@click.option("--dry-run", "dry_run", is_flag=True,
              help="Send the patch with the API server's dryRun=All: checked and answered "
                   "by the server, nothing stored; print what would change.")
@click.option("--instances-ceiling", "ceiling", type=click.IntRange(min=1),
              default=MAX_INSTANCES_CEILING, show_default=True, envvar=CEILING_SETTING,
              metavar="N",
              help=f"The controller's ceiling on min/maxInstances (its {CEILING_SETTING}); "
                   f"[env: {CEILING_SETTING}].")
@kube_options
@output_options
def scale(appdef: str, min_n: int, max_n: int | None, dry_run: bool, ceiling: int,
          kube: KubeConfig, out: Output) -> None:
    """Set APPDEF's minInstances (the number of prewarmed instances), and maxInstances with
    --max, then print old -> new.

    Claimed instances are kept whatever minInstances becomes; they go when their Session
    ends. A change the controller would refuse (above its ceiling, or any other reason its
    validation gives) is refused here, before anything is written. The write carries the
    resourceVersion it read: if the AppDefinition changed meanwhile it is read, checked
    and written again (up to 5 times).

    \b
    -o wide: the same as the default.
    -o json | -o yaml: {"namespace", "appdefinition", "changed": bool, "dryRun": bool,
      "old": {"minInstances", "maxInstances"},
      "new": {"minInstances", "maxInstances"}, "generation"}
    """
    check_flags(min_n, max_n)
    client, namespace = kube.connect()
    from warmpool.kube.api import Conflict

    for _ in range(ATTEMPTS):
        obj = client.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace, appdef)
        if obj is None:
            raise NotFound(f"AppDefinition {appdef!r} not found in namespace {namespace!r}; "
                           f"'warmpool status -n {namespace}' lists those there")
        spec = obj.get("spec") or {}
        old = {"minInstances": spec.get("minInstances"), "maxInstances": spec.get("maxInstances")}
        new: dict[str, Any] = {
            "minInstances": min_n,
            "maxInstances": new_max(appdef, min_n, max_n, old["maxInstances"])}
        meta = obj["metadata"]
        generation = meta.get("generation")
        changed = new != old
        patch = {"minInstances": min_n, **({"maxInstances": max_n} if max_n is not None
                                           and max_n != old["maxInstances"] else {})}
        # Selector collisions are judged against the namespace's others, as the controller
        # judges them (one LIST).
        others, _ = client.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)
        check_result(appdef, obj, patch, others, ceiling)
        if changed:
            try:
                written = client.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace,
                                             appdef, {"spec": patch},
                                             resource_version=meta["resourceVersion"],
                                             dry_run=dry_run)
            except Conflict:
                continue  # changed under us: read, check and write again
            generation = written["metadata"].get("generation")
            if dry_run:  # what the server says it would store
                answer = written.get("spec") or {}
                new = {key: answer.get(key) for key in new}
        break
    else:
        raise CliError(f"AppDefinition {appdef} kept changing ({ATTEMPTS} conflicting writes "
                       "in a row); try again")
    if out.document({"namespace": namespace, "appdefinition": appdef, "changed": changed,
                     "dryRun": dry_run, "old": old, "new": new, "generation": generation}):
        return
    parts = []
    for key in ("minInstances", "maxInstances"):
        parts.append(f"{key} {old[key]} -> {new[key]}" if old[key] != new[key]
                     else f"{key} {new[key]} (unchanged)")
    note = ("" if not dry_run else " (dry run: the API server accepted it, nothing was written)"
            if changed else " (dry run: nothing to change, nothing sent)")
    out.line(f"{namespace}/{appdef}: " + ", ".join(parts) + note)
