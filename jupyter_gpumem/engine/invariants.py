"""Self-checks of the allocator's state, for tests and ``CachingAllocator(debug=True)``.

They read only what both cores expose (``state()``, ``stats()``, ``check()``), so the same
checks hold the Python and the C core to the same rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyter_gpumem.data.sizes import MIN_BLOCK_SIZE
from jupyter_gpumem.engine.stats import AllocatorStats

if TYPE_CHECKING:
    from jupyter_gpumem.engine.allocator import CachingAllocator


def check_allocator_state(a: CachingAllocator) -> None:
    """Assert every structural and counting invariant of an allocator."""
    core = a._core
    core.check()
    segment_rows, block_rows = core.state()
    st = AllocatorStats.from_tuple(core.stats())
    segments = {row[0]: row for row in segment_rows}
    assert len(segments) == len(segment_rows), "two segments at one address"
    by_segment: dict[int, list[tuple[int, ...]]] = {addr: [] for addr in segments}
    for row in block_rows:
        addr, size, _req, stream, small, seg, _allocated, _stack = row
        assert seg in by_segment, f"block {addr:#x} belongs to no live segment"
        assert size > 0 and size % MIN_BLOCK_SIZE == 0, f"block {addr:#x} has size {size}"
        assert stream == segments[seg][2] and small == segments[seg][3], "block/segment mismatch"
        by_segment[seg].append(row)
    for seg_addr, (_, seg_size, _stream, _small, _stack) in segments.items():
        blocks = sorted(by_segment[seg_addr])
        assert blocks, f"segment {seg_addr:#x} has no blocks"
        cursor = seg_addr
        for left, right in zip(blocks, [*blocks[1:], None], strict=True):
            assert left[0] == cursor, f"gap or overlap at {cursor:#x}"
            cursor += left[1]
            if right is not None:
                assert left[6] or right[6], f"free neighbours at {left[0]:#x} left unmerged"
        assert cursor == seg_addr + seg_size, f"blocks of segment {seg_addr:#x} do not cover it"
    reserved = sum(row[1] for row in segment_rows)
    allocated = [row for row in block_rows if row[6]]
    free = [row for row in block_rows if not row[6]]
    assert core.reserved() == reserved == st.reserved_bytes.all.current
    assert sum(r[1] for r in allocated) + sum(r[1] for r in free) == reserved, \
        "allocated + cached free != reserved"
    assert st.allocated_bytes.all.current == sum(r[1] for r in allocated)
    assert st.allocation.all.current == len(allocated)
    assert st.segment.all.current == len(segment_rows)
    split_free = [r for r in free if len(by_segment[r[5]]) > 1]
    assert st.inactive_split.all.current == len(split_free)
    assert st.inactive_split_bytes.all.current == sum(r[1] for r in split_free)
    assert st.requested_bytes.all.current == sum(r[2] for r in allocated)
    assert all(r[2] == 0 for r in free), "a free block keeps a requested size"
    for name, pooled in st.pooled().items():
        total, large, small = pooled.stats()
        assert total.current == large.current + small.current, f"{name}: pools do not add up"
        for s in (total, large, small):
            assert s.current >= 0, f"{name} below zero"
            assert s.peak >= s.current, f"{name} peak below current"
    for s in (st.oversize_allocations, st.oversize_segments):
        assert s.current >= 0 and s.peak >= s.current
