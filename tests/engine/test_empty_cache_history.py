"""Note [Recording empty_cache]: where the user called empty_cache, who released each segment,
and what an out-of-memory request asked for, in both cores."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, OutOfMemoryError, SimulatedDevice
from jupyter_gpumem.data.files import load_snapshot, save_snapshot
from jupyter_gpumem.engine.allocator import native_core_available

MiB = 1 << 20
CORES = [False, True] if native_core_available() else [False]


def make(native: bool, capacity: int = 1 << 30, config: AllocatorConfig | None = None,
         max_entries: int = 100_000) -> CachingAllocator:
    a = CachingAllocator(SimulatedDevice(capacity), config, native=native)
    a.record_history(stacks=False, max_entries=max_entries)
    return a


def events(a: CachingAllocator) -> tuple[list[dict[str, Any]], list[int]]:
    snap = a.snapshot()
    trace: list[dict[str, Any]] = snap["device_traces"][0]  # type: ignore[assignment]
    return trace[:-1], snap["jupyter_gpumem"]["empty_cache"]  # type: ignore[return-value]


@pytest.mark.parametrize("native", CORES)
def test_empty_cache_calls_are_positions_even_when_they_free_nothing(native: bool) -> None:
    a = make(native)
    a.empty_cache()  # nothing to free: no event, still a call
    p = a.malloc(3 * MiB)
    a.empty_cache()  # the segment is live: frees nothing
    a.empty_cache()  # same position as the call before: one entry
    a.free(p)
    a.empty_cache()  # frees the segment
    trace, marks = events(a)
    actions = [e["action"] for e in trace]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed",
                       "segment_free"]
    assert marks == [0, 2, 4]
    assert trace[4]["reason"] == "empty_cache"
    assert all("reason" not in e for e in trace[:4])


@pytest.mark.parametrize("native", CORES)
def test_segment_free_says_who_released_it(native: bool) -> None:
    # The retry ladder: a cap of 60 MiB, 12 and 14 MiB segments cached, a 40 MiB request.
    a = make(native, capacity=100 * MiB,
             config=AllocatorConfig(per_process_memory_fraction=0.6))
    x, y = a.malloc(12 * MiB), a.malloc(14 * MiB)
    a.free(x)
    a.free(y)
    z = a.malloc(40 * MiB)
    a.free(z)
    trace, marks = events(a)
    assert marks == []
    assert [e["reason"] for e in trace if e["action"] == "segment_free"] == ["retry", "retry"]
    assert a.stats.num_alloc_retries == 1


@pytest.mark.parametrize("native", CORES)
def test_oversize_and_gc_releases_are_named(native: bool) -> None:
    a = make(native, capacity=200 * MiB, config=AllocatorConfig(max_split_size_mb=30))
    big = a.malloc(64 * MiB)
    a.free(big)
    a.device.hold_for_process(1, 120 * MiB)  # leaves room for nothing new
    with pytest.raises(OutOfMemoryError):
        a.malloc(100 * MiB)
    trace, _ = events(a)
    frees = [e for e in trace if e["action"] == "segment_free"]
    assert [e["reason"] for e in frees] == ["oversize"]
    oom = next(e for e in trace if e["action"] == "oom")
    assert (oom["size"], oom["requested_size"]) == (100 * MiB, 100 * MiB)

    g = make(native, capacity=100 * MiB,
             config=AllocatorConfig(per_process_memory_fraction=1 - 1e-9,
                                    garbage_collection_threshold=0.3))
    blocks = [g.malloc(25 * MiB) for _ in range(2)]
    for p in blocks:
        g.free(p)
    g.malloc(40 * MiB)
    trace, _ = events(g)
    assert "gc" in {e.get("reason") for e in trace if e["action"] == "segment_free"}


@pytest.mark.parametrize("native", CORES)
def test_an_oom_records_the_request_and_its_rounding(native: bool) -> None:
    a = make(native, capacity=64 * MiB, config=AllocatorConfig(roundup_power2_divisions=4))
    with pytest.raises(OutOfMemoryError):
        a.malloc(100 * MiB + 1)
    (oom,), _ = events(a)
    assert oom["action"] == "oom"
    assert oom["requested_size"] == 100 * MiB + 1
    assert oom["size"] == 112 * MiB  # rounded up to a quarter step between 64 and 128 MiB
    assert "block_size" not in oom


@pytest.mark.parametrize("native", CORES)
def test_positions_follow_the_ring_and_clear(native: bool) -> None:
    a = make(native, max_entries=4)
    a.empty_cache()  # position 0, soon dropped
    for _ in range(3):
        a.free(a.malloc(512))  # segment_alloc + 3 × (alloc, free_requested, free_completed)
    a.empty_cache()  # at event 10, its segment_free
    snap = a.snapshot()
    # 12 events with the snapshot's: the ring keeps 8..11, so event 10 is the third kept
    assert [e["action"] for e in snap["device_traces"][0]] == [
        "free_requested", "free_completed", "segment_free", "snapshot"]
    assert snap["jupyter_gpumem"]["empty_cache"] == [2]
    a.record_history(stacks=False, max_entries=4, clear=True)
    assert a.snapshot()["jupyter_gpumem"]["empty_cache"] == []
    a.record_history(enabled=False)
    a.empty_cache()
    assert a.snapshot()["jupyter_gpumem"]["empty_cache"] == []


@pytest.mark.parametrize("native", CORES)
def test_the_extension_field_survives_a_file_and_pytorch_keys_stay(native: bool,
                                                                   tmp_path: Any) -> None:
    a = make(native)
    a.empty_cache()
    a.free(a.malloc(512))
    a.empty_cache()
    path = save_snapshot(a.snapshot(), tmp_path / "t.pickle", pickled=True)
    back = load_snapshot(path)
    assert back["jupyter_gpumem"]["empty_cache"] == [0, 4]
    free = next(e for e in back["device_traces"][0] if e["action"] == "segment_free")
    assert set(free) >= {"action", "addr", "size", "stream", "time_us", "frames"}
