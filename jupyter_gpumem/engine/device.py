"""What the allocator needs from a device: the Device protocol, its clock and its one error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Clock = Callable[[], int]
"""A clock returns nanoseconds from an arbitrary start, like ``time.perf_counter_ns``."""


class DeviceOutOfMemory(Exception):
    """The device could not hand out a segment (cudaErrorMemoryAllocation)."""


class Device(Protocol):
    """What the allocator needs from a device: whole segments, memory info and a clock."""

    index: int
    name: str
    clock: Clock

    def malloc(self, nbytes: int, stream: int) -> int:
        """A new segment of ``nbytes``; raises DeviceOutOfMemory when the device is full."""
        ...

    def free(self, ptr: int) -> None:
        """Give back a segment obtained from ``malloc``."""
        ...

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the whole device, as cudaMemGetInfo reports them."""
        ...
