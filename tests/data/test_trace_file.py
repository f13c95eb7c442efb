"""Our columnar file (``.gpumem``): every field comes back, at any length and chunk boundary,
and files of format 1 still load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trace_cases import random_trace

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data import trace_file
from jupyter_gpumem.data.columns import FIELDS, TraceColumns
from jupyter_gpumem.data.files import load_snapshot, save_format, save_snapshot
from jupyter_gpumem.data.schema import LoadLimits

MiB = 1 << 20
FIXTURES = Path(__file__).parent / "fixtures"
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
BIG = LoadLimits(max_events=1 << 24)
SMALL_CHUNK = trace_file.MIN_CHUNK_EVENTS


def _snapshot(*traces: object) -> dict[str, object]:
    return {"segments": [], "device_traces": list(traces), "jupyter_gpumem": {"device": 0}}


def _same_trace(a: TraceColumns, b: TraceColumns) -> None:
    assert type(b) is TraceColumns and len(a) == len(b)
    for name, dtype in FIELDS.items():
        assert b.column(name).dtype == np.dtype(dtype), name
        assert np.array_equal(a.column(name), b.column(name)), name
    assert a.stacks == b.stacks and a.others == b.others


def _round_trip(tmp_path: Path, *traces: TraceColumns,
                limits: LoadLimits = BIG) -> list[TraceColumns]:
    path = tmp_path / "t.gpumem"
    save_snapshot(_snapshot(*traces), path)
    back: list[TraceColumns] = load_snapshot(path, limits=limits)["device_traces"]
    assert len(back) == len(traces)
    for a, b in zip(traces, back, strict=True):
        _same_trace(a, b)
    return back


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


@pytest.mark.parametrize("seed", range(4))
def test_random_traces_round_trip_over_several_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(trace_file, "CHUNK_EVENTS", SMALL_CHUNK)
    rng = np.random.default_rng(seed)
    _round_trip(tmp_path, *(random_trace(seed * 10 + d, int(rng.integers(0, 5000)))
                            for d in range(3)))


@pytest.mark.parametrize("n", [0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, SMALL_CHUNK + 1,
                               3 * SMALL_CHUNK])
def test_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(trace_file, "CHUNK_EVENTS", SMALL_CHUNK)
    _round_trip(tmp_path, random_trace(n, n))
    header = _layout((tmp_path / "t.gpumem").read_bytes())[0]
    assert header["chunk"] == SMALL_CHUNK
    assert all(len(c) == -(-n // SMALL_CHUNK) for c in header["traces"][0]["columns"].values())


@pytest.mark.parametrize("n", [trace_file.CHUNK_EVENTS, trace_file.CHUNK_EVENTS + 1])
def test_the_default_chunk_and_one_more_event(tmp_path: Path, n: int) -> None:
    _round_trip(tmp_path, random_trace(7, n))


def test_constant_columns_steps_and_every_int64_come_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_file, "CHUNK_EVENTS", SMALL_CHUNK)
    n = 3 * SMALL_CHUNK + 5
    top, low = (1 << 63) - 1, -(1 << 63)
    cols = {
        "action": np.full(n, 2), "addr": np.zeros(n, dtype=np.int64),
        "size": np.arange(n) * 512,  # a constant step: nothing stored
        "stream": np.random.default_rng(2).integers(low, top, n, endpoint=True),
        "time_us": np.where(np.arange(n) % 2, top, low),  # steps of 1 once wrapped
        "stack": np.full(n, -1), "cell": np.repeat(np.arange(n // 100 + 1) * 10_000, 100)[:n],
        "extra": np.random.default_rng(3).integers(0, 1 << 40, n),
    }
    cols["time_us"][7] = 5
    back = _round_trip(tmp_path, TraceColumns(cols))[0]
    assert back.column("task").tolist() == [-1] * n
    columns = _layout((tmp_path / "t.gpumem").read_bytes())[0]["traces"][0]["columns"]
    assert {enc[1] for enc in columns["addr"]} == {0}  # constant: no bytes at all
    assert columns["size"][0][1:] == [0, 512, -512]  # a delta of width 0: start + 512 each
    assert {enc[1] for enc in columns["stream"]} == {8}
    assert {enc[1] for enc in columns["time_us"]} == {8, 1}  # the chunk of event 7: 8


def test_a_recorded_trace_round_trips_small(tmp_path: Path) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True)
    live = []
    for i in range(3000):
        live.append(a.malloc((i % 7 + 1) * 100_000))
        if i % 3:
            a.free(live.pop(0))
    snap = a.snapshot()
    path = tmp_path / "run.gpumem"
    save_snapshot(snap, path)
    back = load_snapshot(path, limits=BIG)
    mine, theirs = snap["device_traces"][0], back["device_traces"][0]
    _same_trace(mine, theirs)
    assert back["segments"] == json.loads(json.dumps(snap["segments"]))  # tuples as lists
    # far below the 16 bytes an event, and much smaller than the same as JSON
    assert path.stat().st_size < 16 * len(mine)
    save_snapshot(snap, tmp_path / "run.json")
    assert path.stat().st_size * 4 < (tmp_path / "run.json").stat().st_size


def test_a_file_of_format_1_still_loads(tmp_path: Path) -> None:
    # written by format 1's writer from random_trace(1, 1500) and random_trace(2, 0), in
    # chunks of 512 bytes: several a column
    old = FIXTURES / "trace_format1.gpumem"
    assert old.read_bytes()[:8] == b"GPUMEM\x00\x01"
    loaded = load_snapshot(old, limits=LoadLimits(max_events=2000))
    _same_trace(random_trace(1, 1500), loaded["device_traces"][0])
    _same_trace(random_trace(2, 0), loaded["device_traces"][1])
    assert loaded["jupyter_gpumem"] == {"device": 0}
    # saved again, it is format 2 and the same
    save_snapshot(loaded, tmp_path / "new.gpumem")
    assert (tmp_path / "new.gpumem").read_bytes()[:8] == trace_file.MAGIC
    again = load_snapshot(tmp_path / "new.gpumem", limits=BIG)["device_traces"]
    _same_trace(loaded["device_traces"][0], again[0])
    shutil.copy(old, tmp_path / "old.gpumem")  # a truncated old file is refused by name
    data = (tmp_path / "old.gpumem").read_bytes()
    (tmp_path / "old.gpumem").write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"truncated: it ends inside device_traces\[\d\] column"):
        load_snapshot(tmp_path / "old.gpumem", limits=BIG)


def test_json_and_pickles_still_load_and_save_from_columns(tmp_path: Path) -> None:
    cols = TraceColumns.from_entries(ENTRIES)
    for name in ("t.json", "t.json.gz", "t.pickle"):
        save_snapshot(_snapshot(cols), tmp_path / name)
        assert list(load_snapshot(tmp_path / name, limits=LIMITS)["device_traces"][0]) \
            == ENTRIES


def _layout(data: bytes) -> tuple[dict[str, Any], int]:
    """A file's header and where its chunks begin."""
    import struct
    import zlib

    at = len(trace_file.MAGIC)
    packed, _ = struct.unpack("<QQ", data[at:at + 16])
    return json.loads(zlib.decompress(data[at + 16:at + 16 + packed])), at + 16 + packed
