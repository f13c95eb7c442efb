"""Random recorded programs for the faithful-replay property (``test_replay_faithful``) and
``bench/bench_replay_faithful.py``: seeded, so a failing seed can be rerun alone.

A program runs on a small simulated device under a random config (expandable segments,
max_split_size, roundup divisions, a memory fraction, garbage collection), with empty_cache
calls, requests that fail (probes larger than the device) and the retry ladder; history starts
at a random op (at 0 under garbage collection: Note [Ages before the trace] in
``whatif.replay``), so a trace usually starts from a layout with holes in its expandable
segments. ``fail_at`` also makes the device refuse calls now and then (a failed map or malloc
that the capacity does not explain).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.data.sizes import MiB
from jupyter_gpumem.devices.simulated import SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.oom import OutOfMemoryError

Op = tuple[Any, ...]


@dataclass
class Recorded:
    """One program, as run and recorded."""

    seed: int
    ops: list[Op]
    config: AllocatorConfig
    capacity: int
    start: int  # the op history starts at
    allocator: CachingAllocator

    def outcome(self) -> tuple[int, ...]:
        """What the replay must give back: peak reserved and allocated bytes, segments at the
        end and at the peak, retries and OOMs (all since history started)."""
        s = self.allocator.stats
        return (s.reserved_bytes.all.peak, s.allocated_bytes.all.peak, s.segment.all.current,
                s.segment.all.peak, s.num_alloc_retries, s.num_ooms)


def random_ops(rng: random.Random, n: int, fails: bool = False) -> list[Op]:
    ops: list[Op] = []
    slots: list[int] = []
    for k in range(n):
        choice = rng.choice("aaaaffffep" + ("x" if fails else ""))
        stream = rng.choice([0, 0, 0, 7])
        if choice == "a":
            r = rng.random()
            size = (rng.randint(1, MiB) if r < 0.3 else rng.randint(MiB + 1, 10 * MiB)
                    if r < 0.6 else rng.randint(10 * MiB, 120 * MiB))
            ops.append(("alloc", k, size, stream))
            slots.append(k)
        elif choice == "f" and slots:
            ops.append(("free", slots.pop(rng.randrange(len(slots)))))
        elif choice == "e":
            ops.append(("empty_cache",))
        elif choice == "p":
            ops.append(("probe", k, rng.randint(40 * MiB, 400 * MiB), stream))
        elif choice == "x":
            ops.append(("fail", rng.choice([1, 1, 2])))
    return ops


def random_config(rng: random.Random) -> AllocatorConfig:
    while True:
        try:
            return AllocatorConfig(
                max_split_size_mb=rng.choice([None, None, 21, 32, 64]),
                roundup_power2_divisions=rng.choice([None, None, 2, 4, 8]),
                per_process_memory_fraction=rng.choice([None, None, 0.5, 0.75, 0.9]),
                garbage_collection_threshold=rng.choice([None, None, 0.4, 0.8]),
                expandable_segments=rng.choice([False, True]))
        except ValueError:  # garbage collection needs a fraction
            continue


def run_ops(ops: list[Op], config: AllocatorConfig, capacity: int, native: bool,
            start: int) -> CachingAllocator:
    """Run ``ops``; history, peaks and counters start at op ``start``."""
    a = CachingAllocator(SimulatedDevice(capacity), config, native=native)
    device = a.device
    assert isinstance(device, SimulatedDevice)
    live: dict[int, int] = {}
    for k, op in enumerate(ops):
        if k == start:
            _start_history(a)
        if op[0] in ("alloc", "probe"):
            try:
                ptr = a.malloc(op[2], op[3])
            except OutOfMemoryError:
                ptr = 0
            if op[0] == "alloc" and ptr:
                live[op[1]] = ptr
            elif ptr:
                a.free(ptr)
        elif op[0] == "free":
            ptr = live.pop(op[1], 0)
            if ptr:
                a.free(ptr)
        elif op[0] == "fail":
            device.fail_next(op[1])
        else:
            a.empty_cache()
    if start >= len(ops):
        _start_history(a)
    return a


def _start_history(a: CachingAllocator) -> None:
    a.record_history(stacks=False, max_entries=1 << 20)
    a.reset_peak_memory_stats()
    a.reset_accumulated_memory_stats()


def recorded_program(seed: int, native: bool, *, fails: bool = False) -> Recorded:
    """Program ``seed``, run and recorded on the C core (``native``) or the Python one."""
    rng = random.Random(seed)
    ops = random_ops(rng, rng.randint(1, 80), fails)
    config = random_config(rng)
    capacity = rng.choice([256, 512, 1024]) * MiB
    start = 0 if config.garbage_collection_threshold else rng.randint(0, len(ops))
    return Recorded(seed, ops, config, capacity, start,
                    run_ops(ops, config, capacity, native, start))
