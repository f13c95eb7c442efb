"""Self-checks of the allocator's state, for tests and ``CachingAllocator(debug=True)``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._allocator import CachingAllocator
    from ._blocks import Block


def check_allocator_state(a: CachingAllocator) -> None:
    """Assert every structural and counting invariant; call with the allocator's lock held."""
    from ._blocks import MIN_BLOCK_SIZE

    st = a.stats
    free_blocks: list[Block] = [*a._small.blocks.values(), *a._large.blocks.values()]
    everything = [*a._active.values(), *free_blocks]
    by_segment: dict[int, list[Block]] = {addr: [] for addr in a._segments}
    for b in everything:
        assert b.segment.addr in by_segment, f"{b} belongs to no live segment"
        by_segment[b.segment.addr].append(b)
        assert b.size > 0 and b.size % MIN_BLOCK_SIZE == 0, f"{b} has a bad size"
    for pool in (a._small, a._large):
        listed = sorted((size, addr) for lst in pool.by_stream.values() for size, addr in lst)
        assert listed == sorted((b.size, b.addr) for b in pool.blocks.values()), "pool index stale"
        for stream, lst in pool.by_stream.items():
            assert lst == sorted(lst), f"pool list of stream {stream} is out of order"
            for _, addr in lst:
                assert pool.blocks[addr].stream == stream
        for b in pool.blocks.values():
            assert not b.allocated and b.small == pool.small
    for addr, seg in a._segments.items():
        blocks = sorted(by_segment[addr], key=lambda b: b.addr)
        assert blocks, f"segment {addr:#x} has no blocks"
        assert blocks[0].prev is None and blocks[-1].next is None
        cursor = addr
        for left, right in zip(blocks, [*blocks[1:], None], strict=True):
            assert left.addr == cursor, f"gap or overlap at {cursor:#x}"
            cursor += left.size
            assert left.next is right and (right is None or right.prev is left), "broken links"
            if right is not None:
                assert left.allocated or right.allocated, f"free neighbours {left} {right} unmerged"
            assert left.stream == seg.stream and left.small == seg.small
        assert cursor == addr + seg.size, f"blocks of segment {addr:#x} do not cover it"
    reserved = sum(s.size for s in a._segments.values())
    allocated = sum(b.size for b in a._active.values())
    cached = sum(b.size for b in free_blocks)
    assert a._reserved == reserved == st.reserved_bytes.all.current
    assert allocated + cached == reserved, "allocated + cached free != reserved"
    assert st.allocated_bytes.all.current == allocated
    assert st.allocation.all.current == len(a._active)
    assert st.segment.all.current == len(a._segments)
    split_free = [b for b in free_blocks if b.prev is not None or b.next is not None]
    assert st.inactive_split.all.current == len(split_free)
    assert st.inactive_split_bytes.all.current == sum(b.size for b in split_free)
    assert st.requested_bytes.all.current == sum(b.requested for b in a._active.values())
    for name, pooled in st.pooled().items():
        total, large, small = pooled.stats()
        assert total.current == large.current + small.current, f"{name}: pools do not add up"
        for s in (total, large, small):
            assert s.current >= 0, f"{name} below zero"
            assert s.peak >= s.current, f"{name} peak below current"
    for s in (st.oversize_allocations, st.oversize_segments):
        assert s.current >= 0 and s.peak >= s.current
