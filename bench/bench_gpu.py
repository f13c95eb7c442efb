"""µs per ``cupy.empty(n)`` + ``del`` on a real GPU: CuPy's MemoryPool, ours, and PyTorch.

All in one run, each configuration timed the same way (median of several repeats of a tight
loop), with the ratios the issue asks for:

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
    loops, repeats = (2_000, 3) if args.quick else (20_000, 7)

    import cupy as cp

    import jupyter_gpumem as gm
    from jupyter_gpumem import _runtime

    try:
        import torch

        have_torch = torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False

    rows: dict[str, dict[str, float]] = {}
    for label, n in SIZES:
        row = rows.setdefault(label, {})
        cp.cuda.set_allocator(cp.cuda.MemoryPool().malloc)
        row["cupy_pool"] = _time(_cupy_case(cp, n), loops, repeats)
        bare, close = _bare_free_list(cp)
        cp.cuda.set_allocator(bare.malloc)
        row["floor"] = _time(_cupy_case(cp, n), loops, repeats)
        cp.cuda.set_allocator(None)
        close()

        gm.install()
        a = _runtime.get_allocator(0)
        row["ours"] = _time(_cupy_case(cp, n), loops, repeats)
        a.record_history(True, stacks=False, max_entries=100_000)
        row["ours_history"] = _time(_cupy_case(cp, n), loops, repeats)
        a.record_history(True, stacks=True, max_entries=100_000, clear=True)
        row["ours_stacks"] = _time(_cupy_case(cp, n), loops, repeats)
        a.record_history(False)
        gm.uninstall()
        a.empty_cache()

        if have_torch:
            assert torch is not None
            row["torch"] = _time(_torch_case(torch, n), loops, repeats)
            torch.cuda.memory._record_memory_history(max_entries=100_000)
            row["torch_history"] = _time(_torch_case(torch, n), loops, repeats)
            torch.cuda.memory._record_memory_history(enabled=None)
            torch.cuda.empty_cache()

    core = "C" if _runtime.get_allocator(0).native else "Python"
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"core": core, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
