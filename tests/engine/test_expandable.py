"""Expandable segments on both cores: Note [Expandable segments] in engine/expandable."""

from __future__ import annotations

import pytest

from jupyter_gpumem.data.sizes import GiB, MiB
from jupyter_gpumem.devices.simulated import ManualClock, SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator, native_core_available
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.device import DeviceOutOfMemory
from jupyter_gpumem.engine.expandable import address_space_size
from jupyter_gpumem.engine.oom import OutOfMemoryError

CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not native_core_available(), reason="the C core is not built"))]
ON = AllocatorConfig(expandable_segments=True)


def make(native: bool, capacity: int = 4 * GiB,
         config: AllocatorConfig = ON) -> tuple[CachingAllocator, SimulatedDevice]:
    device = SimulatedDevice(capacity, clock=ManualClock(tick_ns=1000))
    return CachingAllocator(device, config, debug=True, native=native), device


def actions(a: CachingAllocator) -> list[tuple[str, int]]:
    return [(e["action"], e["size"]) for e in a.snapshot()["device_traces"][0]
            if e["action"].startswith("segment")]


@pytest.mark.parametrize("native", CORES)
def test_a_segment_grows_by_pages_at_its_end(native: bool) -> None:
    a, d = make(native)
    a.record_history()
    first = a.malloc(3 * MiB)
    assert a.memory_reserved() == 20 * MiB == d.mapped_bytes  # one 20 MiB page
    second = a.malloc(30 * MiB)  # 17 MiB left: 13 MiB more, one more page... two
    assert second == first + 3 * MiB, "placed right after, in the same segment"
    assert a.memory_reserved() == 40 * MiB
    assert list(d.reserved_ranges().values()) == [address_space_size(4 * GiB, small=False)]
    st = a.memory_stats()
    assert st["num_device_alloc"] == 2 and st["segment.all.current"] == 0
    assert st["reserved_bytes.large_pool.current"] == 40 * MiB
    assert actions(a) == [("segment_map", 20 * MiB), ("segment_map", 20 * MiB)]
    a.free(first)
    a.free(second)


@pytest.mark.parametrize("native", CORES)
def test_small_pool_pages_are_2_mib(native: bool) -> None:
    a, d = make(native)
    ptrs = [a.malloc(512 * 1024) for _ in range(5)]
    assert a.memory_reserved() == 4 * MiB == d.mapped_bytes
    assert a.memory_stats()["reserved_bytes.small_pool.current"] == 4 * MiB
    assert d.map_calls == 2
    for p in ptrs:
        a.free(p)


@pytest.mark.parametrize("native", CORES)
def test_freed_memory_is_reused_and_merges_only_with_mapped_blocks(native: bool) -> None:
    a, _ = make(native)
    x = a.malloc(8 * MiB)
    y = a.malloc(8 * MiB)
    a.free(x)
    assert a.malloc(6 * MiB) == x, "best fit reuses the freed block"
    a.free(x)
    a.free(y)
    state = a.state()
    (seg,) = state.segments
    assert seg.expandable and seg.size == 20 * MiB
    (block,) = state.blocks  # the free mapped blocks merged, the unmapped rest did not
    assert (block.address, block.size, block.allocated) == (seg.address, 20 * MiB, False)
    assert a.memory_stats()["inactive_split.all.current"] == 0


@pytest.mark.parametrize("native", CORES)
def test_empty_cache_unmaps_whole_free_pages_and_releases_empty_segments(native: bool) -> None:
    a, d = make(native)
    a.record_history()
    keep = a.malloc(5 * MiB)
    gone = a.malloc(40 * MiB)
    a.free(gone)
    assert a.memory_reserved() == 60 * MiB
    assert a.empty_cache() == 40 * MiB  # pages 2 and 3; the rest of page 1 stays mapped
    assert a.memory_reserved() == 20 * MiB == d.mapped_bytes
    assert a.memory_stats()["num_device_free"] == 1
    assert actions(a)[-1] == ("segment_unmap", 40 * MiB)
    trace = a.snapshot()["device_traces"][0]
    assert [e.get("reason") for e in trace if e["action"] == "segment_unmap"] == ["empty_cache"]
    a.free(keep)
    a.empty_cache()
    assert a.memory_reserved() == 0 and d.mapped_bytes == 0
    assert d.reserved_ranges() == {} and a.state().segments == []


@pytest.mark.parametrize("native", CORES)
def test_a_failed_map_runs_the_ladder_and_raises_our_oom_with_nothing_leaked(
        native: bool) -> None:
    a, d = make(native, capacity=100 * MiB)
    held = a.malloc(30 * MiB)  # 40 MiB mapped
    spare = a.malloc(1000)  # 2 MiB small page
    a.free(spare)
    with pytest.raises(OutOfMemoryError):
        a.malloc(75 * MiB)  # needs 80 MiB more pages: only 60 MiB of device memory left
    st = a.memory_stats()
    assert st["num_ooms"] == 1 and st["num_alloc_retries"] == 1
    assert a.memory_reserved() == d.mapped_bytes == 40 * MiB  # the small page was unmapped
    d.fail_next(1)  # a failed map, then the retry succeeds
    p = a.malloc(20 * MiB)
    assert a.memory_stats()["num_alloc_retries"] == 2
    a.free(p)
    a.free(held)
    a.empty_cache()
    assert d.mapped_bytes == 0 and d.reserved_ranges() == {}


