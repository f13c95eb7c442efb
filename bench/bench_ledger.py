"""µs the per-cell ledger adds to a notebook cell: ``start_cell`` + ``end_cell`` on the simulated
device, with 10 / 1,000 / 10,000 blocks live before the cell and a user namespace of 1,000
variables.

    python bench/bench_ledger.py            # full run (about half a minute)
    python bench/bench_ledger.py --quick    # smoke run

Three kinds of cell, each timed without the work the cell itself does (its mallocs and frees):

- ``nothing left``: the cell allocates and frees one block; no holder search runs;
- ``1 block left``: the cell keeps one 64 MiB block in a variable: the holder search runs;
- ``20 blocks left``: the cell appends 20 blocks to a list (the leak-in-a-loop cell).

The namespace is 1,000 variables as a notebook has them: 680 numbers and strings, 200 lists of
50 numbers, 90 dicts of 10 entries, 10 objects with attributes, 10 functions with closures, and
10 lists of 100 arrays (objects with ``.data.ptr``) that hold the live blocks. The holder
search is the reference-chain search (``data.reach``): it walks all of that, and the user's
modules and the last traceback, within its budget (50 ms). Each figure is the median of several
runs of many cells; ``worst`` is the slowest single cell of a kind, and a last column counts
cells whose search ran out of budget (the targets: a cell with nothing left ≤ 0.5 ms, with 20
blocks left ≤ 5 ms, none cut). A last line times the holder search alone over that namespace.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # cupy_like

from cupy_like import Array

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.holders import holder_groups
from jupyter_gpumem.notebook.ledger import Ledger
from jupyter_gpumem.sources.cupy import CupySource

MiB = 1 << 20
GiB = 1 << 30


class _Config:
    """An object with attributes, as a notebook's model or config is."""

    def __init__(self, i: int) -> None:
        self.name = f"run {i}"
        self.sizes = list(range(20))
        self.options = {"lr": 0.1 * i, "steps": i}


def _closure(i: int) -> Any:
    scale = float(i)
    return lambda v: v * scale


def namespace(live: list[int]) -> dict[str, Any]:
    """1,000 variables; the live blocks are held by 10 lists of arrays (1,000 looked at)."""
    ns: dict[str, Any] = {}
    for i in range(680):
        ns[f"v{i}"] = i * 1.5 if i % 2 else f"text {i}"
    for i in range(10):
        ns[f"config{i}"] = _Config(i)
        ns[f"fn{i}"] = _closure(i)
    for i in range(200):
        ns[f"row{i}"] = list(range(50))
    for i in range(90):
        ns[f"conf{i}"] = {f"k{j}": j for j in range(10)}
    for i in range(10):
        ns[f"arrays{i}"] = [Array(p, 512) for p in live[i * 100:(i + 1) * 100]]
    return ns


@dataclass(frozen=True)
class Figure:
    median_us: float  # of ledger work per cell (the median of the runs' means)
    worst_us: float  # the slowest single cell
    cut: int  # cells whose holder search ran out of budget


def time_cells(live_blocks: int, kind: str, *, history: bool, cells: int, runs: int) -> Figure:
    """µs of ledger work per cell (median of ``runs``), the worst cell, and the cut searches."""
    allocator = CachingAllocator(SimulatedDevice(80 * GiB))
    if history:
        allocator.record_history(True, stacks=True, max_entries=0)  # the extension's default
    live = [allocator.malloc(512) for _ in range(live_blocks)]
    ns = namespace(live)
    ours = [CupySource(allocator)]  # the ledger's one source: our allocator
    ledger = Ledger(keep_states=200, sources_for=lambda: ours, namespace=lambda: ns)
    source = "import cupy as cp\nlosses.append(cp.ones(1 << 24))"
    results = []
    worst = 0
    cut = 0
    for _ in range(runs):
        spent = 0
        for cell in range(cells):
            t0 = time.perf_counter_ns()
            ledger.start_cell(cell, source)
            one = time.perf_counter_ns() - t0
            # Every other cell asks for 512 B less: the block the previous cell kept (freed
            # between cells here) comes back at the same address, and an identical block would
            # pass for one kept from before the cell (see Note [Naming the cause]).
            size = 64 * MiB - 512 * (cell % 2)
            if kind == "nothing left":
                allocator.free(allocator.malloc(size))
                kept: list[int] = []
            elif kind == "1 block left":
                kept = [allocator.malloc(size)]
                ns["x"] = Array(kept[0], size)
            else:
                kept = [allocator.malloc(size) for _ in range(20)]
                ns["losses"] = [Array(p, size) for p in kept]
            t0 = time.perf_counter_ns()
            ledger.end_cell()
            one += time.perf_counter_ns() - t0
            spent += one
            worst = max(worst, one)
            cut += ledger.causes[-1].search_cut is not None
            for p in kept:
                allocator.free(p)
            ns.pop("x", None)
            ns.pop("losses", None)
        results.append(spent / cells / 1000)
        ledger.clear()
    for p in live:
        allocator.free(p)
    return Figure(statistics.median(results), worst / 1000, cut)


def time_search(new_blocks: int, *, runs: int, repeat: int = 50) -> float:
    """µs of the holder search alone over the namespace, for ``new_blocks`` new blocks."""
    live = [0x10000000 + i * 4096 for i in range(1_000)]
    ns = namespace(live)
    kept = [(0x7000000000 + i * 64 * MiB, 64 * MiB) for i in range(new_blocks)]
    ns["losses"] = [Array(a, 64 * MiB) for a, _ in kept]
    results = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        for _ in range(repeat):
            holder_groups(ns, kept)
        results.append((time.perf_counter_ns() - t0) / repeat / 1000)
    return statistics.median(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    runs = 3 if args.quick else 5
    probe = CachingAllocator(SimulatedDevice(GiB))
    core = "C core" if getattr(probe, "native", False) else "Python core"
    print(f"jupyter_gpumem ledger bench: simulated device, {core}, Python "
          f"{sys.version.split()[0]}, namespace of 1,000 variables, median of {runs} runs")
    print("µs of ledger work per cell (start_cell + end_cell): median / worst cell")
    kinds = ("nothing left", "1 block left", "20 blocks left")
    print(f"{'live blocks':>11}  {'history':<13}" + "".join(f"{k:>20}" for k in kinds)
          + f"{'searches cut':>14}")
    for live_blocks in (10, 1_000, 10_000):
        cells = max(5, 20_000 // (live_blocks + 100)) if args.quick else max(
            20, 200_000 // (live_blocks + 100))
        for history in (False, True):
            figures = [time_cells(live_blocks, kind, history=history, cells=cells, runs=runs)
                       for kind in kinds]
            label = "state+stacks" if history else "off"
            print(f"{live_blocks:>11}  {label:<13}"
                  + "".join(f"{f'{f.median_us:.0f} / {f.worst_us:.0f}':>20}" for f in figures)
                  + f"{sum(f.cut for f in figures):>14}")
    print("µs of the holder search alone (what a cell that left blocks behind adds): "
          + ", ".join(f"{n} new block{'s' if n > 1 else ''} {time_search(n, runs=runs):.0f}"
                      for n in (1, 20, 1_000)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
