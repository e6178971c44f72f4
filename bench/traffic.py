"""API traffic per unit of work, from the latency proxy's counters (`ApiProxy.traffic()`).

The benchmarks divide what passed through the proxy in a window (requests and response body
bytes, by verb) by the work done in it: Sessions served, instance changes. Watch streams are
kept apart: a watch is one request however long it streams, and its bytes are the events the
scheduler was sent, not reads a claim or a reconcile chose to make.
"""

from __future__ import annotations

from collections import Counter

from warmpool.testing.apiproxy import VERBS, Traffic

#: The order verbs are written in (reads first, then writes).
SHOWN = tuple(v for v in VERBS if v != "WATCH")


def kb(n: float) -> str:
    """Bytes as kB with a precision that suits the size."""
    k = n / 1000
    return f"{k:,.0f} kB" if k >= 100 else f"{k:.1f} kB"


def num(x: float) -> str:
    """A per-unit count: one decimal, more for the rare (0.004 LISTs per change)."""
    return f"{x:.1f}" if x >= 0.1 or x == 0 else f"{x:.3f}"


def by_verb(t: Traffic, per: float) -> str:
    """"GET 5.0, LIST 3.0, PATCH 2.0" per unit (verbs that occurred, watches left out)."""
    parts = [f"{verb} {num(t.requests.get(verb, 0) / per)}" for verb in SHOWN
             if t.requests.get(verb, 0)]
    return ", ".join(parts) or "none"


def bytes_by_verb(t: Traffic, per: float) -> str:
    """"LIST 480 kB, GET 12.0 kB" per unit, largest first (watches left out)."""
    parts = sorted(((t.bytes.get(verb, 0) / per, verb) for verb in SHOWN
                    if t.bytes.get(verb, 0)), reverse=True)
    return ", ".join(f"{verb} {kb(n)}" for n, verb in parts) or "none"


def requests_per(t: Traffic, per: float) -> float:
    return t.total_requests() / per if per else float("nan")


def bytes_per(t: Traffic, per: float) -> float:
    return t.total_bytes() / per if per else float("nan")


def describe(t: Traffic, per: float, unit: str) -> str:
    """"11.0 requests / claim (GET 5.0, LIST 3.0, PATCH 3.0); 480 kB / claim"."""
    if not per:
        return f"no {unit}"
    return (f"{requests_per(t, per):.1f} requests / {unit} ({by_verb(t, per)}); "
            f"{kb(bytes_per(t, per))} / {unit}")


def watch_note(t: Traffic, per: float, unit: str,
               by_resource: Counter[str] | None = None) -> str:
    """The watch streams' share of a window, reported beside (not in) the per-unit cost;
    with `by_resource` (`ApiProxy.watch_bytes`), which kinds' events those bytes were, the
    largest first: what every watching process decodes."""
    if not per:
        return ""
    opened = t.requests.get("WATCH", 0)
    kinds = ""
    if by_resource:
        kinds = " (" + ", ".join(f"{res} {kb(n / per)}" for res, n in by_resource.most_common()
                                 if n > 0) + ")"
    return (f"watch streams: {kb(t.bytes.get('WATCH', 0) / per)} of events / {unit}{kinds}, "
            f"{opened} opened in the window (not counted above)")


def top_shapes(shapes: Counter[tuple[str, str, int]], per: float, n: int) -> str:
    """"PATCH services 200 2.0, ..." : the `n` most frequent (verb, resource, status) of a
    window (`ApiProxy.shapes`) per unit of work."""
    return ", ".join(f"{verb} {res} {status} {count / max(1.0, per):.1f}"
                     for (verb, res, status), count in shapes.most_common(n))
