"""µs per ``cupy.empty(n)`` + ``del`` on a real GPU: CuPy's MemoryPool, ours, and PyTorch.

All in one run, each configuration timed the same way: rounds of a tight loop, the
configurations taking turns within each round, the median over rounds reported, with the ratios
the issue asks for:

- ours (stats only) / CuPy's MemoryPool       target <= 1.10 at every size
- ours (history + stacks) / PyTorch recording  target <= 0.70

"PFA floor" is a bare Python free-list behind CuPy's PythonFunctionAllocator: what any allocator
plugged in that way costs before it does any work.

Usage: python bench/bench_gpu.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

SIZES = [("512 B", 512), ("4 KiB", 4096), ("1 MiB", 1 << 20), ("16 MiB", 16 << 20)]


def _time(fn: Callable[[], None], loops: int, repeats: int) -> float:
    """Median µs per call of ``fn`` over ``repeats`` runs of ``loops`` calls."""
    fn()
    runs = []
    for _ in range(repeats):
        gc.disable()
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        t1 = time.perf_counter_ns()
        gc.enable()
        runs.append((t1 - t0) / loops / 1000)
    return statistics.median(runs)


def _cupy_case(cp, n: int) -> Callable[[], None]:
    dtype = cp.uint8

    def step() -> None:
        x = cp.empty(n, dtype=dtype)
        del x

    return step


def _torch_case(torch, n: int) -> Callable[[], None]:
    def step() -> None:
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        del x

    return step


def _bare_free_list(cp):
    """The floor of CuPy's PythonFunctionAllocator path: a Python free-list, no policy, no stats."""
    from cupy.cuda.memory import PythonFunctionAllocator

    cached: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}

    def malloc(size: int, device_id: int) -> int:
        rounded = (size + 511) // 512 * 512
        free = cached.get(rounded)
        ptr = free.pop() if free else cp.cuda.runtime.malloc(rounded)
        sizes[ptr] = rounded
        return ptr

    def release(ptr: int, device_id: int) -> None:
        cached.setdefault(sizes.pop(ptr), []).append(ptr)

    def close() -> None:
        for ptrs in cached.values():
            for ptr in ptrs:
                cp.cuda.runtime.free(ptr)
        cached.clear()

    return PythonFunctionAllocator(malloc, release), close


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the table here too")
    args = parser.parse_args()
    loops, repeats = (2_000, 3) if args.quick else (10_000, 15)

    import cupy as cp

    import jupyter_gpumem as gm
    from jupyter_gpumem.runtime import registry

    try:
        import torch

        have_torch = torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False

    a = registry.get_allocator(0)
    bare, close_bare = _bare_free_list(cp)
    pool = cp.cuda.MemoryPool()

    def use_ours(history: bool, stacks: bool) -> Callable[[], None]:
        def setup() -> None:
            gm.install()
            if history:
                a.record_history(True, stacks=stacks, max_entries=100_000, clear=True)
        return setup

    def leave_ours() -> None:
        a.record_history(False)
        gm.uninstall()

    def cupy_with(allocator: Any) -> Callable[[], None]:
        return lambda: cp.cuda.set_allocator(allocator)

    # (name, setup, teardown, is_torch): timed in turn, round after round, so drift in the
    # machine's speed hits every configuration alike.
    configs: list[tuple[str, Callable[[], None], Callable[[], None], bool]] = [
        ("cupy_pool", cupy_with(pool.malloc), cupy_with(None), False),
        ("floor", cupy_with(bare.malloc), cupy_with(None), False),
        ("ours", use_ours(False, False), leave_ours, False),
        ("ours_history", use_ours(True, False), leave_ours, False),
        ("ours_stacks", use_ours(True, True), leave_ours, False),
    ]
    if have_torch:
        assert torch is not None
        configs += [
            ("torch", lambda: None, lambda: None, True),
            ("torch_history",
             lambda: torch.cuda.memory._record_memory_history(max_entries=100_000),
             lambda: torch.cuda.memory._record_memory_history(enabled=None), True),
        ]

    rows: dict[str, dict[str, float]] = {}
    mins: dict[str, dict[str, float]] = {}
    for label, n in SIZES:
        samples: dict[str, list[float]] = {name: [] for name, *_ in configs}
        for _ in range(repeats):
            for name, setup, teardown, is_torch in configs:
                setup()
                step = _torch_case(torch, n) if is_torch else _cupy_case(cp, n)
                samples[name].append(_time(step, loops, 1))
                teardown()
        rows[label] = {k: statistics.median(v) for k, v in samples.items()}
        mins[label] = {k: min(v) for k, v in samples.items()}
    close_bare()
    pool.free_all_blocks()
    a.empty_cache()
    if have_torch:
        assert torch is not None
        torch.cuda.empty_cache()

    core = "C" if registry.get_allocator(0).native else "Python"
    print(f"µs per empty(n)+del on {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"median of {repeats}×{loops}; jupyter_gpumem {core} core; cupy {cp.__version__}"
          + (f"; torch {torch.__version__}" if have_torch and torch is not None else ""))
    head = (f"{'size':>7} | {'CuPy pool':>9} | {'PFA floor':>9} | {'ours':>6} {'ratio':>6} | "
            f"{'+hist':>6} | {'+stacks':>7} | {'torch':>6} | {'torch+rec':>9} | {'stacks/rec':>10}")
    print(head)
    print("-" * len(head))
    worst = 0.0
    best_rec = 0.0
    for label, row in rows.items():
        ratio = row["ours"] / row["cupy_pool"]
        worst = max(worst, ratio)
        torch_cells = "      - |         - |          -"
        if "torch" in row:
            rec = row["ours_stacks"] / row["torch_history"]
            best_rec = max(best_rec, rec)
            torch_cells = (f"{row['torch']:6.2f} | {row['torch_history']:9.2f} | "
                           f"{rec:9.2f}x")
        print(f"{label:>7} | {row['cupy_pool']:9.2f} | {row['floor']:9.2f} | "
              f"{row['ours']:6.2f} {ratio:5.2f}x | "
              f"{row['ours_history']:6.2f} | {row['ours_stacks']:7.2f} | {torch_cells}")
    print(f"worst ours/CuPy-pool ratio: {worst:.2f}x (target <= 1.10)")
    if best_rec:
        print(f"worst ours-with-stacks / torch-with-recorder: {best_rec:.2f}x (target <= 0.70)")
    print("min over rounds, ours/CuPy-pool: " + ", ".join(
        f"{label} {m['ours'] / m['cupy_pool']:.2f}x" for label, m in mins.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"core": core, "median": rows, "min": mins}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
