from __future__ import annotations

import numpy as np
import pytest
import render_workload
from render_workload import MiB, recorded_allocator, recorded_snapshot

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.codes import ALLOC, FREE_REQUESTED, NO_SITE
from jupyter_gpumem.data.intervals import live_at, live_intervals
from jupyter_gpumem.data.ranking import top_sites
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.sites import is_library_file, short_site, site_of
from jupyter_gpumem.data.timeline import (
    build_timeline,
    cell_boundaries,
    downsample,
    oom_indices,
    peak_index,
    trace_columns,
)


def _state(segments):
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] != "inactive")
    return allocated, sum(s["total_size"] for s in segments)


def test_columns_agree_with_replay_at_every_settled_event() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    assert len(tl) == len(snap["device_traces"][0])
    assert (tl.start_allocated, tl.start_reserved) == (0, 0)
    for i in range(len(tl)):
        if tl.action[i] == FREE_REQUESTED:
            continue  # between free_requested and free_completed the two definitions differ
        assert (int(tl.allocated[i]), int(tl.reserved[i])) == _state(replay_segments(snap, i + 1))


def test_end_matches_the_allocator() -> None:
    a = recorded_allocator()
    tl = build_timeline(a.snapshot())
    assert tl.allocated[-1] == a.memory_allocated()
    assert tl.reserved[-1] == a.memory_reserved()
    assert tl.allocated.max() == a.memory_stats()["allocated_bytes.all.peak"]


def test_a_trace_that_starts_mid_session_starts_from_the_right_state() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30, clock=ManualClock()))
    kept = a.malloc(64 * MiB)  # before history: never in the trace
    early = a.malloc(8 * MiB)
    a.record_history(True, max_entries=12)
    for _ in range(10):
        a.free(a.malloc(MiB))
    a.free(early)  # freed inside the trace, allocated before it
    snap = a.snapshot()
    tl = build_timeline(snap)
    assert tl.start_allocated == 64 * MiB + 8 * MiB
    assert _state(replay_segments(snap, 0)) == (tl.start_allocated, tl.start_reserved)
    assert tl.allocated[-1] == 64 * MiB == a.memory_allocated()
    iv = live_intervals(tl)
    # the 64 MiB block is one lump "before trace", the 8 MiB block an interval ended by its free
    assert sorted(int(s) for s in iv.size[~iv.seen]) == [8 * MiB, 64 * MiB]
    assert tl.old.addr.tolist() == [kept]  # live through the whole trace: known from segments


def test_sites_cells_ooms_and_peak() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    assert all(s.startswith(render_workload.__file__) for s in tl.sites)
    alloc_sites = {short_site(tl.sites[s]) for s in tl.site[tl.action == ALLOC]}
    assert len(alloc_sites) == 6  # six malloc lines in the workload
    assert [c for _, c in cell_boundaries(tl)] == [1, 2, 3]
    assert len(oom_indices(tl)) == 1
    p = peak_index(tl)
    assert tl.allocated[p] == tl.allocated.max()
    iv = live_intervals(tl)
    top = top_sites(tl, iv, p)
    assert top[0].bytes == 700 * MiB and top[0].count == 1
    assert sum(u.bytes for u in top) == tl.allocated[p]


def test_live_intervals_sum_to_allocated() -> None:
    tl = build_timeline(recorded_snapshot())
    iv = live_intervals(tl)
    for i in range(0, len(tl), 7):
        assert int(iv.size[live_at(iv, i)].sum()) == tl.allocated[i]
    assert (iv.site[iv.seen] != NO_SITE).all()


def test_frees_inherit_the_allocating_site() -> None:
    tl = build_timeline(recorded_snapshot())
    for i in np.flatnonzero(tl.action == FREE_REQUESTED)[:10]:
        a = np.flatnonzero((tl.action == ALLOC) & (tl.addr == tl.addr[i]) &
                           (np.arange(len(tl)) < i))[-1]
        assert tl.site[i] == tl.site[a]


def test_pytorch_trace_without_block_size_rounds_to_512() -> None:
    trace = [
        {"action": "alloc", "addr": 4096, "size": 1000, "stream": 0, "time_us": 1, "frames": []},
        {"action": "free_requested", "addr": 4096, "size": 1000, "stream": 0, "time_us": 2,
         "frames": []},
        {"action": "free_completed", "addr": 4096, "size": 1000, "stream": 0, "time_us": 2,
         "frames": []},
    ]
    tl = trace_columns(trace)  # type: ignore[arg-type]
    assert tl.allocated.tolist() == [1024, 0, 0]


def test_library_frames_are_skipped() -> None:
    frames = [
        {"filename": "/x/site-packages/cupy/_creation/basic.py", "line": 3, "name": "empty"},
        {"filename": "/home/me/train.py", "line": 12, "name": "<module>"},
    ]
    assert is_library_file(frames[0]["filename"])
    assert site_of(frames, full=True) == "/home/me/train.py:12"  # type: ignore[arg-type]
    assert site_of(frames) == "train.py:12"  # type: ignore[arg-type]
    assert short_site("/home/me/train.py:12") == "train.py:12"


def test_downsample_keeps_extremes() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 1000, 100_000)
    y[54_321] = 5000
    idx = downsample(y, 500)
    assert len(idx) <= 502
    assert 54_321 in idx and 0 in idx and len(y) - 1 in idx
    assert y[idx].min() == y.min()
    assert (np.diff(idx) > 0).all()
    assert downsample(y[:10], 500).tolist() == list(range(10))


def test_empty_trace() -> None:
    tl = trace_columns([])
    assert len(tl) == 0 and peak_index(tl) == -1 and cell_boundaries(tl) == []


@pytest.mark.parametrize("n", [3000])
def test_vectorised_pairing_handles_address_reuse(n: int) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30, clock=ManualClock()))
    a.record_history(True)
    for _ in range(n):
        a.free(a.malloc(4096))  # the same address every time
    tl = build_timeline(a.snapshot())
    iv = live_intervals(tl)
    assert len(iv) == n and (iv.end - iv.start == 1).all()
