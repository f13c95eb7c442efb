"""Self-checks of the allocator's books, for tests and ``CachingAllocator(debug=True)``.

A function of plain rows and counters (``AllocatorState``, which both cores give through
``CachingAllocator.state()``), so the same checks hold the Python and the C core to the same
rules. The cores' own ``check()`` covers what the rows cannot show (pool indexes and links).
"""

from __future__ import annotations

from jupyter_gpumem.data.sizes import MIN_BLOCK_SIZE
from jupyter_gpumem.engine.state import AllocatorState, BlockRow

__all__ = ["check_state"]


def check_state(state: AllocatorState) -> None:
    """Assert every structural and counting invariant of one moment of an allocator."""
    segment_rows, block_rows, st = state
    segments = {row.address: row for row in segment_rows}
    assert len(segments) == len(segment_rows), "two segments at one address"
    by_segment: dict[int, list[BlockRow]] = {addr: [] for addr in segments}
    for row in block_rows:
        addr, seg = row.address, row.segment_address
        assert seg in by_segment, f"block {addr:#x} belongs to no live segment"
        assert row.size > 0 and row.size % MIN_BLOCK_SIZE == 0, \
            f"block {addr:#x} has size {row.size}"
        assert row.stream == segments[seg].stream and row.small == segments[seg].small, \
            "block/segment mismatch"
        by_segment[seg].append(row)
    for seg_addr, segment in segments.items():
        blocks = sorted(by_segment[seg_addr])
        if segment.expandable:  # Note [Expandable segments] in engine/expandable
            _check_expandable(seg_addr, segment.size, segment.span, blocks)
            continue
        assert blocks, f"segment {seg_addr:#x} has no blocks"
        cursor = seg_addr
        for left, right in zip(blocks, [*blocks[1:], None], strict=True):
            assert left.address == cursor, f"gap or overlap at {cursor:#x}"
            cursor += left.size
            if right is not None:
                assert left.allocated or right.allocated, \
                    f"free neighbours at {left.address:#x} left unmerged"
        assert cursor == seg_addr + segment.size, \
            f"blocks of segment {seg_addr:#x} do not cover it"
    reserved = sum(row.size for row in segment_rows)
    allocated = [row for row in block_rows if row.allocated]
    free = [row for row in block_rows if not row.allocated]
    assert reserved == st.reserved_bytes.all.current
    assert sum(r.size for r in allocated) + sum(r.size for r in free) == reserved, \
        "allocated + cached free != reserved"
    assert st.allocated_bytes.all.current == sum(r.size for r in allocated)
    assert st.allocation.all.current == len(allocated)
    assert st.segment.all.current == sum(1 for row in segment_rows if not row.expandable)
    split_free = [r for r in free if len(by_segment[r.segment_address]) > 1
                  and not segments[r.segment_address].expandable]
    assert st.inactive_split.all.current == len(split_free)
    assert st.inactive_split_bytes.all.current == sum(r.size for r in split_free)
    assert st.requested_bytes.all.current == sum(r.requested_size for r in allocated)
    assert all(r.requested_size == 0 for r in free), "a free block keeps a requested size"
    for name, pooled in st.pooled().items():
        total, large, small = pooled.stats()
        assert total.current == large.current + small.current, f"{name}: pools do not add up"
        for s in (total, large, small):
            assert s.current >= 0, f"{name} below zero"
            assert s.peak >= s.current, f"{name} peak below current"
    for s in (st.oversize_allocations, st.oversize_segments):
        assert s.current >= 0 and s.peak >= s.current


def _check_expandable(base: int, mapped: int, span: int, blocks: list[BlockRow]) -> None:
    """The mapped blocks of an expandable segment: inside its range, apart, free neighbours
    merged, adding up to its mapped bytes (the gaps between them are unmapped)."""
    cursor = base  # an expandable segment may have no mapped block at all
    for left, right in zip(blocks, [*blocks[1:], None], strict=False):
        assert left.address >= cursor, f"overlap at {left.address:#x}"
        cursor = left.address + left.size
        if right is not None and right.address == cursor:
            assert left.allocated or right.allocated, \
                f"free mapped neighbours at {left.address:#x} left unmerged"
    assert cursor <= base + span, f"blocks past the range of segment {base:#x}"
    assert sum(b.size for b in blocks) == mapped, \
        f"mapped blocks of segment {base:#x} do not add up to its mapped bytes"
