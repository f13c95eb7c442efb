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


def footer(out, name: str) -> str:
    """The footer of a cell, written to ``GPUMEM_FOOTER_LOG`` when set."""
    text = out.stdout[out.stdout.rfind("gpumem ["):]
    log = os.environ.get("GPUMEM_FOOTER_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"## {name}\n{text}\n")
    return text


@pytest.fixture
def cupy_shell(shell, run):
    result, out = run("%load_ext jupyter_gpumem")
    assert result.success, out.stderr
    get_extension(shell).settings.live_view = False
    run("import cupy as cp\n%gpumem auto on")
    yield shell
    run("%gpumem forget-error\n%reset -f")  # what a failed test left
    run("%unload_ext jupyter_gpumem")


def test_closures_caches_attributes_containers_classes_and_generators(cupy_shell, run) -> None:
    run("def make_hook(n):\n    buf = cp.empty(16 * (1 << 20), cp.uint8)\n    return lambda: buf")
    _, out = run("hooks = [make_hook(n) for n in range(8)]")
    assert "held by hooks (list of 8 closures, 128 MiB)" in footer(out, "closures")
    _, out = run("_plans = {}\nfor n in (1, 2, 3):\n    _plans[(1024, 1024, n)] = "
                 "cp.empty((1024, 1024, n), cp.float32)")
    assert "held by _plans (dict of 3, 24.0 MiB)" in footer(out, "an underscore cache")
    run("class Model:\n    def __init__(self):\n        self.cache = {}")
    _, out = run("model = Model()\nmodel.cache['k'] = cp.empty(1 << 22, cp.float32)")
    assert "held by model.cache['k'] (16.0 MiB)" in footer(out, "an object's attribute")
    _, out = run("state = {'a': {'b': [0, 1, cp.empty(1 << 20, cp.float32)]}}")
    assert "held by state['a']['b'][2] (4.0 MiB)" in footer(out, "nested containers")
    run("class Registry:\n    kept = []")
    _, out = run("Registry.kept.append(cp.empty(1 << 21, cp.float32))")
    assert "held by Registry.kept[0] (8.0 MiB)" in footer(out, "a class attribute")
    run("def batches():\n    buf = cp.empty(1 << 21, cp.float32)\n    yield buf.size")
    _, out = run("gen = batches()\nnext(gen)")
    assert "held by gen.<frame>.buf (8.0 MiB)" in footer(out, "a generator's frame")
    _, out = run("x = cp.empty(1 << 20, cp.float32)\nalias = {'deep': {'x': x}}\nalso = [x]")
    assert "held by x (4.0 MiB);" in footer(out, "several roots, named once")
    run("del hooks, _plans, model, state, gen, x, alias, also\nRegistry.kept.clear()")


def test_the_last_traceback_and_forget_error(cupy_shell, run) -> None:
    run("import cupy as cp\ndef prepare():\n    tmp = cp.empty(2 * (1 << 30), cp.uint8)\n"
        "    raise ValueError('bad shape')")
    result, out = run("prepare()")
    assert not result.success
    text = footer(out, "the last traceback")
    assert ("held by the traceback of the error in cell [" in text
            and "prepare's local tmp (2.0 GiB)" in text)
    assert "%gpumem forget-error frees it" in text
    _, out = run("%gpumem forget-error")
    assert "2.0 GiB freed" in out.stdout.splitlines()[0], out.stdout
    assert "Δallocated -2.0 GiB" in footer(out, "after %gpumem forget-error")


torch_only = pytest.mark.skipif(
    os.environ.get("GPUMEM_NO_TORCH") == "1", reason="PyTorch tests turned off")


@pytest.fixture
def torch_shell(shell, run):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    result, out = run("%load_ext jupyter_gpumem")
    assert result.success, out.stderr
    get_extension(shell).settings.live_view = False
    run("import torch\n%gpumem source torch\n%gpumem auto on")
    yield shell
    run("%gpumem forget-error\n%reset -f")  # what a failed test left
    run("import gc, torch\ngc.collect()\ntorch.cuda.empty_cache()\n%unload_ext jupyter_gpumem")


@torch_only
def test_autograd_graph_and_optimizer_state(torch_shell, run) -> None:
    run("model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), "
        "torch.nn.Linear(2048, 2048)).cuda()\nx = torch.randn(4096, 2048, device='cuda')\n"
        "running = torch.zeros((), device='cuda')")
    _, out = run("for step in range(4):\n    loss = model(x).square().mean()\n"
                 "    running = running + loss")
    text = footer(out, "an accumulated loss (PyTorch)")
    assert "held by running (512 B; autograd graph: " in text, text
    assert "running.detach() or .item() drops it)" in text
    run("del loss\nrunning = running.detach()")
    _, out = run("opt = torch.optim.AdamW(model.parameters())\n"
                 "model(x).square().mean().backward()\nopt.step()")
    text = footer(out, "optimizer state (PyTorch)")
    assert "opt (optimizer of 8, " in text and "opt.state[model.0.weight].exp_avg" in text, text
    assert "model (module of 4, " in text and "model.0.weight.grad" in text, text
    run("del model, x, running, opt\ntorch.cuda.empty_cache()")
