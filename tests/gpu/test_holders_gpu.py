"""Holders by reference chain with real CuPy arrays and PyTorch tensors on a CUDA device: the
footer names every kind of holder a notebook leaks through (skipped where none is visible).

With ``GPUMEM_FOOTER_LOG`` set, every footer these tests see is appended to that file (the
closing notes quote them)."""

from __future__ import annotations

import os

import pytest

from jupyter_gpumem.notebook.extension import get_extension

pytestmark = pytest.mark.gpu
MiB, GiB = 1 << 20, 1 << 30

#: How each library makes ``n`` bytes on the GPU, and how the shell is told to read it.
LIBRARIES = {
    "cupy": ("import cupy as cp\ndef gpu(n):\n    return cp.empty(n, cp.uint8)", ""),
    "torch": ("import torch\ndef gpu(n):\n"
              "    return torch.empty(n, dtype=torch.uint8, device='cuda')",
              "%gpumem source torch"),
}


def footer(out, name: str) -> str:
    """The footer of a cell, written to ``GPUMEM_FOOTER_LOG`` when set."""
    text = out.stdout[out.stdout.rfind("gpumem ["):]
    log = os.environ.get("GPUMEM_FOOTER_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"## {name}\n{text}\n")
    return text


@pytest.fixture(params=sorted(LIBRARIES))
def lib(request, shell, run):
    """The extension loaded, the footer on, and ``gpu(n)`` making n bytes with the library."""
    name = request.param
    before = 0
    if name == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("PyTorch sees no CUDA device")
        before = torch.cuda.memory_allocated()
    result, out = run("%load_ext jupyter_gpumem")
    assert result.success, out.stderr
    get_extension(shell).settings.live_view = False
    make, source = LIBRARIES[name]
    run(f"{make}\n{source}\n%gpumem auto on")
    yield name
    run("%gpumem forget-error\n%reset -f")  # what a failed test left
    run("%unload_ext jupyter_gpumem")
    if name == "torch":  # nothing of the test's is left for the tests after it
        import gc

        gc.collect()
        # PyTorch keeps a cuBLAS workspace per thread that ran a matmul (the forward's and
        # the backward's), through its own allocator, for the process's life
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        assert torch.cuda.memory_allocated() == before


def test_closures_caches_attributes_containers_classes_and_generators(lib, run) -> None:
    run("def make_hook(n):\n    buf = gpu(16 << 20)\n    return lambda: buf")
    _, out = run("hooks = [make_hook(n) for n in range(8)]")
    assert "held by hooks (list of 8 closures, 128 MiB)" in footer(out, f"closures ({lib})")
    _, out = run("_plans = {}\nfor n in (1, 2, 3):\n    _plans[(1024, 1024, n)] = "
                 "gpu(1024 * 1024 * n * 4)")
    assert "held by _plans (dict of 3, 24.0 MiB)" in footer(out, f"an underscore cache ({lib})")
    run("class Model:\n    def __init__(self):\n        self.cache = {}")
    _, out = run("model = Model()\nmodel.cache['k'] = gpu(16 << 20)")
    assert "held by model.cache['k'] (16.0 MiB)" in footer(out, f"an attribute ({lib})")
    _, out = run("state = {'a': {'b': [0, 1, gpu(4 << 20)]}}")
    assert "held by state['a']['b'][2] (4.0 MiB)" in footer(out, f"nested containers ({lib})")
    run("class Registry:\n    kept = []")
    _, out = run("Registry.kept.append(gpu(8 << 20))")
    assert "held by Registry.kept[0] (8.0 MiB)" in footer(out, f"a class attribute ({lib})")
    run("def batches():\n    buf = gpu(8 << 20)\n    yield len(buf)")
    _, out = run("gen = batches()\nnext(gen)")
    assert "held by gen.<frame>.buf (8.0 MiB)" in footer(out, f"a generator's frame ({lib})")
    _, out = run("x = gpu(4 << 20)\nalias = {'deep': {'x': x}}\nalso = [x]")
    assert "held by x (4.0 MiB)" in footer(out, f"several roots, named once ({lib})")
    run("del hooks, _plans, model, state, gen, x, alias, also\nRegistry.kept.clear()")


def test_the_last_traceback_and_forget_error(lib, run) -> None:
    run("def prepare():\n    tmp = gpu(2 << 30)\n    raise ValueError('bad shape')")
    result, out = run("prepare()")
    assert not result.success
    text = footer(out, f"the last traceback ({lib})")
    assert ("held by the traceback of the error in cell [" in text
            and "prepare's local tmp (2.0 GiB)" in text), text
    assert "%gpumem forget-error frees it" in text
    _, out = run("%gpumem forget-error")
    assert "2.0 GiB freed" in out.stdout.splitlines()[0], out.stdout
    assert "Δallocated -2.0 GiB" in footer(out, f"after %gpumem forget-error ({lib})")


def test_autograd_graph_and_optimizer_state(lib, run) -> None:
    if lib != "torch":
        pytest.skip("autograd graphs and optimizers are PyTorch's")
    run("model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), "
        "torch.nn.Linear(2048, 2048)).cuda()\nx = torch.randn(4096, 2048, device='cuda')\n"
        "running = torch.zeros((), device='cuda')")
    _, out = run("for step in range(4):\n    loss = model(x).square().mean()\n"
                 "    running = running + loss")
    text = footer(out, "an accumulated loss (torch)")
    assert "held by running (512 B; autograd graph: " in text, text
    assert "running.detach() or .item() drops it)" in text
    run("del loss\nrunning = running.detach()")
    _, out = run("opt = torch.optim.AdamW(model.parameters())\n"
                 "model(x).square().mean().backward()\nopt.step()")
    text = footer(out, "optimizer state (torch)")
    assert "opt (optimizer of 8, " in text and "opt.state[model.0.weight].exp_avg" in text, text
    assert "model (module of 4, " in text and "model.0.weight.grad" in text, text
    run("del model, x, running, opt")
