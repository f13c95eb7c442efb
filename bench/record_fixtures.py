"""Record the replay fixtures on a GPU: a CuPy trace through our allocator and a PyTorch pickle.

    python bench/record_fixtures.py OUTDIR

Writes, each well under 200 KB:

- ``cupy_trace.json.gz``: our snapshot (history without stacks) of a small CuPy workload run
  through jupyter_gpumem's allocator under ``max_split_size_mb:64`` with a memory fraction that
  leaves 2 GiB: arrays of mixed sizes on two streams, ``empty_cache()`` calls (one that frees
  nothing), the retry ladder and a caught out-of-memory error; its ``memory_stats()`` are in
  the snapshot's ``jupyter_gpumem`` field;
- ``torch_snapshot.pickle``: ``torch.cuda.memory._snapshot()`` (PyTorch's own format) of a
  similar workload under the same fraction, with ``torch.cuda.empty_cache()`` calls, a caught
  ``torch.OutOfMemoryError`` and history recorded with ``stacks="python"``;
- ``torch_snapshot.json``: what the replay needs and PyTorch's pickle does not hold:
  ``torch.cuda.memory_stats()`` at the end, the device's total bytes, the memory fraction and
  ``PYTORCH_CUDA_ALLOC_CONF`` at recording time, and where empty_cache() was called (event
  positions, for checking the inference).

Run it in a fresh process: PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` at its first allocation,
and this script sets it before importing torch.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 1 << 20
GiB = 1 << 30
CONF = "max_split_size_mb:64"
#: (MiB, stream index) of each allocation; "E" empty_cache, "F<n>" free the n-th live array
PROGRAM = ["E", (3, 0), (30, 0), (1, 1), (100, 0), "F1", (80, 1), "E", "F0", (0.5, 0), "F2",
           (300, 0), "F1", "E", (150, 1), (700, 0), "F0", "F0", (64, 0), "E", (1200, 0),
           (900, 0), "F0", (50, 1), "E"]


def fraction_for(total: int, room: int = 2 * GiB) -> float:
    return room / total


def run_cupy(out: Path) -> None:
    import cupy as cp

    import jupyter_gpumem as gm
    from jupyter_gpumem.data.files import save_snapshot
    from jupyter_gpumem.runtime import registry

    gm.install(config=gm.AllocatorConfig.parse(CONF))
    allocator = registry.get_allocator(0)
    total = allocator.device.mem_get_info()[1]
    allocator.set_memory_fraction(fraction_for(total))
    allocator.record_history(stacks=False, max_entries=20_000)
    streams = [cp.cuda.Stream.null, cp.cuda.Stream(non_blocking=True)]
    live: list[object] = []
    for step in PROGRAM:
        if step == "E":
            allocator.empty_cache()
        elif isinstance(step, str):
            if live:
                del live[int(step[1:]) % len(live)]
        else:
            mib, s = step
            with streams[s], contextlib.suppress(cp.cuda.memory.OutOfMemoryError):
                live.append(cp.empty(int(mib * MiB), dtype=cp.uint8))
    cp.cuda.Device().synchronize()
    save_snapshot(allocator.snapshot(), out / "cupy_trace.json.gz")
    gm.uninstall()


def run_torch(out: Path) -> None:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CONF
    import torch

    total = torch.cuda.mem_get_info()[1]
    fraction = fraction_for(total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=20_000)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    live: list[object] = []
    marks: list[int] = []

    def events() -> int:
        return len(torch.cuda.memory._snapshot()["device_traces"][0])

    for step in PROGRAM:
        if step == "E":
            marks.append(events())
            torch.cuda.empty_cache()
        elif isinstance(step, str):
            if live:
                del live[int(step[1:]) % len(live)]
        else:
            mib, s = step
            with torch.cuda.stream(streams[s]), contextlib.suppress(torch.OutOfMemoryError):
                live.append(torch.empty(int(mib * MiB), dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    import pickle

    with open(out / "torch_snapshot.pickle", "wb") as f:
        pickle.dump(snap, f, protocol=4)
    meta = {
        "memory_stats": dict(torch.cuda.memory_stats()),
        "device_total": total,
        "per_process_memory_fraction": fraction,
        "PYTORCH_CUDA_ALLOC_CONF": CONF,
        "empty_cache_positions": marks,
        "torch": torch.__version__,
    }
    (out / "torch_snapshot.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    run_cupy(out)
    run_torch(out)
    for path in sorted(out.iterdir()):
        size = path.stat().st_size
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                size_raw = len(f.read())
            print(f"{path.name}: {size:,} B ({size_raw:,} B unpacked)")
        else:
            print(f"{path.name}: {size:,} B")


if __name__ == "__main__":
    main()
