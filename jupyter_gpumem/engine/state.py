"""The allocator's books as plain rows: what ``CachingAllocator.state()`` returns.

Both cores read their segments, blocks and counters as tuples in one locked moment (``state()``
in ``pycore``); these types name the fields, so that the invariants, the notebook ledger and the
tests read the blocks through the allocator's public API and never through a core.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from jupyter_gpumem.engine.stats import AllocatorStats

__all__ = ["AllocatorState", "BlockRow", "SegmentRow", "state_from_tuples"]


class SegmentRow(NamedTuple):
    """One segment: a single allocation from the device."""

    address: int
    size: int
    stream: int
    #: In the small pool (blocks of at most 1 MiB), else the large pool.
    small: bool
    #: Interned stack id of the call that made the segment (``NO_STACK`` when not recorded).
    stack_id: int
    #: An expandable segment (Note [Expandable segments] in ``engine/expandable``): ``size`` is
    #: its mapped bytes, ``span`` its reserved virtual range, and only its mapped blocks are
    #: listed. For a classic segment ``span`` equals ``size``.
    expandable: bool = False
    span: int = 0


class BlockRow(NamedTuple):
    """One block: a range of a segment, handed out (``allocated``) or cached free."""

    address: int
    size: int
    #: The size the caller asked for, before rounding; 0 for a cached free block.
    requested_size: int
    stream: int
    #: In the small pool, else the large pool (as its segment).
    small: bool
    #: Address of the segment the block belongs to.
    segment_address: int
    allocated: bool
    #: Interned stack id of the call that allocated the block (``NO_STACK`` when free or not
    #: recorded).
    stack_id: int


class AllocatorState(NamedTuple):
    """Segments and blocks in address order, and every counter, all from one moment."""

    segments: list[SegmentRow]
    blocks: list[BlockRow]
    stats: AllocatorStats


def state_from_tuples(segments: Iterable[tuple[int, ...]], blocks: Iterable[tuple[int, ...]],
                      stats: tuple[int, ...]) -> AllocatorState:
    """Name the fields of a core's ``state()`` rows; sort them by address."""
    return AllocatorState(
        sorted(SegmentRow(addr, size, stream, bool(small), stack, bool(expandable), span)
               for addr, size, stream, small, stack, expandable, span in segments),
        sorted(BlockRow(addr, size, requested, stream, bool(small), segment, bool(allocated),
                        stack)
               for addr, size, requested, stream, small, segment, allocated, stack in blocks),
        AllocatorStats.from_tuple(stats),
    )
