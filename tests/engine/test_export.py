"""The trace's export from the C core (Note [Exporting ten million events] in csrc/export.c):
the same columns as the Python core's, the stack column renumbered in place, each event's
partner worked out in the same pass (Note [Paired events] in data/columns.py), read-only."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.codes import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
)
from jupyter_gpumem.data.columns import FIELDS, TraceColumns, pair_events
from jupyter_gpumem.engine.allocator import native_core_available

needs_c = pytest.mark.skipif(not native_core_available(), reason="needs the C core")

MiB = 1 << 20
GiB = 1 << 30


def _reference_pairs(action: list[int], addr: list[int]) -> list[int]:
    """Note [Paired events] by hand: walk the events, keeping each address's open alloc."""
    out = [-1] * len(action)
    free = FREE_REQUESTED if FREE_REQUESTED in action else FREE_COMPLETED
    for opens, closes in ((ALLOC, free), (SEGMENT_ALLOC, SEGMENT_FREE)):
        last: dict[int, tuple[int, bool]] = {}  # address -> (its last event, an alloc?)
        for i, (a, p) in enumerate(zip(action, addr, strict=True)):
            if a == opens:
                last[p] = (i, True)
            elif a == closes:
                j, is_open = last.get(p, (-1, False))
                if is_open:
                    out[i], out[j] = j, i
                last[p] = (i, False)
    return out


def _program(native: bool, seed: int, max_entries: int, *, expandable: bool = False,
             events: int = 3000) -> CachingAllocator:
    """A random program of allocs, frees, empty_cache calls, cells, streams and OOMs."""
    rng = random.Random(seed)
    config = AllocatorConfig(expandable_segments=expandable or None,
                             max_split_size_mb=rng.choice([None, 64]))
    a = CachingAllocator(SimulatedDevice(GiB, clock=ManualClock(tick_ns=1000)), config,
                         native=native)
    a.record_history(stacks=True, max_entries=max_entries)
    live: list[int] = []
    while a.history.recorded < events:
        a.current_cell = rng.randrange(4)
        roll = rng.random()
        if roll < 0.5 or not live:
            size = rng.choice([512, 4096, MiB, 3 * MiB, 30 * MiB, 100 * MiB])
            with contextlib.suppress(MemoryError):
                live.append(a.malloc(size, stream=rng.choice([0, 0, 0, 7, 1 << 40])))
        elif roll < 0.95:
            a.free(live.pop(rng.randrange(len(live))))
        elif roll < 0.98:
            a.empty_cache()
        else:
            with contextlib.suppress(MemoryError):
                a.malloc(2 * GiB)
    for p in live:
        a.free(p)
    return a


def _trace(a: CachingAllocator) -> TraceColumns:
    trace = a.snapshot(mark=False)["device_traces"][0]
    assert isinstance(trace, TraceColumns)
    return trace


@needs_c
@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("max_entries", [100_000, 1000, 3])
@pytest.mark.parametrize("seed", range(4))
def test_the_exported_pairing_is_the_matching_by_address(seed: int, max_entries: int,
                                                         expandable: bool) -> None:
    c, py = (_trace(_program(native, seed, max_entries, expandable=expandable))
              for native in (True, False))  # one line: the same frames
    assert c == py  # the same events, entry by entry (frames included)
    action, addr = c.column("action"), c.column("addr")
    expected = _reference_pairs(action.tolist(), addr.tolist())
    assert c.paired().tolist() == expected  # the C core's, from its export
    assert py.paired().tolist() == expected  # the Python core's, worked out when asked
    assert pair_events(action, addr).tolist() == expected
    if max_entries == 100_000:
        assert (c.paired() >= 0).sum() > len(c) // 3  # most allocs and frees found a partner


def test_pairing_where_allocs_and_frees_do_not_alternate() -> None:
    #         0      1      2              3              4      5              6
    action = [ALLOC, ALLOC, FREE_REQUESTED, FREE_COMPLETED, ALLOC, FREE_REQUESTED,
              FREE_REQUESTED, SEGMENT_ALLOC, ALLOC, FREE_REQUESTED, SEGMENT_FREE, FREE_REQUESTED]
    addr = [512, 512, 512, 512, 1024, 2048, 1024, 0, 0, 0, 0, 0]
    #       7 (segment at 0) 8 (block at 0) 9 (its free) 10 (the segment's free) 11 (a 2nd free)
    got = pair_events(np.array(action, np.uint8), np.array(addr, np.int64)).tolist()
    # the second alloc at 512 pairs, the first stays open; a free with no alloc has none; a
    # segment and the block at its address pair apart; a second free of one block has none
    assert got == [-1, 2, 1, -1, 6, -1, 4, 10, 9, 8, 7, -1]
    assert got == _reference_pairs(action, addr)
    # with no free_requested at all, the frees are the free_completed events
    only_completed = pair_events(np.array([ALLOC, FREE_COMPLETED], np.uint8),
                                 np.array([512, 512], np.int64))
    assert only_completed.tolist() == [1, 0]
    assert pair_events(np.zeros(0, np.uint8), np.zeros(0, np.int64)).tolist() == []


