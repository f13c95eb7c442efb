"""Record the PyTorch-source fixtures on a GPU (PyTorch with CUDA; no network needed).

    python bench/record_torch_source.py OUTDIR

A small training loop (an ``nn.Sequential`` MLP, AdamW, a few steps) writes, each under 200 KB:

- ``torch_train_snapshot.pickle``: ``torch.cuda.memory._snapshot()`` with the history of one
  step, recorded with ``stacks="python"``;
- ``torch_train_stats.json``: after each step, ``{"step", "memory_allocated",
  "memory_stats"}`` (``torch.cuda.memory_stats()``);
- ``torch_all_stacks.pickle``: the snapshot of one tiny step recorded with ``stacks="all"``
  (C++ frames first), for the tests that sites skip them;
- ``torch_oom.txt``: the text of a caught ``torch.OutOfMemoryError``.

Copy them into ``tests/data/fixtures/``: the tests there read every ``*torch*.pickle``.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

LIMIT = 200_000  # bytes a fixture may take


def main(outdir: str) -> int:
    import torch
    from torch import nn

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    memory = torch.cuda.memory

    def step(batch: int) -> None:
        x = torch.randn(batch, 512, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    stats = []
    written = []
    for i in range(4):
        if i == 1:  # the first step made the optimizer state; this one is the steady state
            memory._record_memory_history(enabled="all", context="all", stacks="python",
                                          max_entries=2000)
        step(256)
        torch.cuda.synchronize()
        stats.append({"step": i, "memory_allocated": torch.cuda.memory_allocated(),
                      "memory_stats": dict(torch.cuda.memory_stats())})
        if i == 1:
            path = os.path.join(outdir, "torch_train_snapshot.pickle")
            with open(path, "wb") as f:
                pickle.dump(memory._snapshot(), f, protocol=4)
            written.append(path)
            memory._record_memory_history(enabled=None)
    path = os.path.join(outdir, "torch_train_stats.json")
    with open(path, "w") as f:
        json.dump(stats, f, indent=0, sort_keys=True)
    written.append(path)

    memory._record_memory_history(enabled="all", context="all", stacks="all", max_entries=60)
    step(8)
    torch.cuda.synchronize()
    path = os.path.join(outdir, "torch_all_stacks.pickle")
    with open(path, "wb") as f:
        pickle.dump(memory._snapshot(), f, protocol=4)
    written.append(path)
    memory._record_memory_history(enabled=None)

    free, _total = torch.cuda.mem_get_info()
    try:
        torch.empty(free + (8 << 30), dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as exc:
        path = os.path.join(outdir, "torch_oom.txt")
        with open(path, "w") as f:
            f.write(f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n")
        written.append(path)
    ok = True
    for path in written:
        size = os.path.getsize(path)
        flag = "ok" if size < LIMIT else "TOO BIG"
        ok = ok and size < LIMIT
        print(f"{path}: {size} bytes {flag}")
    return 0 if ok and len(written) == 4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "torch_fixtures"))
