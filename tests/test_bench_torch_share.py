"""``bench/bench_torch_share.py`` and its child ``tests/gpu/torch_share_child.py`` without a GPU:
the report it prints from its results, and the child's workloads that need no device."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30


def test_the_report_says_each_figure() -> None:
    bench = load_script(ROOT / "bench" / "bench_torch_share.py")
    results = {
        "shim": {"torch": "2.11.0+cu130", "kind": "c10", "origin": "compiled now",
                 "compile_seconds": 2.25, "seconds": 2.5, "reasons": []},
        "empty": {"ours": {"torch_empty_us": 4.5, "cupy_empty_us": 2.3},
                  "native": {"torch_empty_us": 5.0, "cupy_empty_us": 2.2},
                  "cupy": {"torch_empty_us": 5.0, "cupy_empty_us": 2.0}},
        "mixed": {"two": {"budget": 6 * GiB, "oom_at": "PyTorch training step, iteration 1",
                          "iterations": 0, "peak_reserved": {"pytorch": 2 * GiB, "ours": 4 * GiB}},
                  "one": {"budget": 6 * GiB, "oom_at": None, "iterations": 3,
                          "peak_reserved": {"one_cache": 4 * GiB}}},
    }
    assert bench.report(results).splitlines() == [
        "cached torch.empty(1 << 20) + del: ours 4.500 µs, PyTorch's own 5.000 µs: 0.90x "
        "(target <= 1.0x)",
        "cached cupy.empty(4 MiB) + del: ours 2.300 µs (shared with PyTorch), ours 2.200 µs "
        "(CuPy alone), CuPy's MemoryPool 2.000 µs",
        "c10 shim for PyTorch 2.11.0+cu130: c10, compiled now, compiled in 2.25 s (2.50 s with "
        "loading)",
        "mixed workload, two caches (PyTorch's + ours under CuPy), budget 6.0 GiB: out of "
        "memory at PyTorch training step, iteration 1; peak reserved pytorch 2.00 GiB, ours "
        "4.00 GiB",
        "mixed workload, one shared cache, budget 6.0 GiB: fits (3 iterations); peak reserved "
        "one_cache 4.00 GiB",
    ]


def test_the_bench_and_its_child_start_without_a_gpu() -> None:
    for script in (ROOT / "bench" / "bench_torch_share.py",
                   ROOT / "tests" / "gpu" / "torch_share_child.py"):
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_the_mixed_workload_fits_one_cache_and_not_two_by_its_sizes() -> None:
    child = load_script(ROOT / "tests" / "gpu" / "torch_share_child.py")
    # each phase peaks near PHASE; a budget of 1.5 phases holds one phase at a time, not the
    # phase one library keeps cached plus the next library's phase
    assert child.PHASE < child.BUDGET < 2 * child.PHASE
    assert GiB <= child.BUDGET - child.PHASE  # room for workspaces, weights, rounding
    assert set(child.SUBSET) >= {"advanced_indexing", "gradcheck", "streams_wait", "many_blocks"}
