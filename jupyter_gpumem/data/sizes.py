"""Byte sizes, one home for every layer: the binary units, and the sizes of PyTorch's allocator
policy (see the policy list at the top of ``engine/allocator``).

The allocator applies these sizes; the readers of its data (replay, timeline, files) assume them
where a trace or a snapshot leaves a size out, as PyTorch's do. The C core (``csrc/core.h``)
mirrors them, and a test keeps the two equal.
"""

from __future__ import annotations

import sys
from typing import Literal

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

MIN_BLOCK_SIZE = 512  # every block is a multiple of this
SMALL_SIZE = 1 * MiB  # largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # segment size of the small pool (the only segments of this size)
LARGE_BUFFER = 20 * MiB  # segment size for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MiB  # requests at least this big get a segment of their own size
ROUND_LARGE = 2 * MiB  # such segments are rounded up to a multiple of this
#: The largest request the allocator takes (4 EiB): a larger one is out of memory at once,
#: without the retry ladder (no device holds it), and every size the policy derives from a
#: request up to it fits in 63 bits. A loaded file's block, segment and event sizes are at most
#: this too, so that what the readers compute from them fits a signed 64-bit column.
MAX_ALLOC_SIZE = 1 << 62
#: Addresses, and the ends of blocks and segments (address + size), are below this: the cores
#: hold them as signed 64-bit integers.
ADDRESS_LIMIT = 1 << 63

#: The allocator's books are signed 64-bit: no device is larger than this (the cores refuse a
#: larger total), reserved bytes never pass it, and the accumulated counters (``allocated``,
#: ``freed``) stop at it (Note [Sizes near 2**63] in ``engine/stats``).
INT64_MAX = (1 << 63) - 1
#: The virtual range an expandable segment reserves is at most this (plus a page), whatever the
#: device's size, so that the 63-bit address space holds one for each of thousands of (stream,
#: pool) pairs (Note [Expandable segments] in ``engine/expandable``). 1 PiB: far above any GPU.
MAX_VIRTUAL_RANGE = 1 << 50
#: The most events a history may keep: the C core counts them in a ``Py_ssize_t``.
MAX_HISTORY_ENTRIES = sys.maxsize
#: Bytes of one event in the C core's ring (Note [A ring of 32-byte events] in csrc/core.h; a
#: test reads the core's own figure against it): what ``--max-entries 64MiB`` divides by.
RING_EVENT_BYTES = 32
#: The largest device, in bytes, the allocator cores take (and so a simulated device may have).
MAX_DEVICE_SIZE = INT64_MAX


def round_size(size: int, divisions: int = 0) -> int:
    """The block size the allocator uses for a request of ``size`` bytes (policy rule 1).

    With the default ``divisions`` this is also the block size a trace without block sizes
    (PyTorch's) implies for a request."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
        return _roundup_power2_next_division(size, divisions)
    return (size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE * MIN_BLOCK_SIZE


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor // divisions
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def segment_type_of(total_size: int) -> Literal["small", "large"]:
    """The pool of a segment told from its size alone: only the small pool makes segments of
    ``SMALL_BUFFER`` bytes (a large segment is 20 MiB, or at least 10 MiB rounded to 2 MiB)."""
    return "small" if total_size == SMALL_BUFFER else "large"
