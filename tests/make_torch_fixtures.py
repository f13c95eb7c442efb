"""Write the synthetic PyTorch fixtures of ``tests/data/fixtures/`` (``synthetic_torch_*``).

    PYTHONPATH=$PWD python tests/make_torch_fixtures.py tests/data/fixtures

They come from ``fake_torch`` (PyTorch's policy on a simulated device): a small "training loop"
(a two-layer MLP, AdamW-like state, a few steps), as PyTorch writes them: a snapshot with the
history of one step (``stacks="python"``), the ``memory_stats()`` after each step, one snapshot
with ``stacks="all"`` (C++ frames first) and the text of an out-of-memory error. The frames of
this script read ``/home/user/train.py``. ``bench/record_torch_source.py`` records the same files
(without the ``synthetic_`` prefix) from real PyTorch on a GPU.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_torch import FakeAdamW, FakeLinear, FakeSequential, FakeTorchMemory

MiB = 1 << 20
USER_FILE = "/home/user/train.py"
_TESTS = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _renamed(obj: Any) -> Any:
    """Frames of this script named ``USER_FILE`` (no path of the machine in a fixture)."""
    if isinstance(obj, dict):
        if obj.get("filename") == __file__:
            return {**obj, "filename": USER_FILE}
        if str(obj.get("filename", "")).startswith(_TESTS):  # a test helper: relative
            return {**obj, "filename": "tests/" + obj["filename"][len(_TESTS):]}
        return {k: _renamed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_renamed(v) for v in obj]
    return obj


def train_step(mem: FakeTorchMemory, model: FakeSequential, opt: FakeAdamW, batch: int) -> None:
    x = mem.empty(batch * 4 * 256)
    h = mem.empty(batch * 4 * 1024)  # activations kept for the backward pass
    out = mem.empty(batch * 4 * 10)
    for p in model.parameters():
        if p.grad is None:
            p.grad = mem.empty(p.nbytes)
    del out, h, x
    opt.step()


def main(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    mem = FakeTorchMemory()
    model = FakeSequential(FakeLinear(mem, 256, 1024), None, FakeLinear(mem, 1024, 10))
    opt = FakeAdamW(model.parameters())
    stats = []
    for step in range(4):
        if step == 0:
            mem._record_memory_history("all", context="all", stacks="python",
                                       max_entries=100_000)
        train_step(mem, model, opt, 512)
        stats.append({"step": step, "memory_allocated": mem.memory_allocated(),
                      "memory_stats": mem.memory_stats()})
        if step == 0:
            with open(os.path.join(outdir, "synthetic_torch_train_snapshot.pickle"), "wb") as f:
                pickle.dump(_renamed(mem._snapshot()), f, protocol=2)
            mem._record_memory_history(None)
    with open(os.path.join(outdir, "synthetic_torch_train_stats.json"), "w") as f:
        json.dump(stats, f, indent=0, sort_keys=True)
    mem._record_memory_history("all", context="all", stacks="all", max_entries=100_000)
    train_step(mem, model, opt, 64)
    with open(os.path.join(outdir, "synthetic_torch_all_stacks.pickle"), "wb") as f:
        pickle.dump(_renamed(mem._snapshot()), f, protocol=2)
    mem._record_memory_history(None)
    try:
        mem.empty(4 << 30)
    except mem.OutOfMemoryError as exc:
        with open(os.path.join(outdir, "synthetic_torch_oom.txt"), "w") as f:
            f.write(f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", nargs="?", default="tests/data/fixtures",
                        help="the folder to write them in (default: %(default)s)")
    main(parser.parse_args().outdir)
