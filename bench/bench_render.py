"""Render timings on a 1 M-event trace: the static timeline (target ≤ 2 s), its PNG as a notebook
stores it, and the HTML/widget payload (target ≤ 1 s). Run: ``python bench/bench_render.py
[N_EVENTS]``.

The trace is recorded by the real allocator on a simulated device, so it has real addresses,
segments, stacks and cells.
"""

from __future__ import annotations

import sys
import time

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.schema import Snapshot

MiB = 1 << 20
GiB = 1 << 30


def _weights(a: CachingAllocator) -> list[int]:
    return [a.malloc(256 * MiB) for _ in range(4)]


def _activation(a: CachingAllocator, step: int) -> int:
    return a.malloc((4 + step % 7) * MiB)


def _scratch(a: CachingAllocator, step: int) -> int:
    return a.malloc((1 + step % 13) * 64 * 1024)


def workload_snapshot(n_events: int, *, cells: int = 8) -> Snapshot:
    """A snapshot whose trace has about ``n_events`` events, from a training-like loop."""
    device = SimulatedDevice(80 * GiB, clock=ManualClock(tick_ns=1_000), name="Simulated GPU")
    a = CachingAllocator(device)
    a.record_history(True, stacks=True, max_entries=n_events + 1)
    kept = _weights(a)
    steps = n_events // 30  # each step makes ~30 events
    for step in range(steps):
        a.current_cell = 1 + step * cells // max(steps, 1)
        live = [_activation(a, step) for _ in range(4)]
        live += [_scratch(a, step) for _ in range(6)]
        if step % 97 == 0:
            kept.append(_scratch(a, step))  # a slow leak
        for ptr in live:
            a.free(ptr)
    return a.snapshot()


def main(n_events: int = 1_000_000) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from jupyter_gpumem.data.timeline import build_timeline
    from jupyter_gpumem.render.html import render_html
    from jupyter_gpumem.render.plots import plot_timeline
    from jupyter_gpumem.render.view_payload import build_view

    t = time.perf_counter()
    snap = workload_snapshot(n_events)
    n = len(snap["device_traces"][0])
    print(f"recorded {n:,} events in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    tl = build_timeline(snap)
    print(f"timeline columns:          {time.perf_counter() - t:6.3f} s")

    t = time.perf_counter()
    ax = plot_timeline(snap)
    ax.figure.canvas.draw()
    static = time.perf_counter() - t
    print(f"static timeline (drawn):   {static:6.3f} s   target <= 2 s")

    from jupyter_gpumem.render.display import figure_png

    t = time.perf_counter()
    png = figure_png(ax.figure)
    took = time.perf_counter() - t
    print(f"its PNG (64-colour palette): {took:4.3f} s   ({len(png) / 1e3:.0f} KB; a notebook "
          "stores it in the html and as image/png)")

    t = time.perf_counter()
    build_view(snap)
    payload = time.perf_counter() - t
    print(f"widget/html payload:       {payload:6.3f} s   target <= 1 s (columns included)")
    t = time.perf_counter()
    build_view(snap, timeline=tl)
    print(f"  payload, columns reused: {time.perf_counter() - t:6.3f} s")

    t = time.perf_counter()
    html = render_html(snap)
    took = time.perf_counter() - t
    print(f"whole HTML page:           {took:6.3f} s   ({len(html) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
