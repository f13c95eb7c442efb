"""Live widget costs. Run: ``python bench/bench_widget.py [N_EVENTS]``.

(a) The widget's view payload of a 1 M-event trace (timeline + lives, binary columns, synced
    through a comm that serialises like a kernel's): target ≤ 1 s.
(b) The live sampler at 5 Hz on a busy cell: a CPU-bound Python loop that allocates and frees
    through a simulated allocator, run with and without a LiveSession sampling
    ``memory_allocated()`` / ``memory_reserved()``; the same work in short runs taken in pairs
    whose order flips every round, the overhead being the median of the paired ratios.
    Target ≤ 2 % overhead.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import comm

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.notebook.widget import LiveSession, MemoryWidget
from jupyter_gpumem.render.view_payload import build_view

sys.path.insert(0, str(Path(__file__).parent))
from bench_render import workload_snapshot  # the shared 1 M-event workload

MiB = 1 << 20
GiB = 1 << 30


class SerializingComm:
    """Does what a kernel's comm does to a message before it leaves: JSON and buffer copies."""

    kernel = "Truthy"
    comm_id = "bench"
    sent_bytes = 0

    def __init__(self, **kwargs: Any) -> None:
        self.send(kwargs.get("data"), buffers=kwargs.get("buffers"))

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        SerializingComm.sent_bytes += len(json.dumps(data))
        for b in buffers or []:
            SerializingComm.sent_bytes += len(bytes(b))

    def on_msg(self, callback: Any) -> None:
        pass

    def on_close(self, callback: Any) -> None:
        pass

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass


def bench_payload(n_events: int) -> None:
    t = time.perf_counter()
    snap = workload_snapshot(n_events)
    n = len(snap["device_traces"][0])
    print(f"recorded {n:,} events, {sum(len(s['blocks']) for s in snap['segments'])} blocks "
          f"in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    tl = build_timeline(snap)
    print(f"trace columns (_timeline):        {time.perf_counter() - t:6.3f} s")
    t = time.perf_counter()
    build_view(snap, timeline=tl, binary=True)
    print(f"view payload, columns reused:     {time.perf_counter() - t:6.3f} s")
    SerializingComm.sent_bytes = 0
    t = time.perf_counter()
    MemoryWidget.from_snapshot(snap)
    took = time.perf_counter() - t
    print(f"widget from snapshot, all in:     {took:6.3f} s   target <= 1 s "
          f"({SerializingComm.sent_bytes / 1e6:.2f} MB sent)")


def busy_cell(a: CachingAllocator, steps: int) -> None:
    """CPU-bound Python with allocator traffic: arithmetic, and allocations that come and go."""
    live: list[int] = []
    acc = 0
    for i in range(steps):
        for j in range(40):
            acc += (i * j) % 7
        live.append(a.malloc((1 + i % 17) * 64 * 1024))
        if len(live) > 32:
            a.free(live.pop(0))
    for p in live:
        a.free(p)


def bench_sampler(steps: int, rounds: int) -> None:
    a = CachingAllocator(SimulatedDevice(16 * GiB))

    def sample() -> tuple[int, int, int | None]:
        return a.memory_allocated(), a.memory_reserved(), None

    busy_cell(a, steps // 10)  # warm the pools
    # Short runs in pairs, the order flipping every round, so drift in the machine's speed and
    # any first-or-second bias cancel; the overhead is the median of the paired ratios.
    ratios: list[float] = []
    offs: list[float] = []
    samples = 0

    def timed(live: bool) -> float:
        nonlocal samples
        session = LiveSession(sample, interval_s=0.2) if live else None
        t = time.perf_counter()
        if session is not None:
            session.start(display=False)
        busy_cell(a, steps)
        if session is not None:
            session.stop()
            samples += session.widget.n_samples
        return time.perf_counter() - t

    for r in range(rounds):
        if r % 2:
            on = timed(True)
            off = timed(False)
        else:
            off = timed(False)
            on = timed(True)
        ratios.append(on / off)
        offs.append(off)
    ratios.sort()
    median = statistics.median(ratios)
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    print(f"busy cell, {rounds} pairs of {statistics.median(offs):.2f} s runs, "
          f"{samples / rounds:.1f} samples per sampled run")
    print(f"sampler overhead, median of paired ratios: {100 * (median - 1):+.2f} % "
          f"(quartiles {100 * (q1 - 1):+.2f} % .. {100 * (q3 - 1):+.2f} %)  target <= 2 %")

    # the cost of one sample itself, which bounds the overhead from below the noise
    session = LiveSession(sample, interval_s=3600)
    session.start(display=False)
    k = 2000
    t = time.perf_counter()
    for _ in range(k):
        session.sample()
    per = (time.perf_counter() - t) / k
    session.stop()
    print(f"one sample (read + send):         {per * 1e6:6.1f} µs  -> "
          f"{100 * per * 5:.4f} % of a second at 5 Hz")


def main(n_events: int = 1_000_000) -> None:
    comm.create_comm = lambda **kw: SerializingComm(**kw)
    bench_payload(n_events)
    bench_sampler(steps=250_000, rounds=31)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
