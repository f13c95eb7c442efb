"""CuPy on the simulated device: one line saying that CuPy needs a GPU and what to do instead.

This machine has no GPU, so ``cupy.zeros`` fails here as on any machine without one (CuPy
raises ``CUDARuntimeError``); on a machine with a GPU these tests skip."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_gpumem.notebook.extension import get_extension

cupy = pytest.importorskip("cupy")


def _cupy_fails() -> bool:
    try:
        cupy.zeros(1)
    except Exception as exc:  # CUDARuntimeError
        return type(exc).__name__ == "CUDARuntimeError"
    return False


pytestmark = pytest.mark.skipif(not _cupy_fails(), reason="CuPy works here: there is a GPU")

FIX = "jupyter_gpumem.caching_allocator_alloc("


@pytest.fixture
def loaded(shell, run, sim):
    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    get_extension(shell).settings.live_view = False
    return shell


def text_of(out) -> str:
    return "\n".join([out.stdout, out.stderr,
                      *(o.data.get("text/plain", "") for o in out.outputs)])


def test_traced_cupy_cell_says_one_line(loaded, run, sim) -> None:
    result, out = run("%%gpumem_trace -o t\nimport cupy\nx = cupy.zeros(10)")
    error = result.error_in_exec
    assert isinstance(error, UsageError)
    assert str(error).startswith("CuPy needs a GPU (cudaErrorInsufficientDriver)")
    assert FIX in str(error) and "\n" not in str(error)
    everything = text_of(out)
    assert "Traceback" not in everything and "cupy_backends" not in everything
    assert len(everything.strip().splitlines()) <= 6, everything
    # the trace says what happened, not "turn history on": history was on, nothing allocated
    t = loaded.user_ns["t"]
    assert "turn history on" not in t.text()
    assert "raised CUDARuntimeError before allocating anything through jupyter_gpumem" \
        in t.text()
    assert "image/png" not in out.outputs[0].data  # an empty picture says nothing
    drawn = [x.get_text() for x in t.figure().axes[0].texts]
    assert drawn == [t.nothing_recorded()]


def test_plain_cupy_cell_gets_the_hint_under_its_traceback(loaded, run, sim) -> None:
    result, out = run("import cupy\nx = cupy.zeros(10)")
    assert type(result.error_in_exec).__name__ == "CUDARuntimeError"  # the user's error stays
    last = text_of(out).strip().splitlines()[-1]
    assert last.startswith("jupyter_gpumem: CuPy needs a GPU (cudaErrorInsufficientDriver)")
    assert FIX in last


def test_no_hint_for_other_errors_or_off_the_simulated_device(loaded, run, sim) -> None:
    _, out = run("1/0")
    assert "CuPy needs a GPU" not in text_of(out)
    from jupyter_gpumem.notebook.no_gpu import no_gpu_hint

    err = cupy.cuda.runtime.CUDARuntimeError(35)  # cudaErrorInsufficientDriver
    assert no_gpu_hint(err) is not None
    assert no_gpu_hint(err, backend="cuda") is None  # there, loading said there is no GPU
    assert no_gpu_hint(cupy.cuda.runtime.CUDARuntimeError(2)) is None  # out of memory
    assert no_gpu_hint(RuntimeError("cudaErrorInsufficientDriver")) is None
