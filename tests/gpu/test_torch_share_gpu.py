"""One cache for CuPy and PyTorch on a real GPU (issue 25): each check in a child process of its
own (``torch_share_child.py``), since PyTorch's allocator is chosen once a process.

- ``shared``: one child sharing the cache runs every check that needs it (install with the c10
  shim; a block PyTorch freed serves CuPy and back; torch.cuda's memory functions, snapshots and
  history from our books; a torch.OutOfMemoryError with our report, the process going on;
  autograd's threads, a DataLoader with pin_memory and workers, a side stream; CUDA graphs
  refused; the footer, status, trace, replay and OOM panel over tensors and arrays);
- a training run's losses and the PyTorch subset, bit for bit, ours against PyTorch's own;
- the mixed workload under a budget: two caches run out of memory, one fits (peaks printed);
- interpreter exit with tensors and arrays alive.

The whole set takes about a minute on an H200 (``bench/run_gpu.sh torch``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

CHILD = Path(__file__).resolve().with_name("torch_share_child.py")
ROOT = CHILD.parents[2]
TIMEOUT = 120


@pytest.fixture(scope="module")
def child_env(tmp_path_factory) -> dict[str, str]:
    """The children's environment: this checkout first, one shim cache for all of them (the
    first compiles the c10 shim), deterministic cuBLAS for the bit-for-bit comparisons."""
    cache = os.environ.get("JUPYTER_GPUMEM_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "JUPYTER_GPUMEM_CACHE_DIR": cache,
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONUNBUFFERED": "1"}


def run_child(env: dict[str, str], *args: str) -> tuple[Any, subprocess.CompletedProcess[str]]:
    """The child's RESULT, and the finished process (its output is printed, for the log)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, cwd=str(ROOT), check=False)
    print(f"\n[{' '.join(args)}: exit {done.returncode}, {time.perf_counter() - started:.1f} s]")
    if done.stderr.strip():
        print(done.stderr.strip()[-2000:])
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT "):]) if lines else None
    return result, done


@pytest.fixture(scope="module")
def shared(child_env) -> dict[str, Any]:
    result, done = run_child(child_env, "shared")
    assert result is not None, f"the shared child printed no result (exit {done.returncode})"
    for name, outcome in result.items():
        print(f"{'OK  ' if outcome['ok'] else 'FAIL'} {name}: {outcome['detail']}")
    return result


def expect(shared: dict[str, Any], name: str) -> None:
    outcome = shared.get(name)
    assert outcome is not None, f"check {name!r} did not run: {sorted(shared)}"
    if outcome["detail"].startswith("skipped:"):
        pytest.skip(outcome["detail"])
    assert outcome["ok"], outcome["detail"]


@pytest.mark.parametrize("name", ["install", "one_cache", "invariants"])
def test_pytorch_allocates_from_the_cache_cupy_uses(shared, name) -> None:
    expect(shared, name)


def test_torch_memory_functions_answer_from_our_books(shared) -> None:
    expect(shared, "memory_functions")


def test_our_expandable_segments_serve_tensors_too(shared) -> None:
    expect(shared, "expandable")


def test_snapshot_and_history_of_pytorch_are_ours(shared) -> None:
    expect(shared, "snapshot_history")


def test_out_of_memory_raises_torch_error_with_our_report_and_the_process_goes_on(shared) -> None:
    expect(shared, "oom")


@pytest.mark.parametrize("name", ["autograd_threads", "dataloader", "side_stream"])
def test_threads_and_streams(shared, name) -> None:
    expect(shared, name)


def test_cuda_graph_capture_is_refused_cleanly(shared) -> None:
    expect(shared, "graph")


def test_every_view_covers_tensors_and_arrays(shared) -> None:
    expect(shared, "views")


def test_training_losses_bit_identical(child_env) -> None:
    ours, _ = run_child(child_env, "losses", "ours")
    theirs, _ = run_child(child_env, "losses", "native")
    assert ours is not None and theirs is not None
    print(f"30 losses, last {float.fromhex(ours[-1]):.6f} (ours) {float.fromhex(theirs[-1]):.6f}"
          " (PyTorch's)")
    assert ours == theirs


def test_pytorch_subset_same_under_both_allocators(child_env) -> None:
    ours, _ = run_child(child_env, "subset", "ours")
    theirs, _ = run_child(child_env, "subset", "native")
    assert ours is not None and theirs is not None
    for name in theirs:
        print(f"{'same' if ours.get(name) == theirs[name] else 'DIFFERENT'} {name}: "
              f"{ours.get(name)} | {theirs[name]}")
    errors = {k: v for k, v in {**ours, **theirs}.items() if str(v).startswith("ERROR")}
    assert not errors
    assert ours["gradcheck"] is True
    assert ours == theirs


def test_mixed_workload_two_caches_run_out_one_fits(child_env) -> None:
    two, _ = run_child(child_env, "mixed", "native")
    one, _ = run_child(child_env, "mixed", "ours")
    assert two is not None and one is not None
    gib = 1 << 30
    for label, r in (("two caches (PyTorch's + ours under CuPy)", two),
                     ("one shared cache", one)):
        peaks = ", ".join(f"{k} {v / gib:.2f} GiB" for k, v in r["peak_reserved"].items())
        print(f"{label}: budget {r['budget'] / gib:.1f} GiB; {r['iterations']} iterations; "
              f"out of memory at {r['oom_at']} ({r['error'][:160]}); peak reserved {peaks}; "
              f"sampled combined {r['combined_reserved_peak_sampled'] / gib:.2f} GiB")
    assert two["oom_at"] is not None and two["iterations"] < 3
    assert one["oom_at"] is None and one["iterations"] == 3, one["error"]
    assert one["peak_reserved"]["one_cache"] <= one["budget"]


def test_interpreter_exit_with_tensors_and_arrays_alive(child_env) -> None:
    result, done = run_child(child_env, "exit")
    assert done.returncode == 0, done.stderr[-2000:]
    assert result is not None and result["allocated"] > 0
    assert "counters at exit:" in done.stdout
    for bad in ("Segmentation", "Fatal Python", "core dumped", "Aborted", "terminate called"):
        assert bad not in done.stderr
