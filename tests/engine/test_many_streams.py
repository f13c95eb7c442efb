"""Many streams and blocks freed in descending address order, on both cores: the C core finds a
stream's free list by a hash index past a few streams and moves the shorter side of a sorted
list (``stream_in``, ``stream_insert_at`` in csrc/policy.c); the Python core is the reference.
Seeded programs, compared op by op: counters, blocks and segments."""

from __future__ import annotations

import random

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.blocks import STREAM_MAX, STREAM_MIN
from jupyter_gpumem.engine.oom import OutOfMemoryError

pytestmark = pytest.mark.skipif(not native_core_available(), reason="the C core is not built")

MiB = 1 << 20
#: more than a pool scans (STREAM_SCAN), with the extremes a stream id may take
STREAMS = [*range(40), STREAM_MIN, STREAM_MAX, -1, 1 << 40, 0x7F00_0000_1000]


def _state(a: CachingAllocator) -> tuple[object, ...]:
    s = a.state()
    return (a.stats.to_tuple(), [row[:7] for row in s.blocks],
            [row[:4] + row[5:] for row in s.segments])


@pytest.mark.parametrize("seed", range(12))
def test_the_cores_agree_over_many_streams(seed: int) -> None:
    rng = random.Random(seed)
    config = AllocatorConfig(
        expandable_segments=seed % 3 == 0,
        max_split_size_mb=rng.choice([None, 21]),
        per_process_memory_fraction=rng.choice([None, 0.5]),
        garbage_collection_threshold=None)
    cores = [CachingAllocator(SimulatedDevice(1024 * MiB), config, native=native)
             for native in (False, True)]
    lives: list[list[int]] = [[], []]
    for step in range(400):
        r = rng.random()
        if r < 0.08:
            op: tuple[object, ...] = ("empty_cache",)
        elif r < 0.12 and lives[0]:
            op = ("free_descending",)  # every live block, highest address first
        elif r < 0.45 and lives[0]:
            op = ("free", rng.randrange(len(lives[0])))
        else:
            size = rng.choice([rng.randrange(1, MiB), rng.randrange(MiB, 30 * MiB)])
            op = ("malloc", size, rng.choice(STREAMS))
        outcomes: list[int | None] = []
        for a, live in zip(cores, lives, strict=True):
            if op[0] == "empty_cache":
                outcomes.append(a.empty_cache())
            elif op[0] == "free_descending":
                for ptr in sorted(live, reverse=True):
                    a.free(ptr)
                live.clear()
                outcomes.append(None)
            elif op[0] == "free":
                a.free(live.pop(int(op[1])))  # type: ignore[call-overload]
                outcomes.append(None)
            else:
                try:
                    ptr = a.malloc(int(op[1]), int(op[2]))  # type: ignore[call-overload]
                except OutOfMemoryError:
                    ptr = 0
                if ptr:
                    live.append(ptr)
                outcomes.append(ptr)
        assert outcomes[0] == outcomes[1], (step, op)
        assert _state(cores[0]) == _state(cores[1]), (step, op)
        cores[1].check_invariants()
    for a, live in zip(cores, lives, strict=True):
        for ptr in sorted(live, reverse=True):
            a.free(ptr)
        a.empty_cache()
        assert a.memory_reserved() == 0
