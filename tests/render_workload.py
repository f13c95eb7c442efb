"""A scripted workload with distinct allocating lines, cells and an OOM, for renderer tests."""

from __future__ import annotations

from jupyter_gpumem import CachingAllocator, ManualClock, OutOfMemoryError, SimulatedDevice
from jupyter_gpumem.data.schema import SegmentInfo, Snapshot

MiB = 1 << 20
GiB = 1 << 30


def recorded_allocator(*, oom: bool = True) -> CachingAllocator:
    a = CachingAllocator(SimulatedDevice(2 * GiB, clock=ManualClock(tick_ns=1000),
                                         name="Simulated GPU"))
    a.record_history(True)
    a.current_cell = 1
    a.malloc(300 * MiB)
    a.malloc(100 * MiB)
    a.current_cell = 2
    for step in range(3):
        acts = [a.malloc((20 + 5 * step) * MiB) for _ in range(4)]
        tmp = [a.malloc(300 * 1024 + 17) for _ in range(5)]
        a.malloc(3 * MiB + 100)  # leaked on purpose
        for p in acts + tmp:
            a.free(p)
    a.current_cell = 3
    if oom:
        try:
            a.malloc(3 * GiB)
        except OutOfMemoryError:
            pass  # the OOM the renderers mark
        else:
            raise AssertionError("3 GiB fit on a 2 GiB device")
    big = a.malloc(700 * MiB)
    a.free(big)
    return a


def line_of(code: str) -> int:
    """The line of this file that holds ``code``, as a site names it."""
    with open(__file__, encoding="utf-8") as f:
        return next(n for n, line in enumerate(f, 1) if code in line)


#: The site of the largest block, the 700 MiB one of cell 3.
BIG_SITE = f"render_workload.py:{line_of('big = a.malloc(700 * MiB)')}"


def recorded_snapshot(**kwargs: bool) -> Snapshot:
    return recorded_allocator(**kwargs).snapshot()


def one_segment() -> list[SegmentInfo]:
    base = 1 << 30
    blocks = [
        (0, 512 * 1024, 300 * 1024, "active_allocated"),
        (512 * 1024, 512 * 1024, 0, "inactive"),
        (1024 * 1024, 256 * 1024, 250 * 1024, "active_pending_free"),
        (1280 * 1024, 768 * 1024, 700 * 1024, "active_allocated"),
    ]
    return [{
        "device": 0, "address": base, "total_size": 2 * MiB, "allocated_size": 1280 * 1024,
        "active_size": 1536 * 1024, "requested_size": 1000 * 1024, "stream": 0,
        "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [],
        "blocks": [{"address": base + off, "size": size, "requested_size": req, "state": st,
                    "frames": []} for off, size, req, st in blocks],
    }]


def many_segments(count: int) -> list[SegmentInfo]:
    out: list[SegmentInfo] = []
    for k in range(count):
        addr = (1 << 32) + k * 4 * MiB
        out.append({
            "device": 0, "address": addr, "total_size": 2 * MiB, "allocated_size": MiB,
            "active_size": MiB, "requested_size": MiB - 100, "stream": k % 2,
            "segment_type": "small" if k % 3 else "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [],
            "blocks": [
                {"address": addr, "size": MiB, "requested_size": MiB - 100,
                 "state": "active_allocated", "frames": []},
                {"address": addr + MiB, "size": MiB, "requested_size": 0, "state": "inactive",
                 "frames": []},
            ],
        })
    return out


def two_device_snapshot() -> tuple[Snapshot, int]:
    """Two devices as ``api.snapshot()`` merges them (no ``jupyter_gpumem["device"]``): device
    0 with a segment and no history, device 1 with history and a 5 MiB block allocated before
    its trace began. Returns the snapshot and that block's address."""
    devices = [CachingAllocator(SimulatedDevice(GiB, index=i, clock=ManualClock(tick_ns=1000)))
               for i in (0, 1)]
    devices[0].malloc(3 * MiB)
    old = devices[1].malloc(5 * MiB)  # predates device 1's trace
    devices[1].record_history(True)
    devices[1].free(devices[1].malloc(7 * MiB))
    devices[1].malloc(MiB)
    snaps = [a.snapshot() for a in devices]
    merged: Snapshot = {"segments": snaps[0]["segments"] + snaps[1]["segments"],
                        "device_traces": [[], snaps[1]["device_traces"][1]]}
    return merged, old
