"""A bad ``.gpumem`` file (truncated, corrupt, lying, or past the limits) is refused by name,
with what is wrong, before its columns are unpacked."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trace_cases import random_trace

from jupyter_gpumem.data import trace_file
from jupyter_gpumem.data.columns import FIELDS
from jupyter_gpumem.data.files import SnapshotFileError, load_snapshot, save_snapshot
from jupyter_gpumem.data.schema import LoadLimits
from jupyter_gpumem.data.trace_file import MAGIC, MIN_CHUNK_EVENTS

LIMITS = LoadLimits(max_events=100_000)
N = 3 * MIN_CHUNK_EVENTS + 10  # four chunks a column


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A file of two traces, in chunks of the fewest events a file may have."""
    monkeypatch.setattr(trace_file, "CHUNK_EVENTS", MIN_CHUNK_EVENTS)
    path = tmp_path / "t.gpumem"
    save_snapshot({"segments": [], "device_traces": [random_trace(5, N), random_trace(6, 40)]},
                  path)
    return path.read_bytes()


def _split(data: bytes) -> tuple[dict[str, Any], int]:
    """A file's header and where its chunks begin."""
    packed = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])[0]
    start = len(MAGIC) + 16
    return json.loads(zlib.decompress(data[start:start + packed])), start + packed


def _chunk_at(data: bytes, d: int, name: str, i: int) -> tuple[int, int]:
    """Where chunk ``i`` of column ``name`` of trace ``d`` begins in the file, and its bytes."""
    header, at = _split(data)
    for e, meta in enumerate(header["traces"]):
        for column in FIELDS:
            for j, enc in enumerate(meta["columns"][column]):
                if (e, column, j) == (d, name, i):
                    return at, enc[0]
                at += enc[0]
    raise AssertionError("no such chunk")


