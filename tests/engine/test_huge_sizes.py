"""Both cores on devices near 2**63 B: Note [Sizes near 2**63] in ``engine/stats``.

Every case runs on the Python and the C core and checks what each does, then that they agree.
The differential fuzz (``test_native``) runs random programs on such devices too.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, OutOfMemoryError, SimulatedDevice
from jupyter_gpumem.data.sizes import INT64_MAX, MAX_VIRTUAL_RANGE, TiB
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.expandable import address_space_size

MiB = 1 << 20
EiB = 1 << 60
WITH_C = native_core_available() or os.environ.get("CI") == "true"
CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not WITH_C, reason="the C core is not built"))]
BOTH = pytest.mark.skipif(not WITH_C, reason="the C core is not built")


def make(native: bool, capacity: int, **config: Any) -> CachingAllocator:
    return CachingAllocator(SimulatedDevice(capacity), AllocatorConfig(**config), native=native)


def stats_of_both(program: Any, capacity: int, **config: Any) -> list[dict[str, int]]:
    """``program(allocator)`` on each core; their ``memory_stats()`` after it."""
    out = []
    for native in (False, True):
        a = make(native, capacity, **config)
        program(a)
        a.check_invariants()
        out.append(a.memory_stats())
    return out


@pytest.mark.parametrize("native", CORES)
def test_accumulated_counters_saturate_at_2_63_minus_1(native: bool) -> None:
    a = make(native, 1 << 62)
    for _ in range(3):
        a.free(a.malloc(1 << 62))
    stats = a.memory_stats()
    for name in ("allocated_bytes", "active_bytes", "requested_bytes"):
        for pool in ("all", "large_pool"):
            assert stats[f"{name}.{pool}.allocated"] == INT64_MAX, (name, pool)
            assert stats[f"{name}.{pool}.freed"] == INT64_MAX, (name, pool)
            assert stats[f"{name}.{pool}.current"] == 0
        assert stats[f"{name}.all.peak"] == 1 << 62
    assert stats["allocation.all.allocated"] == 3
    assert stats["reserved_bytes.all.allocated"] == 1 << 62  # one segment, reused
    a.reset_accumulated_memory_stats()
    a.free(a.malloc(1 << 62))
    assert a.memory_stats()["allocated_bytes.all.allocated"] == 1 << 62  # counting again


@BOTH
def test_saturated_counters_agree_between_the_cores() -> None:
    def program(a: CachingAllocator) -> None:
        for size in (1 << 62, 1 << 61, 1 << 62, 3 << 60, 1 << 62, 5000):
            a.free(a.malloc(size))

    py, c = stats_of_both(program, 1 << 62)
    assert py == c
    assert py["allocated_bytes.all.allocated"] == INT64_MAX


@pytest.mark.parametrize("native", CORES)
def test_the_memory_fraction_cap_near_2_63_is_checked_before_the_device(native: bool) -> None:
    # reserved + size passes 2**63 here: the cap refuses the segment without asking the device
    a = make(native, INT64_MAX, per_process_memory_fraction=0.99)
    p = a.malloc(1 << 62)
    calls = a.device.malloc_calls  # type: ignore[attr-defined]
    with pytest.raises(OutOfMemoryError):
        a.malloc(1 << 62)
    assert a.device.malloc_calls == calls  # type: ignore[attr-defined]
    assert a.memory_reserved() == 1 << 62
    q = a.malloc(1 << 61)  # under the cap: fits
    assert a.memory_reserved() == 3 << 61
    a.free(p)
    a.free(q)
    a.check_invariants()


class BottomlessDevice(SimulatedDevice):
    """A device that never runs out: its ``malloc`` hands out any size, one range after the
    other from 2 MiB (a real device holds less than 2**63 B; this one checks what the core does
    when a device lies)."""

    def __init__(self) -> None:
        super().__init__(1 << 62)
        self.next_addr = 2 * MiB

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        self.malloc_calls += 1
        addr, self.next_addr = self.next_addr, self.next_addr + nbytes
        return addr

    def free(self, ptr: int) -> None:
        self.free_calls += 1


@pytest.mark.parametrize("native", CORES)
def test_reserved_bytes_never_pass_2_63_minus_1(native: bool) -> None:
    a = CachingAllocator(BottomlessDevice(), native=native)
    live = [a.malloc(1 << 62)]
    with pytest.raises(OutOfMemoryError):  # a second would take reserved bytes to 2**63
        a.malloc(1 << 62)
    assert a.device.malloc_calls == 1  # type: ignore[attr-defined]
    live.append(a.malloc((1 << 62) - 4 * MiB))
    assert a.memory_reserved() == (1 << 63) - 4 * MiB
    with pytest.raises(OutOfMemoryError):  # its 20 MiB segment would pass 2**63 - 1
        a.malloc(4 * MiB)
    stats = a.memory_stats()
    assert stats["reserved_bytes.all.current"] == stats["reserved_bytes.all.peak"] == (
        (1 << 63) - 4 * MiB)
    assert stats["num_ooms"] == 2
    for p in live:
        a.free(p)
    a.check_invariants()


@pytest.mark.parametrize("native", CORES)
def test_a_device_range_that_does_not_fit_in_63_bits_is_refused(native: bool) -> None:
    a = CachingAllocator(BottomlessDevice(), native=native)
    a.device.next_addr = (1 << 63) - 4 * MiB  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"the device's malloc returned 0x7fffffffffc00000 for "
                                         r"20971520 B: the range must lie in \[1, 2\*\*63\)"):
        a.malloc(5 * MiB)
    assert a.device.free_calls == 1  # type: ignore[attr-defined]  # given back
    assert a.memory_reserved() == 0
    a.device.next_addr = 1 << 64  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="returned 0x10000000000000000 for 20971520 B"):
        a.malloc(5 * MiB)
    assert a.device.free_calls == 2  # type: ignore[attr-defined]
    a.device.next_addr = 2 * MiB  # type: ignore[attr-defined]
    a.free(a.malloc(5 * MiB))
    assert a.memory_reserved() == 20 * MiB
    a.check_invariants()


@pytest.mark.parametrize("native", CORES)
def test_a_device_total_above_2_63_minus_1_is_refused_by_both_cores(native: bool) -> None:
    a = make(native, 4 * EiB)
    vmm = a.device
    for total in (1 << 63, 1 << 80):
        with pytest.raises(ValueError, match="set_vmm: total must be positive"):
            a._core.set_vmm(vmm.reserve, vmm.release, vmm.map, vmm.unmap, total)


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("capacity", [8_000_000 * TiB, INT64_MAX])
def test_expandable_segments_on_a_device_above_8_eib(native: bool, capacity: int) -> None:
    # total + total / 8 passes 2**63 here: the span is capped (MAX_VIRTUAL_RANGE), not wrapped
    a = make(native, capacity, expandable_segments=True)
    p = a.malloc(16 * MiB)
    q = a.malloc(512, stream=7)
    spans = {s.span for s in a.state().segments}
    assert spans == {address_space_size(capacity, small=False),
                     address_space_size(capacity, small=True)}
    assert max(spans) < MAX_VIRTUAL_RANGE + 20 * MiB
    assert a.memory_reserved() == 22 * MiB
    with pytest.raises(OutOfMemoryError):  # more than one segment's range
        a.malloc(MAX_VIRTUAL_RANGE + 20 * MiB)
    a.free(p)
    a.free(q)
    a.empty_cache()
    assert a.memory_reserved() == 0 and a.device.reserved_ranges() == {}  # type: ignore[attr-defined]


@BOTH
def test_expandable_segments_of_many_streams_fit_on_a_2_62_device() -> None:
    # the replay's "unlimited" device: each (stream, pool) pair reserves a range of its own
    rows = []
    for native in (False, True):
        a = make(native, 1 << 62, expandable_segments=True)
        live = [a.malloc(size, stream) for stream in range(40) for size in (512, 30 * MiB)]
        assert len(a.device.reserved_ranges()) == 80  # type: ignore[attr-defined]
        assert max(row.address + row.span for row in a.state().segments) < 1 << 63
        rows.append([r[:4] + r[5:] for r in a.state().segments])
        for p in live:
            a.free(p)
        a.empty_cache()
        assert a.device.reserved_ranges() == {}  # type: ignore[attr-defined]
    assert rows[0] == rows[1]


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("field", ["max_split", "divisions", "cap"])
def test_configure_refuses_values_beyond_64_bits_alike(native: bool, field: str) -> None:
    a = make(native, 1 << 30)
    values = {"max_split": 1 << 62, "divisions": 0, "cap": -1, field: 1 << 63}
    with pytest.raises(ValueError, match="configure: a value is out of range"):
        a._core.configure(values["max_split"], values["divisions"], values["cap"], 0.0)


@BOTH
def test_cupys_alloc_of_the_largest_size_is_out_of_memory() -> None:
    # the C hooks rounded the size of a refused request (signed overflow past 2**63 - 512)
    from cupy.cuda.memory import MemoryPointer, PythonFunctionAllocatorMemory

    from jupyter_gpumem.engine._native import Hooks

    a = make(True, 1 << 30)
    hooks = Hooks([a._core], lambda: 0, lambda device_id: a._core, get_device=lambda: 0,
                  memory=PythonFunctionAllocatorMemory, pointer=MemoryPointer)
    for size in (INT64_MAX, (1 << 62) + 1):
        with pytest.raises(OutOfMemoryError):
            hooks.alloc(size)
    assert a.memory_stats()["num_ooms"] == 2
