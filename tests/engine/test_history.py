"""History: the ring buffer of trace entries, stacks, and replay of the block layout."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

import jupyter_gpumem
from jupyter_gpumem import (
    CachingAllocator,
    OutOfMemoryError,
    SimulatedDevice,
    replay_segments,
)

MiB = 1 << 20
PACKAGE_DIR = os.path.dirname(os.path.abspath(jupyter_gpumem.__file__)) + os.sep


def trace(a: CachingAllocator) -> list[dict[str, Any]]:
    return a.snapshot()["device_traces"][0]  # type: ignore[return-value]


def test_no_history_by_default(allocator: CachingAllocator) -> None:
    allocator.free(allocator.malloc(512))
    snap = allocator.snapshot()
    assert snap["device_traces"] == [[]]
    assert not allocator.recording
    # Without recording, segments and blocks have no frames.
    assert snap["segments"][0]["frames"] == []


def test_entries_without_stacks(allocator: CachingAllocator) -> None:
    allocator.record_history(stacks=False)
    p = allocator.malloc(1000, stream=5)
    allocator.free(p)
    entries = trace(allocator)
    assert [e["action"] for e in entries] == [
        "segment_alloc", "alloc", "free_requested", "free_completed", "snapshot"]
    seg, alloc, req, done, _ = entries
    assert (seg["addr"], seg["size"], seg["stream"]) == (p, 2 * MiB, 5)
    assert (alloc["addr"], alloc["size"], alloc["stream"], alloc["block_size"]) == (p, 1000, 5,
                                                                                   1024)
    assert (req["addr"], req["size"]) == (done["addr"], done["size"]) == (p, 1000)
    assert all(e["frames"] == [] for e in entries)
    # The conftest clock starts at 1 ms and ticks 1 µs per read.
    times = [e["time_us"] for e in entries]
    assert times == sorted(times) and times[0] >= 1000


def test_frames_point_at_the_callers_line(allocator: CachingAllocator) -> None:
    allocator.record_history(stacks=True)
    line = sys._getframe().f_lineno + 1
    p = allocator.malloc(4096)
    free_line = sys._getframe().f_lineno + 1
    allocator.free(p)
    entries = trace(allocator)
    for e in entries:
        for f in e["frames"]:
            assert not f["filename"].startswith(PACKAGE_DIR), f
    by_action = {e["action"]: e for e in entries}
    top = by_action["alloc"]["frames"][0]
    assert top == {"filename": __file__, "line": line,
                   "name": "test_frames_point_at_the_callers_line"}
    assert by_action["segment_alloc"]["frames"][0]["line"] == line
    assert by_action["free_requested"]["frames"][0]["line"] == free_line
    assert by_action["free_completed"]["frames"][0]["line"] == free_line
    # The live block and its segment carry the frames of their allocation.
    q_line = sys._getframe().f_lineno + 1
    q = allocator.malloc(4096)
    seg = allocator.snapshot()["segments"][0]
    assert seg["frames"][0]["line"] == line
    live = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert live[0]["frames"][0]["line"] == q_line
    assert all(b["frames"] == [] for b in seg["blocks"] if b["state"] == "inactive")
    allocator.free(q)


def _helper_allocates(a: CachingAllocator) -> int:
    return a.malloc(512)


def test_frames_are_innermost_first(allocator: CachingAllocator) -> None:
    allocator.record_history()
    p = _helper_allocates(allocator)
    frames = next(e for e in trace(allocator) if e["action"] == "alloc")["frames"]
    names = [f["name"] for f in frames]
    assert names[:2] == ["_helper_allocates", "test_frames_are_innermost_first"]
    allocator.free(p)


def test_every_action_kind_appears() -> None:
    device = SimulatedDevice(64 * MiB)
    a = CachingAllocator(device, debug=True)
    a.record_history(stacks=False)
    p = a.malloc(40 * MiB)
    q = a.malloc(512)
    a.free(q)
    with pytest.raises(OutOfMemoryError):
        a.malloc(30 * MiB)
    a.free(p)
    a.empty_cache()
    entries = trace(a)
    actions = {e["action"] for e in entries}
    assert actions == {"alloc", "free_requested", "free_completed", "segment_alloc",
                       "segment_free", "oom", "snapshot"}
    oom = next(e for e in entries if e["action"] == "oom")
    # Rounded request and what the device reported free (64 - 40 MiB; the small segment was
    # already released by the ladder).
    assert (oom["size"], oom["device_free"]) == (30 * MiB, 24 * MiB)


def test_stop_and_restart_recording(allocator: CachingAllocator) -> None:
    allocator.record_history(stacks=False)
    allocator.free(allocator.malloc(512))
    allocator.record_history(False)
    assert not allocator.recording
    allocator.free(allocator.malloc(512))
    assert trace(allocator) == []
    allocator.record_history(stacks=False)
    allocator.free(allocator.malloc(512))
    allocator.record_history(stacks=False)  # again, without clear: the events stay
    assert [e["action"] for e in trace(allocator)] == [
        "alloc", "free_requested", "free_completed", "snapshot"]
    allocator.record_history(stacks=False, clear=True)
    assert [e["action"] for e in trace(allocator)] == ["snapshot"]


def test_bad_max_entries(allocator: CachingAllocator) -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            allocator.record_history(max_entries=bad)  # type: ignore[arg-type]


def test_max_entries_zero_keeps_stacks_of_live_blocks_only(allocator: CachingAllocator) -> None:
    allocator.record_history(stacks=True, max_entries=0)
    line = sys._getframe().f_lineno + 1
    p = allocator.malloc(512)
    q = allocator.malloc(512)
    allocator.free(q)
    snap = allocator.snapshot()
    assert snap["device_traces"] == [[]]
    assert snap["jupyter_gpumem"]["history_dropped"] == 6  # segment_alloc, 2 alloc, 2 free, snap
    live = [b for b in snap["segments"][0]["blocks"] if b["state"] == "active_allocated"]
    assert live[0]["frames"][0]["line"] == line
    allocator.free(p)


def test_ring_buffer_keeps_the_newest_and_counts_dropped(allocator: CachingAllocator) -> None:
    allocator.record_history(stacks=False, max_entries=5)
    allocator.free(allocator.malloc(512))  # segment_alloc, alloc, free_requested, free_completed
    for _ in range(3):
        allocator.free(allocator.malloc(512))  # 3 entries each: reuse the cached block
    snap = allocator.snapshot()  # one more: the snapshot entry
    entries = snap["device_traces"][0]
    total = 4 + 3 * 3 + 1
    assert len(entries) == 5
    assert snap["jupyter_gpumem"]["history_dropped"] == total - 5
    assert [e["action"] for e in entries] == [
        "free_completed", "alloc", "free_requested", "free_completed", "snapshot"]


def test_cell_is_tagged(allocator: CachingAllocator) -> None:
    allocator.record_history(stacks=False)
    allocator.current_cell = 7
    p = allocator.malloc(512)
    allocator.current_cell = -1
    allocator.free(p)
    cells = [e.get("cell") for e in trace(allocator)]
    assert cells == [7, 7, None, None, None]


def test_replay_at_every_index_equals_the_snapshot_then(allocator: CachingAllocator) -> None:
    a = allocator
    a.record_history(stacks=True)
    taken: list[tuple[int, list[object]]] = []

    def snap() -> None:
        s = a.snapshot()
        taken.append((len(s["device_traces"][0]), s["segments"]))  # type: ignore[arg-type]

    snap()
    s1 = a.malloc(1000)
    snap()
    l1 = a.malloc(3 * MiB, stream=1)
    snap()
    l2 = a.malloc(5 * MiB, stream=1)
    s2 = a.malloc(MiB)
    snap()
    a.free(l1)
    snap()
    a.free(s1)
    snap()
    l3 = a.malloc(3 * MiB - 100, stream=1)
    big = a.malloc(30 * MiB)
    snap()
    a.free(big)
    a.free(s2)
    snap()
    a.empty_cache()
    snap()
    a.free(l2)
    a.free(l3)
    s3 = a.malloc(512)  # a new segment at an address used before
    snap()
    a.free(s3)
    a.empty_cache()
    final = a.snapshot()
    n = len(final["device_traces"][0])
    assert replay_segments(final, n) == final["segments"]
    assert replay_segments(final, 0) == []
    for index, segments in taken:
        assert replay_segments(final, index) == segments, index
    # Every index in between replays to a consistent layout.
    for i in range(n + 1):
        for seg in replay_segments(final, i):
            assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    with pytest.raises(ValueError):
        replay_segments(final, n + 1)
