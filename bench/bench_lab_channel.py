"""What JupyterLab's panel costs a notebook: the µs its channel (``notebook.lab_channel``) adds to a
cell beside the ledger's, a sample's µs, and the bytes of what it sends and what a notebook keeps.

    python bench/bench_lab_channel.py            # full run (under a minute)
    python bench/bench_lab_channel.py --quick    # smoke run

On the simulated device, each cell keeps one 64 MiB block (so the ledger's holder search runs).
A recording comm stands for the frontend; messages are measured as the JSON a kernel sends.
``listening``: a frontend is attached (the cell's message is built and sent, with the devices and
sources); ``nobody``: none is (the channel only keeps its span and samples). Bytes: a cell's
message, a samples message (what the sampler pushes twice a second while a cell runs), the state
a frontend gets after many cells and after a session long enough that each lane is cut back
(``MAX_POINTS`` rows), and the notebook's metadata at its bound (``SAVED_POINTS`` rows a lane).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # lab_comms

from lab_comms import RecordingLayer

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.lab_schema import SAVED_POINTS
from jupyter_gpumem.notebook.lab_channel import LabChannel
from jupyter_gpumem.notebook.ledger import Ledger
from jupyter_gpumem.render.view_payload import MAX_POINTS
from jupyter_gpumem.sources.cupy import CupySource

MiB = 1 << 20


def _setup(listening: bool) -> tuple[Ledger, LabChannel, Any, dict[str, Any]]:
    a = CachingAllocator(SimulatedDevice(80 << 30))
    source = CupySource(a)
    ns: dict[str, Any] = {}
    ledger = Ledger(sources_for=lambda: [source], namespace=lambda: ns)
    layer = RecordingLayer()
    channel = LabChannel(ledger, layer, sources_for=lambda: [source])
    channel.open()
    (comm,) = layer.opened
    if not listening:
        comm.frontend_closes()
    return ledger, channel, comm, {"a": a, "ns": ns}


def _cells(n: int, listening: bool) -> tuple[list[float], list[float], Any, LabChannel]:
    """µs of the channel's and of the ledger's part of each of ``n`` cells."""
    ledger, channel, comm, env = _setup(listening)
    a, ns = env["a"], env["ns"]
    ours, ledgers = [], []
    for i in range(n):
        t0 = time.perf_counter()
        ledger.start_cell(i + 1, "x = ...")
        t1 = time.perf_counter()
        channel.cell_started(i + 1, f"m{i}", f"c{i}")
        t2 = time.perf_counter()
        ns[f"x{i}"] = a.malloc(64 * MiB)  # the cell's work, not timed
        t3 = time.perf_counter()
        channel.cell_stopped()
        t4 = time.perf_counter()
        rows = ledger.end_cell()
        t5 = time.perf_counter()
        channel.cell_ended(rows, i + 1)
        t6 = time.perf_counter()
        ours.append((t2 - t1 + t4 - t3 + t6 - t5) * 1e6)
        ledgers.append((t1 - t0 + t5 - t4) * 1e6)
    channel.close()
    for p in list(ns.values()):
        a.free(p)
    return ours, ledgers, comm, channel


def _kb(obj: Any) -> float:
    return len(json.dumps(obj).encode()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    n = 50 if args.quick else 400

    print(f"{n} cells, each keeping one 64 MiB block; µs a cell (median, worst):")
    for listening in (True, False):
        ours, ledgers, comm, _ = _cells(n, listening)
        who = "listening" if listening else "nobody"
        print(f"  {who:>9}: channel {statistics.median(ours):7.1f} µs (worst {max(ours):7.1f}) · "
              f"ledger {statistics.median(ledgers):7.1f} µs")
        if listening:
            cells = [m for m in comm.sent if m["type"] == "cell"]
            sizes = [_kb(m) for m in cells]
            print(f"  a cell's message: {statistics.median(sizes):.2f} KB")

    ledger, channel, _, env = _setup(True)
    source = CupySource(env["a"])
    reps = 200 if args.quick else 2000
    t0 = time.perf_counter()
    for _ in range(reps):
        channel._sample([source])
    print(f"a sample of one source: {(time.perf_counter() - t0) / reps * 1e6:.1f} µs "
          "(five a second while a cell runs)")
    for i in range(3):
        channel.series.add("cupy", 0, "Simulated GPU 0", (10.0 + 0.2 * i, 64 * MiB, 80 * MiB, None))
    lanes, _ = channel.series.take_new()
    print(f"a samples message (3 rows, what a push carries): "
          f"{_kb({'type': 'samples', 'lanes': lanes}):.2f} KB")

    _, _, _, after = _cells(200, True)
    print(f"the state after 200 cells: {_kb(after.state()):.1f} KB")
    long_session = LabChannel(ledger, channel._layer, sources_for=lambda: [source])
    for i in range(3 * MAX_POINTS):
        long_session.series.add("cupy", 0, "Simulated GPU 0",
                                (0.2 * i, (i * 7919) % 4096 * MiB, 8192 * MiB, 9000 * MiB))
    rows = len(long_session.series.rows("cupy:0"))
    print(f"the state after {3 * MAX_POINTS} samples: {rows} rows kept, "
          f"{_kb(long_session.state()):.1f} KB")
    saved = {"lanes": [{"samples": [[round(0.2 * i, 4), i * MiB, 2 * i * MiB, 3 * i * MiB]
                                    for i in range(SAVED_POINTS)]}]}
    print(f"the notebook's metadata at its bound ({SAVED_POINTS} rows a lane): "
          f"{_kb(saved):.1f} KB a lane")


if __name__ == "__main__":
    main()
