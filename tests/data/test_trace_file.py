"""Our columnar file (``.gpumem``): every field comes back, and a bad file is refused by name."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.columns import FIELDS, TraceColumns
from jupyter_gpumem.data.files import SnapshotFileError, load_snapshot, save_format, save_snapshot
from jupyter_gpumem.data.schema import LoadLimits
from jupyter_gpumem.data.trace_file import MAGIC

MiB = 1 << 20
FRAMES = [{"filename": "train.py", "line": 12, "name": "step"}]
ENTRIES = [
    {"action": "segment_alloc", "addr": 1 << 40, "size": 20 * MiB, "stream": 0, "time_us": 1,
     "frames": FRAMES},
    {"action": "alloc", "addr": 1 << 40, "size": 1000, "stream": 7, "time_us": 2,
     "frames": FRAMES, "block_size": 1024, "cell": 3},
    {"action": "oom", "addr": 0, "size": 1 << 62, "stream": 0, "time_us": 3, "frames": [],
     "device_free": 512, "requested_size": 1 << 61, "task": 2},
    {"action": "segment_map", "addr": 1 << 41, "size": 2 * MiB, "stream": -5, "time_us": 4,
     "frames": [], "virtual_address": 1 << 41, "segment_type": "small"},
    {"action": "teleport", "addr": 5, "size": 0, "stream": 0, "time_us": -9, "frames": []},
    {"action": "segment_free", "addr": 1 << 40, "size": 20 * MiB, "stream": 0, "time_us": 5,
     "frames": [dict(FRAMES[0])], "reason": "empty_cache", "compile_context": "N/A"},
]
LIMITS = LoadLimits(max_events=1000)


def _snapshot(*traces: object) -> dict[str, object]:
    return {"segments": [], "device_traces": list(traces), "jupyter_gpumem": {"device": 0}}


def test_every_field_of_every_device_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "t.gpumem"
    assert save_format(path) == "gpumem"
    save_snapshot(_snapshot(ENTRIES, [], TraceColumns.from_entries(ENTRIES[:2])), path)
    loaded = load_snapshot(path, limits=LIMITS)
    traces = loaded["device_traces"]
    assert all(type(t) is TraceColumns for t in traces)
    assert [len(t) for t in traces] == [6, 0, 2]
    assert traces[0].entries() == ENTRIES and traces[2].entries() == ENTRIES[:2]
    assert loaded["jupyter_gpumem"] == {"device": 0} and "schema" in loaded


def test_a_recorded_trace_round_trips_column_for_column(tmp_path: Path) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True)
    live = []
    for i in range(300):
        live.append(a.malloc((i % 7 + 1) * 100_000))
        if i % 3:
            a.free(live.pop(0))
    snap = a.snapshot()
    path = tmp_path / "run.gpumem"
    save_snapshot(snap, path)
    back = load_snapshot(path, limits=LIMITS)
    mine, theirs = snap["device_traces"][0], back["device_traces"][0]
    for name in FIELDS:
        assert np.array_equal(mine.column(name), theirs.column(name)), name
    assert mine.stacks == theirs.stacks
    assert back["segments"] == json.loads(json.dumps(snap["segments"]))  # tuples as lists
    # and much smaller than the same snapshot as JSON
    save_snapshot(snap, tmp_path / "run.json")
    assert path.stat().st_size * 4 < (tmp_path / "run.json").stat().st_size


def _saved(tmp_path: Path) -> bytes:
    path = tmp_path / "t.gpumem"
    save_snapshot(_snapshot(ENTRIES), path)
    return path.read_bytes()


def _refused(tmp_path: Path, data: bytes, match: str, limits: LoadLimits = LIMITS) -> None:
    bad = tmp_path / "bad.gpumem"
    bad.write_bytes(data)
    with pytest.raises(SnapshotFileError, match=match):
        load_snapshot(bad, limits=limits)


def test_truncated_corrupt_and_newer_files_are_refused_by_what_is_wrong(tmp_path: Path) -> None:
    data = _saved(tmp_path)
    _refused(tmp_path, data[:10], "ends inside its header")
    _refused(tmp_path, data[:-3], "truncated: it ends inside device_traces\\[0\\] column")
    header_end = len(MAGIC) + 16 + struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])[0]
    flipped = bytearray(data)
    flipped[header_end + 2] ^= 0xFF
    _refused(tmp_path, bytes(flipped), "corrupt compressed data|does not come to")
    _refused(tmp_path, MAGIC[:-1] + b"\x09" + data[len(MAGIC):], "format version 9")


def _with_header(data: bytes, change: object) -> bytes:
    n = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])[0]
    header = json.loads(zlib.decompress(data[len(MAGIC) + 16:len(MAGIC) + 16 + n]))
    change(header)  # type: ignore[operator]
    raw = json.dumps(header).encode()
    packed = zlib.compress(raw)
    return (MAGIC + struct.pack("<QQ", len(packed), len(raw)) + packed
            + data[len(MAGIC) + 16 + n:])


def test_limits_and_lying_headers_are_caught_before_the_columns_are_unpacked(
        tmp_path: Path) -> None:
    data = _saved(tmp_path)
    _refused(tmp_path, data, "max_events", LoadLimits(max_events=5))
    _refused(tmp_path, data, "max_bytes", LoadLimits(max_bytes=100))

    def more_events(h: dict) -> None:
        h["traces"][0]["events"] = 7

    _refused(tmp_path, _with_header(data, more_events), "does not hold 7 values")

    def bomb(h: dict) -> None:  # a chunk that says it unpacks to a gigabyte
        col = h["traces"][0]["columns"]["addr"]
        col["chunks"][0][1] = 1 << 30

    _refused(tmp_path, _with_header(data, bomb), "max_bytes|does not hold")

    def bad_action(h: dict) -> None:
        h["traces"][0]["columns"]["action"]["base"] = 1000

    _refused(tmp_path, _with_header(data, bad_action), "outside uint8")

    def bad_stack(h: dict) -> None:
        h["traces"][0]["stacks"] = []

    _refused(tmp_path, _with_header(data, bad_stack), "stack index 0 is not one of its 0")


def test_json_and_pickles_still_load_and_save_from_columns(tmp_path: Path) -> None:
    cols = TraceColumns.from_entries(ENTRIES)
    for name in ("t.json", "t.json.gz", "t.pickle"):
        save_snapshot(_snapshot(cols), tmp_path / name)
        assert list(load_snapshot(tmp_path / name, limits=LIMITS)["device_traces"][0]) \
            == ENTRIES
