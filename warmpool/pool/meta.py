"""Reading an object's metadata: one None-safe accessor per field the pool reads.

Objects travel through warmpool as plain mappings (API responses, the cache's stripped copies,
the scheduler's stubs, the bodies `builders` makes), and any of `metadata`, its `labels`,
`annotations` and `ownerReferences` may be absent or null, the object itself None where it
does not exist. Every reader used to spell that out again (``(obj.get("metadata") or {})
.get("labels") or {}``); these are the one spelling.

The results are the object's own values, typed read-only (`Mapping`, `Sequence`), and the
empty default is immutable: a caller that needs to change one copies it first (``dict(...)``,
``list(...)``), so nobody edits a cached object through a reader by accident. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

Obj = Mapping[str, Any]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def meta_of(obj: Obj | None) -> Mapping[str, Any]:
    """The object's `metadata` (empty for None, or an object without any)."""
    meta: Mapping[str, Any] = (obj or _EMPTY).get("metadata") or _EMPTY
    return meta


def labels_of(obj: Obj | None) -> Mapping[str, str]:
    labels: Mapping[str, str] = meta_of(obj).get("labels") or _EMPTY
    return labels


def annotations_of(obj: Obj | None) -> Mapping[str, str]:
    annotations: Mapping[str, str] = meta_of(obj).get("annotations") or _EMPTY
    return annotations


def owner_refs(obj: Obj | None) -> Sequence[Mapping[str, Any]]:
    refs: Sequence[Mapping[str, Any]] = meta_of(obj).get("ownerReferences") or ()
    return refs


def name_of(obj: Obj | None) -> str:
    """`metadata.name`, "" when there is none."""
    return str(meta_of(obj).get("name") or "")


def namespace_of(obj: Obj | None) -> str:
    """`metadata.namespace`, "" when there is none."""
    return str(meta_of(obj).get("namespace") or "")


def uid_of(obj: Obj | None) -> str:
    """`metadata.uid`, "" when there is none."""
    return str(meta_of(obj).get("uid") or "")


def resource_version_of(obj: Obj | None) -> str:
    """`metadata.resourceVersion`, "" when there is none: what a guarded write names as its
    precondition and a watch resumes from. An opaque string (compare it for equality only;
    ``reflector.rv_int`` is the one place that orders them, as etcd revisions)."""
    return str(meta_of(obj).get("resourceVersion") or "")
