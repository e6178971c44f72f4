"""`bench.pprof`: a Go CPU profile (profile.proto) read without Go's toolchain."""

from __future__ import annotations

import gzip

import pytest

from bench.pprof import parse, summarize


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _packed(values: list[int]) -> bytes:
    return b"".join(_varint(v) for v in values)


def _profile() -> bytes:
    """Three functions: main calls handler, which calls encode (inlined into handler's
    location); 3 samples of 10 ms in encode, 1 of 10 ms in main itself."""
    strings = [b"", b"main", b"handler", b"encode"]
    msg = b"".join(_field(6, s) for s in strings)
    for fn_id, name in ((1, 1), (2, 2), (3, 3)):
        msg += _field(5, _field(1, fn_id) + _field(2, name))
    # location 10: encode inlined into handler (innermost first); location 20: main.
    msg += _field(4, _field(1, 10) + _field(4, _field(1, 3)) + _field(4, _field(1, 2)))
    msg += _field(4, _field(1, 20) + _field(4, _field(1, 1)))
    ms10 = 10_000_000
    msg += _field(2, _field(1, _packed([10, 20])) + _field(2, _packed([3, 3 * ms10])))
    msg += _field(2, _field(1, 20) + _field(2, 1) + _field(2, ms10))  # unpacked fields
    msg += _field(10, 2_000_000_000)
    return gzip.compress(msg)


def test_a_profile_reads_as_stacks_leaf_first_with_their_cpu_time() -> None:
    prof = parse(_profile())
    assert prof.duration_ns == 2_000_000_000
    assert prof.samples == [(("encode", "handler", "main"), 30_000_000),
                            (("main",), 10_000_000)]


def test_the_summary_names_flat_and_cumulative_shares() -> None:
    text = "\n".join(summarize(_profile()))
    assert "s of CPU in 2 s (0.02 cores)" in text
    flat = text.split("flat:")[1].split("cumulative:")[0]
    cumulative = text.split("cumulative:")[1]
    assert "75.0%  encode" in flat and "25.0%  main" in flat
    assert "100.0%  main" in cumulative and "75.0%  handler" in cumulative


def test_bytes_that_are_not_a_profile_are_refused_not_misread() -> None:
    with pytest.raises((ValueError, IndexError)):
        parse(b"\x07\x01\x02")  # wire type 7 does not exist
