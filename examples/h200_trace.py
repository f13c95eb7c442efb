"""Record a real trace on a GPU: a small CuPy training loop, with a leak and a fragmenting phase.

Usage: python examples/h200_trace.py OUT_DIR

Writes OUT_DIR/trace.json.gz (the snapshot with its history), and renders it the way a user
would: OUT_DIR/timeline.png, OUT_DIR/segments.png and OUT_DIR/trace.html (through the CLI).
"""

from __future__ import annotations

import os
import subprocess
import sys

import cupy as cp

import jupyter_gpumem as gm
from jupyter_gpumem.data.files import save_snapshot
from jupyter_gpumem.runtime import registry


def mlp_step(weights: list[cp.ndarray], batch: int, rng: cp.random.Generator) -> float:
    x = rng.standard_normal((batch, weights[0].shape[0]), dtype=cp.float32)
    activations = [x]
    for w in weights:
        x = cp.maximum(x @ w, 0)  # matmul (cuBLAS) + ReLU
        activations.append(x)
    loss = float((x * x).mean())
    grad = 2 * x / x.size
    for w, a in zip(reversed(weights), reversed(activations[:-1]), strict=True):
        gw = a.T @ grad
        grad = (grad @ w.T) * (a > 0)
        w -= 1e-3 * gw
    return loss


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    gm.install()
    allocator = registry.get_allocator(0)
    allocator.record_history(True, stacks=True, max_entries=200_000)
    rng = cp.random.default_rng(0)
    leaked = []

    allocator.current_cell = 1  # "cell 1": the model
    weights = [rng.standard_normal(shape, dtype=cp.float32) * 0.05
               for shape in [(1024, 4096), (4096, 4096), (4096, 1024)]]

    allocator.current_cell = 2  # "cell 2": training, batch growing, one buffer leaked per step
    for step in range(12):
        mlp_step(weights, 256 * (1 + step % 4), rng)
        leaked.append(cp.empty(3 << 20, dtype=cp.uint8))

    allocator.current_cell = 3  # "cell 3": many odd-sized temporaries, some kept: fragmentation
    kept = []
    for i in range(200):
        t = cp.ones((1 + (i * 7919) % 50_000,), dtype=cp.float64)
        if i % 3 == 0:
            kept.append(t)
    cp.cuda.Device(0).synchronize()

    snapshot = allocator.snapshot()
    save_snapshot(snapshot, os.path.join(out, "trace.json.gz"))
    allocator.record_history(False)
    cli = [sys.executable, "-m", "jupyter_gpumem", "render", os.path.join(out, "trace.json.gz")]
    for name, plot in (("timeline.png", "timeline"), ("segments.png", "segments")):
        subprocess.run([*cli, "-o", os.path.join(out, name), "--plot", plot], check=True)
    subprocess.run([*cli, "-o", os.path.join(out, "trace.html")], check=True)
    trace = snapshot["device_traces"][0]
    print(f"{len(trace)} events, {len(snapshot['segments'])} segments, "
          f"peak {max(allocator.memory_stats()['allocated_bytes.all.peak'], 0) >> 20} MiB")
    del weights, leaked, kept
    gm.uninstall()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "h200-trace")
