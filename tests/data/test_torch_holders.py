"""Holders of PyTorch's memory, duck-typed: tensors by their storage, modules' parameters,
gradients and buffers by attribute path, optimizer state by the parameter's path."""

from __future__ import annotations

import sys

from fake_torch import FakeAdamW, FakeBatchNorm, FakeLinear, FakeSequential, FakeTorchMemory

from jupyter_gpumem.data.holders import (
    GRADIENTS,
    OPTIMIZER_STATE,
    OTHER_VARIABLES,
    PARAMETERS,
    find,
    find_holders,
    holder_groups,
    holder_role,
)


def _blocks(mem: FakeTorchMemory) -> list[tuple[int, int]]:
    return [(b.address, b.size) for b in mem.allocator.state().blocks if b.allocated]


def test_tensors_modules_grads_and_optimizer_state_are_named() -> None:
    mem = FakeTorchMemory()
    model = FakeSequential(FakeLinear(mem, 64, 32), None, FakeBatchNorm(mem, 32))
    opt = FakeAdamW(model.parameters())
    w = dict(model.named_parameters())["0.weight"]
    w.grad = mem.empty(w.nbytes)
    opt.step()
    x = mem.empty(4096)
    names = find_holders({"model": model, "opt": opt, "x": x, "n": 3}, _blocks(mem))
    flat = sorted(n for ns in names.values() for n in ns)
    assert "x" in flat
    assert {"model.0.weight", "model.0.bias", "model.0.weight.grad", "model.2.weight",
            "model.2.running_mean"} <= set(flat)
    assert {"opt.state[model.0.weight].exp_avg", "opt.state[model.0.weight].exp_avg_sq",
            "opt.state[model.2.weight].exp_avg"} <= set(flat)
    assert not any(n.startswith("model") and "exp_avg" in n for n in flat)
    groups = {g.name: g for g in holder_groups({"model": model, "opt": opt}, _blocks(mem))}
    assert groups["model"].container == "module"
    assert groups["model"].items == 5
    assert groups["opt"].container == "optimizer" and groups["opt"].items == 6
    assert groups["opt"].describe().startswith("opt (optimizer of 6")
    assert "torch" not in sys.modules


def test_optimizer_without_its_module_in_the_namespace() -> None:
    mem = FakeTorchMemory()
    layer = FakeLinear(mem, 8, 8)
    opt = FakeAdamW(layer.parameters())
    opt.step()
    names = find_holders({"opt": opt}, _blocks(mem))
    flat = {n for ns in names.values() for n in ns}
    assert "opt.state[param_groups[0][0]].exp_avg" in flat


def test_holder_role_reads_the_names_find_holders_gives() -> None:
    mem = FakeTorchMemory()
    model = FakeSequential(FakeLinear(mem, 64, 32), None, FakeBatchNorm(mem, 32))
    opt = FakeAdamW(model.parameters())
    w = dict(model.named_parameters())["0.weight"]
    w.grad = mem.empty(w.nbytes)
    opt.step()
    x = mem.empty(4096)
    xs = [mem.empty(512)]
    names = find_holders({"model": model, "opt": opt, "x": x, "xs": xs}, _blocks(mem))
    roles = {n: holder_role(n) for ns in names.values() for n in ns}
    assert roles["model.0.weight"] == roles["model.2.running_mean"] == PARAMETERS
    assert roles["model.0.weight.grad"] == GRADIENTS
    assert roles["opt.state[model.0.weight].exp_avg"] == OPTIMIZER_STATE
    assert roles["x"] == roles["xs[0]"] == OTHER_VARIABLES
    assert holder_role("opt.state[param_groups[0][3]].exp_avg") == OPTIMIZER_STATE
    assert holder_role("d['a.grad']") == OTHER_VARIABLES


def test_an_accumulated_loss_keeps_every_steps_autograd_graph() -> None:
    mem = FakeTorchMemory()
    MiB = 1 << 20
    model = FakeSequential(FakeLinear(mem, 64, 32))
    running = mem.empty(512)
    for _ in range(5):
        act = mem.op(*model.parameters(), nbytes=64 * MiB)  # saves the weight and the bias
        loss = mem.op(act, nbytes=512)  # saves the activation
        running = mem.op(running, loss, saves=False)  # running = running + loss
        del act, loss
    found = find({"model": model, "running": running}, _blocks(mem), modules=False)
    groups = {g.name: g.describe() for g in found.groups}
    assert groups["running"] == (
        "running (512 B; autograd graph: 320 MiB of saved tensors; running.detach() or "
        ".item() drops it)")
    # the parameters the graph saved too keep their module's names
    assert groups["model"] == "model (module of 2, 8.5 KiB: model.0.weight, …)"
    assert sorted(found.names) == sorted(a for a, _ in _blocks(mem))
