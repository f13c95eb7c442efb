"""A device that needs no GPU: integer addresses from a fixed capacity, and a manual clock."""

from __future__ import annotations

import bisect
import threading
import time

from jupyter_gpumem.data.sizes import GiB, MiB
from jupyter_gpumem.engine.device import Clock, DeviceOutOfMemory

#: Addresses handed out by SimulatedDevice are multiples of this, as cudaMalloc's are.
SEGMENT_ALIGNMENT = 2 * MiB
#: Where SimulatedDevice's address space starts: far from 0, like a real device pointer.
SIMULATED_BASE = 0x7F00_0000_0000
#: Where its reserved virtual ranges start: a separate space, as cuMemAddressReserve's is.
VIRTUAL_BASE = 0x7E00_0000_0000
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
    ranges reserved from a separate address space, and pages of ``VMM_GRANULARITY`` mapped in
    them, counted against the capacity like segments. It catches a map of a mapped page, an
    unmap of an unmapped one, ranges outside a reservation, and the release of a range with
    pages still mapped. ``fail_next`` fails maps too (not reserves: address space is free).
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
        self.index = index
        self.name = name
        self.clock = clock
        self.total = capacity
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}  # address -> size of every live segment
        self._gaps: list[tuple[int, int]] = []  # freed address ranges (start, size), sorted
        self._top = SIMULATED_BASE  # next never-used address
        self._used = 0
        self._fail_next = 0
        self._others: dict[int, tuple[str, int]] = {}  # pid -> (name, bytes) of other processes
        self.malloc_calls = 0
        self.free_calls = 0
        self._reserved: dict[int, int] = {}  # base -> size of every reserved virtual range
        self._mapped: set[int] = set()  # addresses of the mapped pages
        self._virtual_top = VIRTUAL_BASE
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
            ptr = self._take_range(_align_up(nbytes, SEGMENT_ALIGNMENT))
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
            self._give_range(ptr, _align_up(size, SEGMENT_ALIGNMENT))

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
            base = self._virtual_top
            self._virtual_top += nbytes + VMM_GRANULARITY  # a guard page between ranges
            self._reserved[base] = nbytes
            return base

    def release(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            if self._reserved.get(ptr) != nbytes:
                raise ValueError(f"release of {nbytes} B at {ptr:#x}, which is not a reserved "
                                 "range of that size")
            if any(ptr <= page < ptr + nbytes for page in self._mapped):
                raise ValueError(f"release of the range at {ptr:#x} with pages still mapped")
            del self._reserved[ptr]

    def map(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            pages = self._pages_locked(ptr, nbytes, "map")
            self.map_calls += 1
            if self._fail_next:
                self._fail_next -= 1
                raise DeviceOutOfMemory(f"simulated failure of a {nbytes} B map")
            for page in pages:
                if page in self._mapped:
                    raise ValueError(f"map of the page at {page:#x}, which is already mapped")
            if self._used + self.held_by_others + nbytes > self.total:
                raise DeviceOutOfMemory(
                    f"out of memory: asked to map {nbytes} B, {self._free_locked()} B free"
                )
            self._mapped.update(pages)
            self._used += nbytes

    def unmap(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            pages = self._pages_locked(ptr, nbytes, "unmap")
            for page in pages:
                if page not in self._mapped:
                    raise ValueError(f"unmap of the page at {page:#x}, which is not mapped")
            self.unmap_calls += 1
            self._mapped.difference_update(pages)
            self._used -= nbytes

    def _pages_locked(self, ptr: int, nbytes: int, what: str) -> range:
        if nbytes <= 0 or ptr % VMM_GRANULARITY or nbytes % VMM_GRANULARITY:
            raise ValueError(f"{what} of {nbytes} B at {ptr:#x} is not granule-aligned")
        if not any(base <= ptr and ptr + nbytes <= base + size
                   for base, size in self._reserved.items()):
            raise ValueError(f"{what} of {nbytes} B at {ptr:#x} outside every reserved range")
        return range(ptr, ptr + nbytes, VMM_GRANULARITY)

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
            return len(self._mapped) * VMM_GRANULARITY

    def reserved_ranges(self) -> dict[int, int]:
        """``{base: size}`` of every reserved virtual range not yet released."""
        with self._lock:
            return dict(self._reserved)

    def live_segments(self) -> dict[int, int]:
        """``{address: size}`` of every segment not yet freed."""
        with self._lock:
            return dict(self._live)

    # -- address space -------------------------------------------------------------------------

    def _free_locked(self) -> int:
        return self.total - self._used - self.held_by_others

    def _take_range(self, size: int) -> int:
        for i, (start, gap) in enumerate(self._gaps):
            if gap >= size:
                if gap == size:
                    del self._gaps[i]
                else:
                    self._gaps[i] = (start + size, gap - size)
                return start
        start = self._top
        self._top += size
        return start

    def _give_range(self, start: int, size: int) -> None:
        gaps = self._gaps
        i = bisect.bisect_left(gaps, (start, 0))
        if i < len(gaps) and start + size == gaps[i][0]:
            size += gaps.pop(i)[1]
        if i > 0 and gaps[i - 1][0] + gaps[i - 1][1] == start:
            start, prev = gaps.pop(i - 1)
            size += prev
            i -= 1
        if start + size == self._top:
            self._top = start
        else:
            gaps.insert(i, (start, size))


def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment
