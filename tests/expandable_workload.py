"""Traces recorded under ``expandable_segments:True`` on the simulated device (views, replay)."""

from __future__ import annotations

import random

from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.sizes import GiB, MiB
from jupyter_gpumem.devices.simulated import ManualClock, SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.config import AllocatorConfig

EXPANDABLE = AllocatorConfig(expandable_segments=True)


def make(native: bool | None = None, capacity: int = 4 * GiB,
         config: AllocatorConfig = EXPANDABLE) -> CachingAllocator:
    device = SimulatedDevice(capacity, clock=ManualClock(tick_ns=1000))
    return CachingAllocator(device, config, native=native)


def random_expandable(seed: int, native: bool | None = None, steps: int = 300, *,
                      snaps: list[tuple[int, Snapshot]] | None = None,
                      streams: int = 2, tail: int | None = None) -> Snapshot:
    """A random workload on two streams with empty_cache calls (holes unmapped, segments
    released and made again); ``snaps`` gets ``(events recorded so far, snapshot)`` now and
    then; with ``tail`` the history keeps only the last events."""
    rng = random.Random(seed)
    a = make(native)
    a.record_history(True, max_entries=tail or 1_000_000)
    live: list[int] = []
    for step in range(steps):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 90 * MiB)])
            live.append(a.malloc(size, rng.randrange(streams)))
        if rng.random() < 0.05:
            a.empty_cache()
        if snaps is not None and step % 37 == 0:
            snap = a.snapshot()
            dropped = snap["jupyter_gpumem"]["history_dropped"]
            snaps.append((dropped + len(snap["device_traces"][0]), snap))
    return a.snapshot()


def growing_program(a: CachingAllocator) -> None:
    """A buffer that grows step by step beside one that stays (as tests/engine's)."""
    keep = []
    for step in range(1, 30):
        p = a.malloc(step * 7 * MiB + 123)
        keep.append(a.malloc(MiB + 512 * step))
        a.free(p)
    for p in keep:
        a.free(p)
