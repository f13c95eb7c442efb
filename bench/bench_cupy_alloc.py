"""µs per ``cupy.empty(n)`` + ``del`` through the two ways of plugging our core into CuPy.

- ``pfa``: ``PythonFunctionAllocator(malloc, free).malloc``, the binding before ``Hooks.alloc``
  (CuPy makes the memory object and calls our C ``malloc``; ``mem.size`` is the request);
- ``alloc``: ``Hooks.alloc``, what ``install`` uses now (we make the memory object, with
  ``mem.size`` the rounded block size: Note [The size CuPy sees] in engine/csrc/hooks.c);
- ``cupy_pool``: CuPy's MemoryPool, for scale.

The configurations take turns within each round; the median over rounds is reported, with
``alloc - pfa`` in ns. The same core and cache serve both of ours.

Usage: python bench/bench_cupy_alloc.py [--quick] [--json PATH]
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


def _time(fn: Callable[[], None], loops: int) -> float:
    """µs per call of ``fn`` over one run of ``loops`` calls."""
    fn()
    gc.disable()
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        fn()
    t1 = time.perf_counter_ns()
    gc.enable()
    return (t1 - t0) / loops / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the table here too")
    args = parser.parse_args()
    loops, repeats = (2_000, 3) if args.quick else (20_000, 15)

    import cupy as cp
    from cupy.cuda.memory import PythonFunctionAllocator

    from jupyter_gpumem.runtime import binding, registry

    b = binding._binding()
    allocators: dict[str, Any] = {
        "cupy_pool": cp.cuda.MemoryPool().malloc,
        "pfa": PythonFunctionAllocator(b.malloc_fn, b.free_fn).malloc,
        "alloc": b.alloc,
    }
    x = cp.empty(16, dtype=cp.uint8)
    cp.cuda.set_allocator(b.alloc)
    y = cp.empty(16, dtype=cp.uint8)
    cp.cuda.set_allocator(allocators["pfa"])
    z = cp.empty(16, dtype=cp.uint8)
    print(f"mem.size of 16 B: CuPy's pool {x.data.mem.size}, alloc {y.data.mem.size}, "
          f"pfa {z.data.mem.size}")
    del x, y, z

    rows: dict[str, dict[str, float]] = {}
    for label, n in SIZES:
        samples: dict[str, list[float]] = {name: [] for name in allocators}

        def step(n: int = n) -> None:
            x = cp.empty(n, dtype=cp.uint8)
            del x

        for _ in range(repeats):
            for name, allocator in allocators.items():
                cp.cuda.set_allocator(allocator)
                samples[name].append(_time(step, loops))
        rows[label] = {k: statistics.median(v) for k, v in samples.items()}
    cp.cuda.set_allocator()  # CuPy's default pool again
    registry.get_allocator(0).empty_cache()

    core = "C" if registry.get_allocator(0).native else "Python"
    print(f"µs per empty(n)+del, median of {repeats}×{loops}; jupyter_gpumem {core} core; "
          f"cupy {cp.__version__}")
    print(f"{'size':>7} | {'CuPy pool':>9} | {'pfa':>6} | {'alloc':>6} | {'alloc-pfa':>9}")
    for label, row in rows.items():
        delta = (row["alloc"] - row["pfa"]) * 1000
        print(f"{label:>7} | {row['cupy_pool']:9.2f} | {row['pfa']:6.2f} | {row['alloc']:6.2f} | "
              f"{delta:+7.0f}ns")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"core": core, "median": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