@pytest.mark.parametrize("native", CORES)
def test_snapshot_reports_each_mapped_range_as_an_expandable_segment(native: bool) -> None:
    a, _ = make(native)
    low = a.malloc(20 * MiB)
    mid = a.malloc(20 * MiB)
    high = a.malloc(20 * MiB)
    a.free(mid)
    a.empty_cache()  # unmaps the middle page: two mapped ranges remain
    segments = a.snapshot()["segments"]
    assert [(s["address"], s["total_size"], s["is_expandable"]) for s in segments] == [
        (low, 20 * MiB, True), (high, 20 * MiB, True)]
    assert all(s["segment_type"] == "large" for s in segments)
    # the hole is filled first: lowest address
    assert a.malloc(10 * MiB) == mid
    a.free(mid)
    a.free(low)
    a.free(high)


@pytest.mark.parametrize("native", CORES)
def test_switching_off_keeps_old_segments_and_makes_classic_ones(native: bool) -> None:
    a, d = make(native)
    x = a.malloc(3 * MiB)
    a.set_config(AllocatorConfig(expandable_segments=False))
    y = a.malloc(3 * MiB)  # not in the expandable segment's free 17 MiB
    kinds = sorted((s.expandable, s.size) for s in a.state().segments)
    assert kinds == [(False, 20 * MiB), (True, 20 * MiB)]
    a.free(x)
    a.free(y)
    a.empty_cache()
    assert a.memory_reserved() == 0 and d.reserved_ranges() == {}


def test_a_device_without_virtual_memory_refuses_the_option() -> None:
    class Plain:
        index = 0
        name = "plain"
        clock = ManualClock()

        def __init__(self) -> None:
            self.sim = SimulatedDevice(GiB)

        def malloc(self, nbytes: int, stream: int) -> int:
            return self.sim.malloc(nbytes, stream)

        def free(self, ptr: int) -> None:
            self.sim.free(ptr)

        def mem_get_info(self) -> tuple[int, int]:
            return self.sim.mem_get_info()

    a = CachingAllocator(Plain())
    before = a.config
    with pytest.raises(ValueError, match="virtual memory"):
        a.set_config(ON)
    assert a.config is before
    with pytest.raises(ValueError, match="virtual memory"):
        CachingAllocator(Plain(), ON)


def test_the_simulated_device_checks_its_pages() -> None:
    d = SimulatedDevice(100 * MiB)
    base = d.reserve(40 * MiB)
    d.map(base, 4 * MiB)
    assert d.mem_get_info()[0] == 96 * MiB and d.mapped_bytes == 4 * MiB
    with pytest.raises(ValueError, match="already mapped"):
        d.map(base + 2 * MiB, 2 * MiB)
    with pytest.raises(ValueError, match="not mapped"):
        d.unmap(base + 4 * MiB, 2 * MiB)
    with pytest.raises(ValueError, match="granule"):
        d.map(base + MiB, 2 * MiB)
    with pytest.raises(ValueError, match="still mapped"):
        d.release(base, 40 * MiB)
    d.map(base + 4 * MiB, 36 * MiB)
    other = d.reserve(200 * MiB)
    with pytest.raises(DeviceOutOfMemory):
        d.map(other, 62 * MiB)  # 60 MiB free
    d.fail_next(1)
    with pytest.raises(DeviceOutOfMemory):
        d.map(other, 2 * MiB)
    d.unmap(base, 40 * MiB)
    assert d.mem_get_info()[0] == 100 * MiB and d.mapped_bytes == 0
    assert (d.map_calls, d.unmap_calls) == (5, 1)
    d.release(base, 40 * MiB)
    d.release(other, 200 * MiB)
    assert d.reserved_ranges() == {}


def growing_program(a: CachingAllocator) -> int:
    """A buffer that grows step by step beside one that stays, as a varying batch does; the
    peak reserved bytes."""
    peak = 0
    keep = []
    for step in range(1, 30):
        p = a.malloc(step * 7 * MiB + 123)
        keep.append(a.malloc(MiB + 512 * step))
        peak = max(peak, a.memory_reserved())
        a.free(p)
    for p in keep:
        a.free(p)
    return peak


@pytest.mark.parametrize("native", CORES)
def test_growing_requests_need_less_memory_with_expandable_segments(native: bool) -> None:
    classic, _ = make(native, config=AllocatorConfig())
    expandable, _ = make(native)
    assert growing_program(expandable) < growing_program(classic)


@pytest.mark.parametrize("native", CORES)
def test_a_capacity_where_only_expandable_segments_fit(native: bool) -> None:
    capacity = 420 * MiB
    classic, _ = make(native, capacity, AllocatorConfig())
    with pytest.raises(OutOfMemoryError):
        growing_program(classic)
    expandable, _ = make(native, capacity)
    assert growing_program(expandable) <= capacity
