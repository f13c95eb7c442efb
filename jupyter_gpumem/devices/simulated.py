"""A device that needs no GPU: integer addresses from a fixed capacity, and a manual clock."""

from __future__ import annotations

import bisect
import threading
import time

from jupyter_gpumem.data.sizes import INT64_MAX, GiB, MiB
from jupyter_gpumem.engine.device import Clock, DeviceOutOfMemory

#: Addresses handed out by SimulatedDevice are multiples of this, as cudaMalloc's are.
SEGMENT_ALIGNMENT = 2 * MiB
#: Where SimulatedDevice's segments start: far from 0, like a real device pointer.
SIMULATED_BASE = 0x7F00_0000_0000
#: Where its reserved virtual ranges start, below the segments, as cuMemAddressReserve's do.
VIRTUAL_BASE = 0x7E00_0000_0000
#: The end of its address space: every segment and virtual range lies below, so that an address
#: plus a size fits in a signed 64-bit integer (Note [Sizes near 2**63] in ``engine/stats``).
ADDRESS_END = (1 << 63) - SEGMENT_ALIGNMENT
#: The physical page granule of its virtual-memory operations, as on an H200.
VMM_GRANULARITY = 2 * MiB


class ManualClock:
    """A clock for tests: time moves only when told to."""

    def __init__(self, start_ns: int = 0, tick_ns: int = 0) -> None:
        self.now_ns = start_ns
        self.tick_ns = tick_ns

    def __call__(self) -> int:
        now = self.now_ns
        self.now_ns += self.tick_ns
        return now

    def advance(self, ns: int) -> None:
        self.now_ns += ns