@needs_c
def test_a_ring_of_one_free_completed_leaves_the_pairing_to_numpy() -> None:
    a = CachingAllocator(SimulatedDevice(GiB), native=True)
    a.record_history(stacks=False, max_entries=1)
    a.free(a.malloc(512))
    trace = _trace(a)
    assert [e["action"] for e in trace] == ["free_completed"]
    assert trace.paired().tolist() == [-1]


def _two_calls_one_line(a: CachingAllocator) -> list[int]:
    def alloc(n: int) -> int:
        return a.malloc(n)

    return [alloc(512), alloc(1024)]  # two stacks (two offsets), the same frames


@needs_c
@pytest.mark.parametrize("native", [True, False])
def test_the_stack_column_is_renumbered_to_distinct_frames(native: bool,
                                                           monkeypatch: Any) -> None:
    from jupyter_gpumem.engine import _native

    renumbered = []

    def spy(column: Any, table: Any) -> None:
        renumbered.append(len(column))
        real(column, table)

    real = _native.renumber
    monkeypatch.setattr(_native, "renumber", spy)
    a = CachingAllocator(SimulatedDevice(GiB), native=native)
    a.record_history(stacks=True, max_entries=40)
    for _ in range(30):  # stacks released as their events fall out of the ring
        a.free(a.malloc(4096))
    kept = [p for _ in range(5) for p in _two_calls_one_line(a)]
    trace = _trace(a)
    frames = [tuple((f["filename"], f["line"], f["name"]) for f in fr) for fr in trace.stacks]
    assert len(set(frames)) == len(frames)  # one index a distinct list of frames
    stack = trace.column("stack")
    assert stack.min() >= 0 and stack.max() == len(trace.stacks) - 1  # every index used
    size, action = trace.column("size"), trace.column("action")
    small, large = (set(stack[(action == ALLOC) & (size == n)].tolist()) for n in (512, 1024))
    assert len(small) == 1 and small == large  # the two calls' stacks: one index
    # the C core's column (slots of its table) renumbered in place; the Python core's own
    # export (bytes) gives a new array
    assert renumbered == ([len(trace)] if native else [])
    for p in kept:
        a.free(p)


@needs_c
def test_renumber_works_in_place_and_checks_its_table() -> None:
    from jupyter_gpumem.engine import _native

    column = np.array([2, -1, 0, 1, 2], np.int32)
    _native.renumber(column, np.array([5, 6, 7], np.int32))
    assert column.tolist() == [7, -1, 5, 6, 7]
    with pytest.raises(IndexError, match="past the table"):
        _native.renumber(np.array([0, 3], np.int32), np.array([1, 2, 3], np.int32))
    frozen = np.array([0], np.int32)
    frozen.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        _native.renumber(frozen, np.array([1], np.int32))


def _columns(trace: TraceColumns) -> dict[str, Any]:
    cols = {name: trace.column(name) for name in FIELDS if name != "stack"}
    cols["frames"] = [trace.frames_of(i) for i in range(0, len(trace), 997)]
    return cols


@needs_c
def test_a_long_export_is_read_only_and_the_same_on_both_cores() -> None:
    # past 2 MiB a column is a mapping of its own, and zeros are not written: a long trace
    # with streams and OOMs among zeros, wrapped, against the Python core's
    n = 300_000

    def run(native: bool) -> TraceColumns:
        a = CachingAllocator(SimulatedDevice(GiB, clock=ManualClock(tick_ns=1000)),
                             native=native)
        a.record_history(stacks=True, max_entries=n)
        i = 0
        while a.history.recorded < n + 5000:
            a.current_cell = i // 20_000
            a.free(a.malloc(512 * (i % 7 + 1), stream=7 if i % 1000 == 0 else 0))
            if i % 5000 == 0:
                with pytest.raises(MemoryError):
                    a.malloc(2 * GiB)
            i += 1
        return _trace(a)

    c, py = (run(native) for native in (True, False))  # one line: the same frames
    assert len(c) == n
    for name in FIELDS:
        assert not c.column(name).flags.writeable
    assert not c.paired().flags.writeable
    ours, theirs = _columns(c), _columns(py)
    for name in ours:
        if name != "frames":
            assert np.array_equal(ours[name], theirs[name]), name
    assert ours["frames"] == theirs["frames"]
    assert np.array_equal(c.paired(), py.paired())
    assert set(np.unique(c.column("stream")).tolist()) == {0, 7}
    oom = c.column("action") == OOM
    assert oom.sum() >= 10 and (c.column("device_free")[oom] > 0).all()
    assert (c.column("extra")[oom] == 2 * GiB).all()
