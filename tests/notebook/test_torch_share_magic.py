"""``%gpumem torch [share]``, ``GpuMem.share_torch`` and every view over one cache for CuPy and
PyTorch, in a real IPython shell on a simulated device.

PyTorch is ``fake_torch.FakeTorch``, put in ``sys.modules`` as ``torch``; ``install_torch`` is
pointed at the simulated device's allocator (it would take CUDA's), the rest is as a user has
it: the magics, the footer, the holder search, the OOM panel, the sources.
"""

from __future__ import annotations

import gc
import os
import sys

import pytest
from fake_torch import FakeTorch

from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.notebook import extension
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.torch_cmd import UNLOAD_TEXT
from jupyter_gpumem.runtime import registry, torch_share
from jupyter_gpumem.runtime.torch_shim import ShimChoice

pytestmark = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")
MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture
def torch(monkeypatch):
    """A fake PyTorch importable as ``torch``; ``install_torch`` shares the simulated device's
    allocator with it (no shim: its failing requests are safe, and it raises as the c10 shim
    does)."""
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)

    def install(device=None, *, unchecked_oom=False):
        return torch_share.share(fake, allocator_for=lambda i: registry.simulated_allocators()[i],
                                 device=0, unchecked_oom=True,
                                 shims=lambda *_: ShimChoice(None, ["no shim in this test"]))

    monkeypatch.setattr(torch_share, "install_torch", install)
    yield fake
    gc.collect()
    torch_share._reset_for_tests(fake)


def test_torch_share_then_every_view_reads_one_cache(gm, run, torch) -> None:
    _, out = run("%gpumem torch")
    assert "PyTorch uses its own allocator; `%gpumem torch share`" in out.stdout
    _, out = run("%gpumem torch share")
    assert "PyTorch 2.99.0+fake allocates from jupyter_gpumem's cache, one with CuPy's arrays" \
        in out.stdout
    assert "(devices bound: 0)" in out.stdout
    _, out = run("%gpumem source both")
    assert out.stdout.strip() == ("gpumem: the views read our allocator (CuPy and PyTorch, one "
                                  "cache)")
    _, out = run("%gpumem")
    assert "one cache for CuPy and PyTorch" not in out.stdout  # the simulated device's line
    run("import torch\nfrom cupy_like import Array\nimport jupyter_gpumem as g\n%gpumem auto on")
    _, out = run("t = torch.empty(3 << 20)\narr = Array(g.caching_allocator_alloc(2 << 20), "
                 "2 << 20)")
    footer = out.stdout[out.stdout.rfind("gpumem ["):]
    assert "Δallocated +5.0 MiB" in footer
    assert "held by t (3.0 MiB), arr (2.0 MiB)" in footer  # a tensor and an array, one line
    _, out = run("%gpumem stats --json")
    assert '"allocated_bytes.all.current": 5242880' in out.stdout
    assert torch.cuda.memory_allocated() == 5 * MiB  # PyTorch's own function: the same books
    run("%gpumem auto off")
    result, _ = run("%%gpumem_trace -o tr --no-plot\nu = torch.empty(8 << 20)\n"
                    "v = Array(g.caching_allocator_alloc(4 << 20), 4 << 20)")
    assert result.success
    tr = gm.shell.user_ns["tr"]
    assert {"u", "v", "t", "arr"} <= {n for names in tr.holders.values() for n in names}
    replayed = gm.shell.user_ns["g"].replay(tr.snapshot)  # the traced cell, tensors and arrays
    assert replayed.num_ooms == 0 and replayed.peak_allocated >= 12 * MiB
    run("g.caching_allocator_delete(arr.data.ptr)\ng.caching_allocator_delete(v.data.ptr)\n"
        "del t, arr, u, v, tr")


def test_pytorchs_out_of_memory_error_gets_our_panel(gm, run, torch) -> None:
    run("%gpumem torch share\nimport torch\nkeep = torch.empty(200 << 20)")
    result, out = run("big = torch.empty(2 << 30)")
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    assert "jupyter_gpumem: out of memory on device 0" in out.stdout  # PyTorch's error, ours
    panel = get_extension(gm.shell).last_oom
    assert panel is not None and panel.report is not None and panel.report.requested == 2 * GiB
    assert "GPU out of memory in cell [" in panel.text()
    assert "← keep (200 MiB)" in panel.text()  # the tensor holding the memory is named
    result, _ = run("t = torch.empty(1 << 20)\ndel t, keep")  # the process goes on
    assert result.success


def test_cudnn_benchmarks_error_is_explained(gm, run, torch) -> None:
    run("%gpumem torch share")
    _, out = run("raise RuntimeError('CUDAPluggableAllocator does not yet support cacheInfo. "
                 "If you need it, please file an issue describing your use case.')")
    assert "set torch.backends.cudnn.benchmark = False while PyTorch shares" in out.stdout


def test_unload_says_pytorch_keeps_the_cache(gm, run, torch) -> None:
    run("%gpumem torch share")
    _, out = run("%unload_ext jupyter_gpumem")
    assert UNLOAD_TEXT in out.stdout
    assert torch_share.shared()  # nothing PyTorch holds is given back or freed twice


def test_bad_input_and_too_late(gm, run, torch, monkeypatch) -> None:
    _, out = run("%gpumem torch please")
    assert "torch takes share (or nothing), got 'please'" in out.stderr
    torch.cuda.current_device()  # PyTorch started CUDA
    _, out = run("%gpumem torch")
    assert "has started CUDA: too late to share in this process" in out.stdout
    monkeypatch.undo()  # the real install_torch, on the fake: it is too late
    monkeypatch.setitem(sys.modules, "torch", torch)
    _, out = run("%gpumem torch share")
    assert "too late to share the cache with PyTorch" in out.stderr
    assert not torch_share.shared()


def test_share_torch_on_load(shell, run, sim, torch, monkeypatch) -> None:
    monkeypatch.setattr(extension, "cuda_unavailable_reason", lambda: None)  # "a GPU"
    shell.config.GpuMem.share_torch = True
    shell.config.GpuMem.install_allocator = False
    try:
        _, out = run("%load_ext jupyter_gpumem")
    finally:
        del shell.config.GpuMem.share_torch
        del shell.config.GpuMem.install_allocator
    assert "jupyter_gpumem: PyTorch 2.99.0+fake allocates from jupyter_gpumem's cache" \
        in out.stdout
    assert torch_share.shared()


def test_share_torch_on_load_that_cannot_share_still_loads(shell, run, sim, monkeypatch) -> None:
    monkeypatch.setattr(extension, "cuda_unavailable_reason", lambda: None)

    def refuse(device=None, *, unchecked_oom=False):
        raise torch_share.TorchTooLate(torch_share.TOO_LATE_TEXT.format(why="a test"))

    monkeypatch.setattr(torch_share, "install_torch", refuse)
    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    shell.config.GpuMem.share_torch = True
    shell.config.GpuMem.install_allocator = False
    try:
        result, out = run("%load_ext jupyter_gpumem")
    finally:
        del shell.config.GpuMem.share_torch
        del shell.config.GpuMem.install_allocator
    assert result.success
    assert "jupyter_gpumem: too late to share the cache with PyTorch" in out.stdout
    _, out = run("%gpumem torch")
    assert "PyTorch uses its own allocator" in out.stdout
