"""The allocator's public view of its books: ``state()`` rows, the invariants over them, and the
C core handed to the CuPy binding's hooks."""

from __future__ import annotations

import pytest

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.codes import NO_STACK
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.invariants import check_state
from jupyter_gpumem.engine.state import AllocatorState, BlockRow, SegmentRow

MiB = 1 << 20
CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not native_core_available(), reason="the C core is not built"))]


@pytest.mark.parametrize("native", CORES)
def test_state_names_every_segment_and_block(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(256 * MiB), native=native)
    small = a.malloc(1000, stream=5)
    large = a.malloc(3 * MiB)
    gone = a.malloc(2000, stream=5)
    a.free(gone)
    state = a.state()
    assert isinstance(state, AllocatorState)
    assert state.stats.to_tuple() == a.stats.to_tuple()
    seg_small, seg_large = sorted(state.segments, key=lambda s: s.size)
    assert seg_small == SegmentRow(seg_small.address, 2 * MiB, 5, True, NO_STACK, False, 2 * MiB)
    assert seg_large == SegmentRow(seg_large.address, 20 * MiB, 0, False, NO_STACK, False,
                                   20 * MiB)
    assert state.segments == sorted(state.segments), "segments in address order"
    assert state.blocks == sorted(state.blocks), "blocks in address order"
    by_address = {b.address: b for b in state.blocks}
    assert by_address[small] == BlockRow(small, 1024, 1000, 5, True, seg_small.address, True,
                                         NO_STACK)
    assert by_address[large] == BlockRow(large, 3 * MiB, 3 * MiB, 0, False, seg_large.address,
                                         True, NO_STACK)
    free = [b for b in state.blocks if not b.allocated]
    assert {(b.segment_address, b.size, b.requested_size) for b in free} == {
        (seg_small.address, 2 * MiB - 1024, 0), (seg_large.address, 17 * MiB, 0)}
    for row in (*state.segments, *state.blocks):
        assert type(row.small) is bool
    for block in state.blocks:
        assert type(block.allocated) is bool
    a.free(small)
    a.free(large)


@pytest.mark.parametrize("native", CORES)
def test_state_names_the_stacks_the_snapshot_shows(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=native)
    a.record_history(True, stacks=True)
    p = a.malloc(1000)
    state = a.state()
    (block,) = [b for b in state.blocks if b.allocated]
    (segment,) = state.segments
    assert block.stack_id != NO_STACK and segment.stack_id != NO_STACK
    assert a.history is not None
    recorded = a.history.recorded
    a.state()
    assert a.history.recorded == recorded, "state() logs no snapshot event"
    a.free(p)
    a.record_history(False)


def test_check_state_reads_plain_rows() -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=False)
    p = a.malloc(1000)
    good = a.state()
    check_state(good)
    blocks = list(good.blocks)
    i = next(i for i, b in enumerate(blocks) if not b.allocated)
    blocks[i] = blocks[i]._replace(size=blocks[i].size - 512)
    with pytest.raises(AssertionError, match="do not cover"):
        check_state(good._replace(blocks=blocks))
    with pytest.raises(AssertionError, match="belongs to no live segment"):
        check_state(good._replace(segments=[]))
    a.free(p)


def test_check_invariants_compares_the_cores_reserved_total() -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=False)
    a.malloc(1000)
    a._core._reserved += 512  # a counter that drifted from the segments
    with pytest.raises(AssertionError, match="reserved total"):
        a.check_invariants()
    a._core._reserved -= 512
    a.empty_cache()
    a.free(a.state().blocks[0].address)


def test_native_core_is_only_for_the_c_hooks() -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=False)
    with pytest.raises(TypeError, match="Python core"):
        a.native_core  # noqa: B018


@pytest.mark.skipif(not native_core_available(), reason="the C core is not built")
def test_native_core_runs_the_allocators_books() -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=True)
    core = a.native_core
    p = core.malloc(1000)
    assert a.owns(p) and a.memory_allocated() == 1024
    core.free(p)
    assert a.memory_allocated() == 0
