"""The magics with real CuPy arrays on a CUDA device (skipped where none is visible)."""

from __future__ import annotations

import pytest

from jupyter_gpumem.notebook.extension import get_extension

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def gpu(shell, run):
    from jupyter_gpumem.runtime import binding

    result, out = run("%load_ext jupyter_gpumem")
    assert result.success, out.stderr
    assert binding.installed()
    get_extension(shell).settings.live_view = False
    run("import cupy as cp")
    yield shell
    run("%unload_ext jupyter_gpumem")
    assert not binding.installed()


def test_ledger_with_cupy_arrays(gpu, run) -> None:
    run("x = cp.ones((3 * (1 << 20) // 4,), dtype=cp.float32)")  # 3 MiB
    row = get_extension(gpu).ledger.rows[-1]
    assert row["allocated_delta"] == 3 * MiB and row["allocs"] == 1
    run("del x")
    assert get_extension(gpu).ledger.rows[-1]["allocated_delta"] == -3 * MiB


def test_trace_finds_the_cupy_variable(gpu, run) -> None:
    result, out = run("%%gpumem_trace -o t --no-plot\ny = cp.zeros((1 << 20,), cp.float32)\n"
                      "tmp = cp.ones((1 << 22,), cp.float32); del tmp")
    assert result.success, out.stderr
    t = gpu.user_ns["t"]
    assert [b.holders for b in t.surviving] == [("y",)]
    assert t.peak_allocated - t.start_allocated == 4 * MiB + 16 * MiB
    run("del y, t")


def test_cupy_oom_explained(gpu, run) -> None:
    run("free, total = cp.cuda.runtime.memGetInfo()")
    result, out = run("z = cp.empty((total * 2,), cp.uint8)")
    import cupy

    assert isinstance(result.error_in_exec, cupy.cuda.memory.OutOfMemoryError)
    assert "GPU out of memory in cell" in out.outputs[-1].data["text/plain"]


def test_summary_and_status(gpu, run) -> None:
    _, out = run("%gpumem")
    assert out.outputs[0].data["text/plain"].startswith("gpumem · cuda device 0")
    result, _ = run("%gpumem summary --full")
    assert result.success