class SimulatedDevice:
    """A device with a fixed capacity that hands out integer addresses for whole segments.

    It catches frees of unknown or already-freed addresses, can be told to fail the next N
    allocations, and can hold memory on behalf of "other processes" to play NVML's part.

    It also has the virtual-memory operations of ``VirtualMemoryDevice`` (expandable segments):
    reserved virtual ranges, and pages of ``VMM_GRANULARITY`` mapped in them, counted against
    the capacity like segments. It catches a map of a mapped page, an unmap of an unmapped one,
    ranges outside a reservation, and the release of a range with pages still mapped.
    ``fail_next`` fails maps too (not reserves: address space is free).

    Addresses: segments and virtual ranges share one address space, ``[VIRTUAL_BASE,
    ADDRESS_END)``, and never overlap. A segment takes the lowest free range from
    ``SIMULATED_BASE`` on (freed ranges are used again); a virtual range the next free one after
    the last reserved, with a guard page after it, wrapping round to ``VIRTUAL_BASE`` when the
    space above is used up. Past ``ADDRESS_END`` nothing fits: the malloc or reserve raises
    DeviceOutOfMemory, as CUDA's do when the address space runs out (devices near 2**63 B).
    Mapped pages are kept as ranges, so a map of 2**61 B costs what one of 2 MiB does.
    """

    def __init__(
        self,
        capacity: int = 80 * GiB,
        *,
        index: int = 0,
        clock: Clock = time.perf_counter_ns,
        name: str = "Simulated GPU",
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if capacity > INT64_MAX:  # Note [Sizes near 2**63] in engine/stats
            raise ValueError(f"capacity must be at most 2**63 - 1 B (the allocator's books are "
                             f"64-bit), got {capacity}")
        self.index = index
        self.name = name
        self.clock = clock
        self.total = capacity
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}  # address -> size of every live segment
        self._space = _Ranges([(VIRTUAL_BASE, ADDRESS_END)])  # free addresses
        self._used = 0
        self._fail_next = 0
        self._others: dict[int, tuple[str, int]] = {}  # pid -> (name, bytes) of other processes
        self.malloc_calls = 0
        self.free_calls = 0
        self._reserved: dict[int, int] = {}  # base -> size of every reserved virtual range
        self._reserved_bases: list[int] = []  # their bases, sorted
        self._mapped = _Ranges()  # the mapped pages
        self._mapped_bytes = 0
        self._virtual_next = VIRTUAL_BASE  # where the next virtual range is looked for
        self.map_calls = 0
        self.unmap_calls = 0

    # -- the Device protocol -------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        if nbytes <= 0:
            raise ValueError(f"segment size must be positive, got {nbytes}")
        with self._lock:
            self.malloc_calls += 1
            if self._fail_next:
                self._fail_next -= 1
                raise DeviceOutOfMemory(f"simulated failure of a {nbytes} B device malloc")
            if self._used + self.held_by_others + nbytes > self.total:
                raise DeviceOutOfMemory(
                    f"out of memory: asked {nbytes} B, {self._free_locked()} B free"
                )
            ptr = self._space.take(_align_up(nbytes, SEGMENT_ALIGNMENT), SIMULATED_BASE)
            if ptr is None:
                raise DeviceOutOfMemory(f"out of address space: no free range of {nbytes} B "
                                        "below 2**63")
            self._live[ptr] = nbytes
            self._used += nbytes
            return ptr

    def free(self, ptr: int) -> None:
        with self._lock:
            size = self._live.pop(ptr, None)
            if size is None:
                raise ValueError(f"free of an unknown or already-freed address {ptr:#x}")
            self.free_calls += 1
            self._used -= size
            self._space.give(ptr, ptr + _align_up(size, SEGMENT_ALIGNMENT))

    def mem_get_info(self) -> tuple[int, int]:
        with self._lock:
            return self._free_locked(), self.total

    # -- the VirtualMemoryDevice protocol ------------------------------------------------------

    def vmm_granularity(self) -> int:
        return VMM_GRANULARITY

    def reserve(self, nbytes: int) -> int:
        if nbytes <= 0 or nbytes % VMM_GRANULARITY:
            raise ValueError(f"reserve size must be a positive multiple of the granule, got "
                             f"{nbytes}")
        with self._lock:
            span = nbytes + VMM_GRANULARITY  # a guard page between ranges
            base = self._space.take(span, self._virtual_next)
            if base is None:  # the space above is used up: wrap round
                base = self._space.take(span, VIRTUAL_BASE)
            if base is None:
                raise DeviceOutOfMemory(f"out of address space: no free range of {nbytes} B "
                                        "below 2**63 to reserve")
            self._virtual_next = base + span
            self._reserved[base] = nbytes
            bisect.insort(self._reserved_bases, base)
            return base

    def release(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            if self._reserved.get(ptr) != nbytes:
                raise ValueError(f"release of {nbytes} B at {ptr:#x}, which is not a reserved "
                                 "range of that size")
            if self._mapped.first_in(ptr, ptr + nbytes) is not None:
                raise ValueError(f"release of the range at {ptr:#x} with pages still mapped")
            del self._reserved[ptr]
            del self._reserved_bases[bisect.bisect_left(self._reserved_bases, ptr)]
            self._space.give(ptr, ptr + nbytes + VMM_GRANULARITY)

    def map(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            self._check_pages_locked(ptr, nbytes, "map")
            self.map_calls += 1
            if self._fail_next:
                self._fail_next -= 1
                raise DeviceOutOfMemory(f"simulated failure of a {nbytes} B map")
            page = self._mapped.first_in(ptr, ptr + nbytes)
            if page is not None:
                raise ValueError(f"map of the page at {page:#x}, which is already mapped")
            if self._used + self.held_by_others + nbytes > self.total:
                raise DeviceOutOfMemory(
                    f"out of memory: asked to map {nbytes} B, {self._free_locked()} B free"
                )
            self._mapped.give(ptr, ptr + nbytes)
            self._mapped_bytes += nbytes
            self._used += nbytes

    def unmap(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            self._check_pages_locked(ptr, nbytes, "unmap")
            page = self._mapped.first_gap_in(ptr, ptr + nbytes)
            if page is not None:
                raise ValueError(f"unmap of the page at {page:#x}, which is not mapped")
            self.unmap_calls += 1
            self._mapped.cut(ptr, ptr + nbytes)
            self._mapped_bytes -= nbytes
            self._used -= nbytes

    def _check_pages_locked(self, ptr: int, nbytes: int, what: str) -> None:
        if nbytes <= 0 or ptr % VMM_GRANULARITY or nbytes % VMM_GRANULARITY:
            raise ValueError(f"{what} of {nbytes} B at {ptr:#x} is not granule-aligned")
        i = bisect.bisect_right(self._reserved_bases, ptr) - 1
        base = self._reserved_bases[i] if i >= 0 else None
        if base is None or ptr + nbytes > base + self._reserved[base]:
            raise ValueError(f"{what} of {nbytes} B at {ptr:#x} outside every reserved range")

    # -- test and demo controls ----------------------------------------------------------------

    def fail_next(self, count: int = 1) -> None:
        """Make the next ``count`` device mallocs or maps fail as if the device were full."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        with self._lock:
            self._fail_next = count

    def hold_for_process(self, pid: int, nbytes: int, name: str = "other process") -> None:
        """Pretend another process holds ``nbytes`` on this device (0 releases it)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            if nbytes:
                self._others[pid] = (name, nbytes)
            else:
                self._others.pop(pid, None)

    def processes(self) -> list[tuple[int, str, int]]:
        """``(pid, name, bytes)`` of the other processes, as NVML would list them."""
        with self._lock:
            return [(pid, name, size) for pid, (name, size) in sorted(self._others.items())]

    @property
    def held_by_others(self) -> int:
        return sum(size for _, size in self._others.values())

    @property
    def used(self) -> int:
        """Bytes in live segments and mapped pages."""
        return self._used

    @property
    def mapped_bytes(self) -> int:
        """Bytes of physical pages mapped into reserved ranges."""
        with self._lock:
            return self._mapped_bytes

    def reserved_ranges(self) -> dict[int, int]:
        """``{base: size}`` of every reserved virtual range not yet released."""
        with self._lock:
            return dict(self._reserved)

    def live_segments(self) -> dict[int, int]:
        """``{address: size}`` of every segment not yet freed."""
        with self._lock:
            return dict(self._live)

    def _free_locked(self) -> int:
        return self.total - self._used - self.held_by_others


class _Ranges:
    """A set of addresses kept as ranges ``[start, end)``: sorted, disjoint, never touching
    (neighbours merge)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, ranges: list[tuple[int, int]] | None = None) -> None:
        self._starts = [start for start, _ in ranges or ()]
        self._ends = [end for _, end in ranges or ()]

    def take(self, size: int, at_least: int) -> int | None:
        """Take ``size`` addresses of the set, the lowest run from ``at_least`` on; its start,
        or None if no run is long enough."""
        starts, ends = self._starts, self._ends
        for i in range(max(0, bisect.bisect_right(starts, at_least) - 1), len(starts)):
            start = max(starts[i], at_least)
            if start + size <= ends[i]:
                self._cut_at(i, start, start + size)
                return start
        return None

    def give(self, start: int, end: int) -> None:
        """Add ``[start, end)``, which holds none of the set."""
        starts, ends = self._starts, self._ends
        i = bisect.bisect_left(starts, start)
        if i > 0 and ends[i - 1] == start:
            i -= 1
            ends[i] = end
        else:
            starts.insert(i, start)
            ends.insert(i, end)
        if i + 1 < len(starts) and starts[i + 1] == end:
            ends[i] = ends.pop(i + 1)
            del starts[i + 1]

    def cut(self, start: int, end: int) -> None:
        """Take out ``[start, end)``, which the set holds."""
        self._cut_at(bisect.bisect_right(self._starts, start) - 1, start, end)

    def first_in(self, start: int, end: int) -> int | None:
        """The lowest address of ``[start, end)`` in the set, or None."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._ends[i] > start:
            return start
        if i + 1 < len(self._starts) and self._starts[i + 1] < end:
            return self._starts[i + 1]
        return None

    def first_gap_in(self, start: int, end: int) -> int | None:
        """The lowest address of ``[start, end)`` not in the set, or None."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0 or self._ends[i] <= start:
            return start
        return self._ends[i] if self._ends[i] < end else None

    def _cut_at(self, i: int, start: int, end: int) -> None:
        starts, ends = self._starts, self._ends
        if starts[i] < start:
            if end < ends[i]:
                starts.insert(i + 1, end)
                ends.insert(i + 1, ends[i])
            ends[i] = start
        elif end < ends[i]:
            starts[i] = end
        else:
            del starts[i], ends[i]


def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment
