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


class VirtualMemoryDevice(Device, Protocol):
    """A device that can also reserve address space and map physical pages into it, as CUDA's
    virtual memory management does (cuMemAddressReserve, cuMemCreate + cuMemMap, cuMemUnmap).
    Expandable segments need it: Note [Expandable segments] in ``engine/expandable``."""

    def vmm_granularity(self) -> int:
        """The physical page granule in bytes (2 MiB on an H200)."""
        ...

    def reserve(self, nbytes: int) -> int:
        """A virtual range of ``nbytes``, no physical memory; DeviceOutOfMemory if it cannot."""
        ...

    def release(self, ptr: int, nbytes: int) -> None:
        """Give back a whole reserved range, all of it unmapped."""
        ...

    def map(self, ptr: int, nbytes: int) -> None:
        """Back ``[ptr, ptr + nbytes)`` with physical memory, read/write; granule-aligned. All
        or nothing: DeviceOutOfMemory leaves nothing new mapped."""
        ...

    def unmap(self, ptr: int, nbytes: int) -> None:
        """Unmap and free the physical memory of a granule-aligned mapped sub-range."""
        ...


def vmm_of(device: Device) -> VirtualMemoryDevice | None:
    """``device`` if it has every virtual-memory operation, else None."""
    names = ("vmm_granularity", "reserve", "release", "map", "unmap")
    if all(callable(getattr(device, name, None)) for name in names):
        return device  # type: ignore[return-value]
    return None
