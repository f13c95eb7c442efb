"""Blocks, segments and pools: the allocator's data structures and size rules.

See the policy list at the top of ``allocator``; the sizes themselves live in ``data/sizes``.
"""

from __future__ import annotations

import operator
import sys
from bisect import bisect_left, insort
from dataclasses import dataclass

from jupyter_gpumem.data.codes import NO_STACK
from jupyter_gpumem.data.sizes import (
    LARGE_BUFFER,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
)

NO_LIMIT = sys.maxsize  # max_split_size when unset; reported as -1
#: Streams are signed 64-bit integers (CuPy's stream pointers are far inside this).
STREAM_MIN = -(1 << 63)
STREAM_MAX = (1 << 63) - 1


def as_int(value: object, what: str) -> int:
    """``value`` as a plain int, as both cores read sizes, addresses and streams: anything
    ``operator.index`` accepts (NumPy integers too), but not a bool. TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None


def as_stream(value: object) -> int:
    """A stream argument as an int in [STREAM_MIN, STREAM_MAX]; TypeError or ValueError."""
    stream = as_int(value, "stream")
    if not STREAM_MIN <= stream <= STREAM_MAX:
        raise ValueError(f"stream {stream} is out of range (a signed 64-bit integer)")
    return stream


def segment_size_for(size: int) -> int:
    """Bytes of the segment the allocator asks the device for, for a rounded size (rule 3)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class Block:
    """A range of a segment: handed out to the user, or cached free."""

    __slots__ = (
        "addr",
        "allocated",
        "gc_base",
        "mapped",
        "next",
        "prev",
        "requested",
        "segment",
        "size",
        "small",
        "stack",
        "stream",
    )

    def __init__(self, addr: int, size: int, stream: int, small: bool, segment: Segment) -> None:
        self.addr = addr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.small = small
        self.segment = segment
        self.prev: Block | None = None  # neighbours in the same segment, by address
        self.next: Block | None = None
        self.allocated = False
        #: Backed by physical pages; False only for the unmapped ranges of an expandable segment
        #: (Note [Expandable segments] in ``engine/expandable``).
        self.mapped = True
        self.gc_base = 0  # the pool's free-block search count when this block was cached
        self.stack = NO_STACK  # interned stack of the allocation, when recording stacks

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"<Block {self.addr:#x} {self.size} B {state}>"


@dataclass(eq=False)
class Segment:
    """One device allocation, split into blocks; or an expandable segment: a reserved virtual
    range of ``size`` bytes of which ``mapped`` bytes are backed by pages."""

    addr: int
    size: int
    stream: int
    small: bool
    stack: int = NO_STACK
    expandable: bool = False
    mapped: int = 0

    @property
    def reserved(self) -> int:
        """Bytes of device memory the segment holds."""
        return self.mapped if self.expandable else self.size


class BlockPool:
    """The cached free blocks of one pool, per stream, ordered by (size, address); and the
    unmapped blocks of its expandable segments, per stream, ordered by address."""

    __slots__ = ("blocks", "by_stream", "searches", "small", "unmapped", "unmapped_by_stream")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.by_stream: dict[int, list[tuple[int, int]]] = {}
        self.blocks: dict[int, Block] = {}  # address -> free block
        self.searches = 0  # free-block searches, the clock of garbage collection
        self.unmapped: dict[int, Block] = {}  # address -> unmapped block
        self.unmapped_by_stream: dict[int, list[int]] = {}

    def insert_unmapped(self, block: Block) -> None:
        self.unmapped[block.addr] = block
        insort(self.unmapped_by_stream.setdefault(block.stream, []), block.addr)

    def remove_unmapped(self, block: Block) -> None:
        del self.unmapped[block.addr]
        lst = self.unmapped_by_stream[block.stream]
        del lst[bisect_left(lst, block.addr)]

    def insert(self, block: Block) -> None:
        block.gc_base = self.searches
        self.blocks[block.addr] = block
        lst = self.by_stream.get(block.stream)
        if lst is None:
            self.by_stream[block.stream] = [(block.size, block.addr)]
        else:
            insort(lst, (block.size, block.addr))

    def remove(self, block: Block) -> None:
        del self.blocks[block.addr]
        lst = self.by_stream[block.stream]
        del lst[bisect_left(lst, (block.size, block.addr))]

    def ordered(self) -> list[Block]:
        """Every cached block in PyTorch's (stream, size, address) order."""
        return [self.blocks[addr] for stream in sorted(self.by_stream)
                for _, addr in self.by_stream[stream]]


