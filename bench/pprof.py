"""A CPU profile of the benchmark's kube-apiserver, and a plain-text summary of it.

The controller's share of the machine is profiled with py-spy (`bench.profiling`); the API
server is the largest consumer of CPU under churn (issue #28), and what it spends it on says
which of the controller's requests cost the most. kube-apiserver serves Go's pprof at
``/debug/pprof/profile?seconds=N`` (``--profiling``, on by default): one GET, as the cluster's
admin, records N seconds of CPU samples and answers a gzip'd ``profile.proto``.

`Capture` starts that GET on a thread at the start of a window and hands back the bytes
when it ends; `summarize` reads them without Go's toolchain (this machine has none once the
control plane is built): the functions with the most samples on top of the stack (flat), and
those most often on it at all (cumulative), as `go tool pprof -top` prints them. The decoder
reads only the fields it needs of the protobuf wire format (varints, length-delimited
records); the file is saved beside the py-spy files, for `go tool pprof` where one is at hand.
"""

from __future__ import annotations

import gzip
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from warmpool.cluster.apimetrics import read_as_admin
from warmpool.cluster.local import ClusterInfo

# --- the protobuf wire format: just what profile.proto needs ---------------------------------

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message: an int for a varint
    (or a fixed-width number), the bytes of a length-delimited one."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            yield number, wire, buf[pos:pos + size]
            pos += size
        elif wire == _I64:
            yield number, wire, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == _I32:
            yield number, wire, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {pos}: not a profile")


def _ints(wire: int, value: int | bytes) -> list[int]:
    """A repeated integer field's values: packed (one record) or one at a time."""
    if wire == _LEN:
        assert isinstance(value, bytes)
        out, pos = [], 0
        while pos < len(value):
            n, pos = _varint(value, pos)
            out.append(n)
        return out
    assert isinstance(value, int)
    return [value]


@dataclass
class Profile:
    """What the summary reads of a profile.proto: each sample's stack (leaf first, as
    function names) and its CPU time in nanoseconds."""

    samples: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    duration_ns: int = 0


def _sample(buf: bytes) -> tuple[list[int], list[int]]:
    """A Sample: its location ids (leaf first) and its values."""
    locs: list[int] = []
    vals: list[int] = []
    for n, w, val in _fields(buf):
        if n == 1:
            locs += _ints(w, val)
        elif n == 2:
            vals += _ints(w, val)
    return locs, vals


def _location(buf: bytes) -> tuple[int, list[int]]:
    """A Location: its id and the function ids of its lines, innermost (inlined) first."""
    loc_id, funcs = 0, []
    for n, _w, val in _fields(buf):
        if n == 1 and isinstance(val, int):
            loc_id = val
        elif n == 4 and isinstance(val, bytes):  # Line
            funcs += [f for ln, _lw, f in _fields(val) if ln == 1 and isinstance(f, int)]
    return loc_id, funcs


def _function(buf: bytes) -> tuple[int, int]:
    """A Function: its id and its name's index in the string table."""
    fn_id = name = 0
    for n, _w, val in _fields(buf):
        if n == 1 and isinstance(val, int):
            fn_id = val
        elif n == 2 and isinstance(val, int):
            name = val
    return fn_id, name


