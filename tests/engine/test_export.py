"""The trace's export from the C core (Note [Exporting ten million events] in csrc/export.c):
the same columns as the Python core's, the stack column renumbered in place, read-only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.codes import ALLOC, OOM
from jupyter_gpumem.data.columns import FIELDS, TraceColumns
from jupyter_gpumem.engine.allocator import native_core_available

needs_c = pytest.mark.skipif(not native_core_available(), reason="needs the C core")

MiB = 1 << 20
GiB = 1 << 30


def _trace(a: CachingAllocator) -> TraceColumns:
    trace = a.snapshot(mark=False)["device_traces"][0]
    assert isinstance(trace, TraceColumns)
    return trace


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
    ours, theirs = _columns(c), _columns(py)
    for name in ours:
        if name != "frames":
            assert np.array_equal(ours[name], theirs[name]), name
    assert ours["frames"] == theirs["frames"]
    assert set(np.unique(c.column("stream")).tolist()) == {0, 7}
    oom = c.column("action") == OOM
    assert oom.sum() >= 10 and (c.column("device_free")[oom] > 0).all()
    assert (c.column("extra")[oom] == 2 * GiB).all()
