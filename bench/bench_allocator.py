"""µs per malloc+free pair on the simulated device, against a bare Python free-list.

    python bench/bench_allocator.py            # full run (about a minute)
    python bench/bench_allocator.py --quick    # smoke run (a few seconds)

Every configuration runs in the same process on the same patterns. Each figure is the median of
several runs; each run times many pairs with ``time.perf_counter_ns`` and divides.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jupyter_gpumem import CachingAllocator, SimulatedDevice

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

Malloc = Callable[..., int]
Free = Callable[[int], None]


class FreeList:
    """The bare minimum a caching allocator does: round, then reuse a freed block of that size."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.device = device
        self.cache: dict[int, list[int]] = {}
        self.sizes: dict[int, int] = {}

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        size = (nbytes + 511) & ~511
        blocks = self.cache.get(size)
        ptr = blocks.pop() if blocks else self.device.malloc(size, stream)
        self.sizes[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        size = self.sizes.pop(ptr)
        blocks = self.cache.get(size)
        if blocks is None:
            self.cache[size] = [ptr]
        else:
            blocks.append(ptr)


def run_single(malloc: Malloc, free: Free, size: int, pairs: int) -> int:
    """Nanoseconds for ``pairs`` malloc+free pairs of one size."""
    t0 = time.perf_counter_ns()
    for _ in range(pairs):
        free(malloc(size))
    return time.perf_counter_ns() - t0


MIXED = [512, 4 * KiB, 1000, 256 * KiB, 3 * MiB, 64 * KiB, 16 * MiB, 2 * KiB]


def run_mixed(malloc: Malloc, free: Free, _size: int, pairs: int) -> int:
    """Eight live blocks of mixed sizes at a time, freed oldest first, ``pairs`` pairs in all."""
    window = len(MIXED)
    rounds = max(1, pairs // window)
    t0 = time.perf_counter_ns()
    for _ in range(rounds):
        ptrs = [malloc(s) for s in MIXED]
        for p in ptrs:
            free(p)
    return time.perf_counter_ns() - t0


PATTERNS: list[tuple[str, int, Callable[[Malloc, Free, int, int], int]]] = [
    ("512 B", 512, run_single),
    ("4 KiB", 4 * KiB, run_single),
    ("1 MiB", MiB, run_single),
    ("16 MiB", 16 * MiB, run_single),
    ("mixed", 0, run_mixed),
]


def make(kind: str) -> tuple[Malloc, Free]:
    device = SimulatedDevice(64 * GiB)
    if kind == "free-list":
        fl = FreeList(device)
        return fl.malloc, fl.free
    a = CachingAllocator(device)
    if kind == "history":
        a.record_history(stacks=False, max_entries=100_000)
    elif kind == "stacks":
        a.record_history(stacks=True, max_entries=100_000)
    return a.malloc, a.free


KINDS = ["free-list", "stats", "history", "stacks"]
LABELS = {"free-list": "bare free-list", "stats": "stats only", "history": "history",
          "stacks": "history+stacks"}


def measure(kind: str, pattern: Callable[[Malloc, Free, int, int], int], size: int, pairs: int,
            runs: int) -> float:
    """Median µs per pair over ``runs`` runs, after one warm-up run that fills the cache."""
    malloc, free = make(kind)
    per_pair = []
    pattern(malloc, free, size, min(pairs, 1000))
    for _ in range(runs):
        n = pairs if pattern is run_single else max(1, pairs // len(MIXED)) * len(MIXED)
        per_pair.append(pattern(malloc, free, size, pairs) / n / 1000)
    return statistics.median(per_pair)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument("--pairs", type=int, help="malloc+free pairs per run")
    parser.add_argument("--runs", type=int, help="runs per figure (the median is shown)")
    args = parser.parse_args(argv)
    pairs = args.pairs or (2_000 if args.quick else 50_000)
    runs = args.runs or (3 if args.quick else 7)
    probe = CachingAllocator(SimulatedDevice(GiB))
    core = "C core" if getattr(probe, "native", False) else "Python core"
    print(f"jupyter_gpumem allocator bench: simulated device, {core}, Python "
          f"{sys.version.split()[0]}, {pairs} pairs per run, median of {runs} runs")
    print("µs per malloc+free pair (ratio to the bare free-list)")
    header = f"{'pattern':<8}" + "".join(f"{LABELS[k]:>22}" for k in KINDS)
    print(header)
    print("-" * len(header))
    for name, size, pattern in PATTERNS:
        base = 0.0
        cells = []
        for kind in KINDS:
            us = measure(kind, pattern, size, pairs, runs)
            if kind == "free-list":
                base = us
                cells.append(f"{us:8.3f}")
            else:
                cells.append(f"{us:8.3f} ({us / base:5.2f}x)")
        print(f"{name:<8}" + "".join(f"{c:>22}" for c in cells))
    if getattr(probe, "native", False):
        torch_entry_points(pairs, runs)
    return 0


def torch_entry_points(pairs: int, runs: int) -> None:
    """PyTorch's path: alloc+free through the C entry points, timed in a C loop (no Python per
    pair), with the GIL released (autograd's threads) and held (an op run from Python)."""
    from jupyter_gpumem.engine import _native

    print("PyTorch's entry points (csrc/torch.c), µs per alloc+free pair timed in C, stats only")
    print(f"{'pattern':<8}{'no GIL':>22}{'GIL held':>22}")
    for name, size, pattern in PATTERNS:
        if pattern is not run_single:
            continue
        a = CachingAllocator(SimulatedDevice(64 * GiB), native=True)
        _native.torch_bind(0, a.native_core)
        cells = []
        for release in (True, False):
            _native.torch_time_pairs(size, 0, min(pairs, 1000), 0, release)
            ns = [_native.torch_time_pairs(size, 0, pairs * 10, 0, release) for _ in range(runs)]
            cells.append(f"{statistics.median(ns) / (pairs * 10) / 1000:8.3f}")
        _native.torch_bind(0, None)
        print(f"{name:<8}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    raise SystemExit(main())