def _with_header(data: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    header, at = _split(data)
    change(header)
    raw = json.dumps(header).encode()
    packed = zlib.compress(raw)
    return MAGIC + struct.pack("<QQ", len(packed), len(raw)) + packed + data[at:]


def _refused(tmp_path: Path, data: bytes, match: str, limits: LoadLimits = LIMITS) -> None:
    bad = tmp_path / "bad.gpumem"
    bad.write_bytes(data)
    with pytest.raises(SnapshotFileError, match=match) as info:
        load_snapshot(bad, limits=limits)
    assert isinstance(info.value, ValueError) and str(info.value).startswith(str(bad))


def test_the_file_loads_as_written(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "ok.gpumem").write_bytes(data)
    assert [len(t) for t in load_snapshot(tmp_path / "ok.gpumem",
                                          limits=LIMITS)["device_traces"]] == [N, 40]


def test_a_truncated_file_names_the_column_it_ends_in(tmp_path: Path, data: bytes) -> None:
    _refused(tmp_path, data[:10], "ends inside its header")
    _refused(tmp_path, data[:len(MAGIC) + 20], "ends inside its header")
    at, size = _chunk_at(data, 0, "addr", 2)
    _refused(tmp_path, data[:at + size // 2], "truncated: it ends inside device_traces\\[0\\] "
             "column 'addr'")
    at, _ = _chunk_at(data, 1, "time_us", 0)
    _refused(tmp_path, data[:at], "truncated: it ends inside device_traces\\[1\\] column "
             "'time_us'")
    _refused(tmp_path, data[:-1], "truncated: it ends inside device_traces\\[1\\]")
    _refused(tmp_path, data + b"\x00", "goes on after its last column")


def test_a_corrupt_chunk_is_refused(tmp_path: Path, data: bytes) -> None:
    at, size = _chunk_at(data, 0, "size", 1)
    for where in (at, at + size // 2, at + size - 1):  # the start, the middle, the checksum
        bad = bytearray(data)
        bad[where] ^= 0x5A
        _refused(tmp_path, bytes(bad), "device_traces\\[0\\] column 'size' chunk 1: (corrupt "
                 "compressed data|its compressed data does not come to)")
    # two chunks of different widths swapped, the header's sizes with them
    a_at, a_size = _chunk_at(data, 0, "addr", 0)
    b_at, b_size = _chunk_at(data, 0, "action", 0)
    swapped = (data[:b_at] + data[a_at:a_at + a_size] + data[b_at + b_size:a_at]
               + data[b_at:b_at + b_size] + data[a_at + a_size:])

    def sizes(h: dict[str, Any]) -> None:
        cols = h["traces"][0]["columns"]
        cols["action"][0][0], cols["addr"][0][0] = a_size, b_size

    _refused(tmp_path, _with_header(swapped, sizes), "column '(action|addr)'.*(does not come "
             "to|its sizes disagree)")


def test_newer_and_unknown_versions_are_refused(tmp_path: Path, data: bytes) -> None:
    _refused(tmp_path, MAGIC[:-1] + b"\x09" + data[len(MAGIC):], "format version 9, which "
             "this version of jupyter_gpumem does not read \\(it reads 1 and 2\\)")
    _refused(tmp_path, MAGIC[:-1], "format version \\?")


def test_limits_are_enforced_before_anything_is_unpacked(tmp_path: Path, data: bytes) -> None:
    _refused(tmp_path, data, "max_events", LoadLimits(max_events=N))
    _refused(tmp_path, data, "max_bytes", LoadLimits(max_bytes=N))
    _refused(tmp_path, data, "max_devices", LoadLimits(max_devices=1))

    def huge(h: dict[str, Any]) -> None:  # a trillion events, in as many chunks
        meta = h["traces"][0]
        meta["events"] = 1 << 40
        for encs in meta["columns"].values():
            encs[:] = [[0, 0, 0, None]] * 5

    _refused(tmp_path, _with_header(data, huge), "max_events")
    _refused(tmp_path, _with_header(data, huge), "does not hold 1,099,511,627,776 values",
             LoadLimits(max_events=1 << 41))


@pytest.mark.parametrize(("change", "match"), [
    (lambda h: h["traces"][0].update(events=N + 1), "chunk 3: its compressed data does not "
     "come to"),
    (lambda h: h["traces"][0].update(events=N + MIN_CHUNK_EVENTS), "does not hold"),
    (lambda h: h.update(chunk=1), "chunk is not a number of events of at least 1,024: 1"),
    (lambda h: h.update(chunk="all"), "chunk is not a number of events"),
    (lambda h: h["traces"][0]["columns"]["addr"][0].__setitem__(0, 1 << 40),
     "column 'addr': its sizes disagree"),
    (lambda h: h["traces"][0]["columns"]["addr"][1].__setitem__(1, 3), "'addr': a bad encoding"),
    (lambda h: h["traces"][0]["columns"]["addr"][1].__setitem__(2, 1 << 64),
     "'addr': a bad encoding"),
    (lambda h: h["traces"][0]["columns"]["stream"][1].__setitem__(3, "x"),
     "'stream': a bad encoding"),
    (lambda h: h["traces"][0]["columns"].pop("task"), "not a trace's columns"),
    (lambda h: h["traces"][0]["columns"]["action"][0].__setitem__(2, 1000),
     "column 'action' chunk 0: holds values outside uint8 \\[0, 255\\]"),
    (lambda h: h["traces"][0]["columns"]["cell"][2].__setitem__(3, 1 << 40),
     "column 'cell' chunk 2: holds values outside int32"),
    (lambda h: h["traces"][0].update(stacks=[]), "stack index \\d is not one of its 0"),
    (lambda h: h["traces"][1].update(others={"40": {"x": 1}}), "extra keys are not by event"),
    (lambda h: h["traces"][1].update(others={"one": {"x": 1}}), "extra keys are not by event"),
    (lambda h: h.update(traces={}), "not a snapshot and a list of traces"),
])
def test_a_lying_header_is_caught(tmp_path: Path, data: bytes,
                                  change: Callable[[dict[str, Any]], None], match: str) -> None:
    _refused(tmp_path, _with_header(data, change), match)
