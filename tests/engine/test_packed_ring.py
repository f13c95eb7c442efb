"""The C core's ring of 32-byte events (Note [A ring of 32-byte events] in csrc/core.h): what
does not fit in an event (a 256th stream, an OOM's figures, a release reason, a mapping's base)
and cell numbers come back exactly as the Python core, which keeps whole tuples, gives them;
also once the ring has wrapped and its side lists lost their head."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, OutOfMemoryError, SimulatedDevice
from jupyter_gpumem.engine.allocator import native_core_available

pytestmark = pytest.mark.skipif(not native_core_available(), reason="needs the C core")

MiB = 1 << 20
GiB = 1 << 30


def _program(native: bool, max_entries: int, expandable: bool = False) -> list[dict[str, Any]]:
    config = AllocatorConfig(max_split_size_mb=64, expandable_segments=expandable or None)
    a = CachingAllocator(SimulatedDevice(2 * GiB), config, native=native)
    a.record_history(stacks=False, max_entries=max_entries)
    live = []
    for i in range(600):
        a.current_cell = i // 50  # a run of cells
        live.append(a.malloc(512 * (i % 9 + 1), stream=i % 300))  # 300 streams: past 255
        if i % 4 == 0:
            a.free(live.pop(0))
    big = a.malloc(100 * MiB)  # oversize: a block of 100 MiB ...
    a.free(big)
    again = a.malloc(85 * MiB)  # ... reused for 85 MiB: an excess of 15 MiB
    with pytest.raises(OutOfMemoryError):
        a.malloc(3 * GiB)  # an OOM event: its request and free bytes
    a.free(again)
    for p in live:
        a.free(p)
    a.empty_cache()  # segment_free (or unmap) events with their reason
    entries = list(a.snapshot(mark=False)["device_traces"][0])
    for e in entries:
        e.pop("time_us")  # each core reads its own clock
        e.pop("frames")
    return entries


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("max_entries", [100_000, 700, 1])
def test_the_packed_ring_gives_the_python_cores_events(max_entries: int,
                                                       expandable: bool) -> None:
    ours = _program(True, max_entries, expandable)
    assert ours == _program(False, max_entries, expandable)
    assert len(ours) == min(max_entries, len(ours))
    if max_entries == 100_000:  # every rare field was met
        actions = {e["action"] for e in ours}
        assert {"oom", "segment_free" if not expandable else "segment_unmap"} <= actions
        assert len({e["stream"] for e in ours}) == 300
        assert expandable or any(e.get("block_size", 0) - e["size"] >= 15 * MiB for e in ours)
        assert {e.get("cell") for e in ours} >= set(range(12))


def test_a_ring_made_smaller_keeps_the_newest_events_and_their_cells() -> None:
    seen = []
    for native in (True, False):
        a = CachingAllocator(SimulatedDevice(GiB), native=native)
        a.record_history(stacks=False, max_entries=1000)
        for i in range(40):
            a.current_cell = i
            a.free(a.malloc(512, stream=i))

        def rows(a: CachingAllocator = a) -> list[tuple[str, int | None, int]]:
            trace = a.snapshot(mark=False)["device_traces"][0]
            return [(e["action"], e.get("cell"), e["stream"]) for e in trace]

        before = rows()
        a.record_history(stacks=False, max_entries=10)  # keeps the newest 10
        assert rows() == before[-10:]
        a.current_cell = 99
        a.free(a.malloc(512))
        after = rows()
        assert after == [*before[-10:], ("alloc", 99, 0), ("free_requested", 99, 0),
                         ("free_completed", 99, 0)][-10:]
        seen.append(after)
    assert seen[0] == seen[1]


def test_the_ring_reports_its_32_bytes_an_event_and_its_side_lists() -> None:
    from jupyter_gpumem.data.sizes import RING_EVENT_BYTES

    a = CachingAllocator(SimulatedDevice(GiB), native=True)
    a.record_history(stacks=True, max_entries=10_000)
    for i in range(3000):
        a.free(a.malloc(512 * (i % 5 + 1)))
    h = a.history
    assert h.event_bytes == RING_EVENT_BYTES == 32
    assert h.kept == 9001 and h.dropped == 0
    # the ring grows by doubling (1,024 → 16,384 slots, capped at max_entries) plus the cell
    # runs' list of 64: no byte per event beyond the 32
    assert h.ring_bytes == 10_000 * 32 + 64 * 16
