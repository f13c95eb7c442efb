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

    # -- test and demo controls ----------------------------------------------------------------

    def fail_next(self, count: int = 1) -> None:
        """Make the next ``count`` device mallocs fail as if the device were full."""
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
        """Bytes in live segments."""
        return self._used

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