def parse(data: bytes) -> Profile:
    """Decode a (gzip'd) profile.proto. Samples carry [count, nanoseconds] in a Go CPU
    profile; the last value is the one summed."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    strings: list[str] = []
    raw_samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}  # location id -> function ids, innermost first
    functions: dict[int, int] = {}  # function id -> name's string index
    duration = 0
    for number, _wire, value in _fields(data):
        if isinstance(value, bytes):
            if number == 2:
                raw_samples.append(_sample(value))
            elif number == 4:
                loc_id, funcs = _location(value)
                locations[loc_id] = funcs
            elif number == 5:
                fn_id, name_index = _function(value)
                functions[fn_id] = name_index
            elif number == 6:  # string_table
                strings.append(value.decode(errors="replace"))
        elif number == 10:  # duration_nanos
            duration = value

    def name(fn_id: int) -> str:
        index = functions.get(fn_id, 0)
        return strings[index] if 0 <= index < len(strings) else "?"

    out = Profile(duration_ns=duration)
    for locs, vals in raw_samples:
        stack = tuple(name(f) for loc in locs for f in locations.get(loc, ()))
        out.samples.append((stack, vals[-1] if vals else 0))
    return out


# --- the summary -----------------------------------------------------------------------------

#: Coarse groups of the API server's work, by the first function on a stack (leaf first)
#: whose name holds one of these: what a request costs it, in the order checked.
GROUPS: tuple[tuple[str, str], ...] = (
    ("garbage collection", "runtime.gcBgMarkWorker"),
    ("managedFields", "fieldmanager"),
    ("managedFields", "structured-merge-diff"),
    ("TLS", "crypto/"),
    ("JSON encode", "encoding/json.(*encodeState)"),
    ("JSON decode", "json-iterator"),
    ("JSON decode", "encoding/json.(*decodeState)"),
    ("watch cache", "storage/cacher"),
    ("etcd3 store", "storage/etcd3"),
    ("etcd client", "go.etcd.io/etcd/clientv3"),
    ("etcd client", "google.golang.org/grpc"),
    ("openapi", "openapi"),
    ("admission", "admission"),
    ("authorization", "authorizer"),
    ("HTTP", "net/http"),
)


def _group(stack: tuple[str, ...]) -> str:
    for frame in stack:
        for label, marker in GROUPS:
            if marker in frame:
                return label
    return "other"


def summarize(data: bytes, top: int = 15) -> list[str]:
    """Lines of text: the profile's CPU time, its coarse groups (`GROUPS`), then the top
    functions flat and cumulative, each as a share of the profile's CPU time."""
    prof = parse(data)
    total = sum(ns for _, ns in prof.samples)
    if total <= 0:
        return ["kube-apiserver profile: no samples"]
    flat: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    for stack, ns in prof.samples:
        if stack:
            flat[stack[0]] += ns
        for frame in set(stack):
            cum[frame] += ns
        groups[_group(stack)] += ns
    seconds = prof.duration_ns / 1e9
    lines = [f"kube-apiserver: {total / 1e9:.1f} s of CPU in {seconds:.0f} s "
             f"({total / max(prof.duration_ns, 1):.2f} cores)",
             "by kind of work (the first matching frame from the leaf): " + ", ".join(
                 f"{label} {100 * ns / total:.0f}%" for label, ns in groups.most_common())]
    lines.append("flat:")
    lines += [f"  {100 * ns / total:5.1f}%  {fn[:140]}" for fn, ns in flat.most_common(top)]
    lines.append("cumulative:")
    lines += [f"  {100 * ns / total:5.1f}%  {fn[:140]}" for fn, ns in cum.most_common(top)]
    return lines


# --- the capture -----------------------------------------------------------------------------


class Capture:
    """One pprof CPU profile of the API server, recorded on a thread from its creation."""

    def __init__(self, info: ClusterInfo, seconds: int) -> None:
        self.data: bytes | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(info, seconds),
                                        name="apiserver-pprof", daemon=True)
        self._thread.start()

    def _run(self, info: ClusterInfo, seconds: int) -> None:
        try:
            self.data = read_as_admin(info, f"/debug/pprof/profile?seconds={seconds}",
                                      timeout=seconds + 60)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def result(self, out: Path | None = None, timeout: float = 120.0) -> list[str]:
        """The summary (or why there is none); with `out`, the profile saved there too."""
        self._thread.join(timeout)
        if self.data is None:
            return [f"kube-apiserver profile: none ({self.error or 'not finished'})"]
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(self.data)
        try:
            return summarize(self.data)
        except (ValueError, IndexError, OSError, EOFError) as exc:
            return [f"kube-apiserver profile: unreadable ({type(exc).__name__}: {exc})"]
