"""`warmpool scale`: the admin's way to resize a pool.

It changes only spec.minInstances (and spec.maxInstances with --max), with a JSON merge patch
carrying the resourceVersion it read, so a concurrent edit is never overwritten: a 409 makes it
read again, validate again and retry. Lowering minInstances below claimed ids is safe (that is
the defect warmpool fixes): claimed instances stay until their Session ends.
"""

from __future__ import annotations

from typing import Any

import click

from warmpool.cli.config import KubeConfig, json_option, kube_options
from warmpool.cli.errors import BadValue, CliError, NotFound
from warmpool.cli.output import console, emit_json
from warmpool.pool import vocabulary as v

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


@click.command("scale")
@click.argument("appdef")
@click.option("--min", "min_n", type=int, required=True, metavar="N",
              help="New spec.minInstances: the pool size (0 <= N <= max).")
@click.option("--max", "max_n", type=int, default=None, metavar="M",
              help="New spec.maxInstances [default: unchanged; N must not exceed it].")
@kube_options
@json_option
def scale(appdef: str, min_n: int, max_n: int | None, kube: KubeConfig, as_json: bool) -> None:
    """Set APPDEF's minInstances (the number of prewarmed instances), and maxInstances with
    --max, then print old -> new.

    Claimed instances are kept whatever minInstances becomes; they go when their Session
    ends. The write carries the resourceVersion it read: if the AppDefinition changed
    meanwhile it is read, checked and written again (up to 5 times).

    \b
    JSON (--json): {"namespace", "appdefinition", "changed": bool,
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
        new = {"minInstances": min_n,
               "maxInstances": new_max(appdef, min_n, max_n, old["maxInstances"])}
        meta = obj["metadata"]
        generation = meta.get("generation")
        changed = new != old
        if changed:
            patch = {"minInstances": min_n, **({"maxInstances": max_n} if max_n is not None
                                               and max_n != old["maxInstances"] else {})}
            try:
                written = client.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace,
                                             appdef, {"spec": patch},
                                             resource_version=meta["resourceVersion"])
            except Conflict:
                continue  # changed under us: read, check and write again
            generation = written["metadata"].get("generation")
        break
    else:
        raise CliError(f"AppDefinition {appdef} kept changing ({ATTEMPTS} conflicting writes "
                       "in a row); try again")
    if as_json:
        emit_json({"namespace": namespace, "appdefinition": appdef, "changed": changed,
                   "old": old, "new": new, "generation": generation})
        return
    out = console()
    parts = []
    for key in ("minInstances", "maxInstances"):
        parts.append(f"{key} {old[key]} -> {new[key]}" if old[key] != new[key]
                     else f"{key} {new[key]} (unchanged)")
    out.print(f"{namespace}/{appdef}: " + ", ".join(parts), markup=False)
