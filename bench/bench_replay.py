"""Events per second of the what-if replay, for a trace of a million events.

    python bench/bench_replay.py             # 1M events (about half a minute)
    python bench/bench_replay.py --events 100000 --python   # smaller, with the Python loop

A random workload (sizes from 512 B to 64 MiB, two streams, empty_cache now and then, a 4 GiB
device) is recorded through our allocator with history on, and its snapshot replayed under
``max_split_size_mb:64``. Three figures, each the best of a few runs:

- loop: the C core's replay loop alone (``Core.replay``: arrays in, per-event arrays out), the
  target being at least 1 M events/s;
- replay: ``jupyter_gpumem.replay(snapshot, config)`` from the snapshot dict, as a user calls
  it: the trace's columns read, the start layout rebuilt, the loop run;
- with --python: the reference loop in Python on the same core, for comparison.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.whatif.program import build_program
from jupyter_gpumem.whatif.replay import replay, run

MiB = 1 << 20
GiB = 1 << 30


def record(events: int, seed: int = 0) -> dict:  # type: ignore[type-arg]
    """A snapshot whose trace holds about ``events`` events."""
    rng = random.Random(seed)
    a = CachingAllocator(SimulatedDevice(4 * GiB), native=True)
    a.record_history(stacks=False, max_entries=events + 16)
    live: list[int] = []
    recorded = 0
    while recorded < events - 3000:
        for _ in range(1000):
            r = rng.random()
            if r < 0.0005:
                a.empty_cache()
            elif live and (r < 0.5 or len(live) > 300):
                a.free(live.pop(rng.randrange(len(live))))
            else:
                size = int(2 ** rng.uniform(9, 26))
                live.append(a.malloc(size, rng.choice((0, 0, 0, 7))))
        info = a._core.history_info()
        recorded = info[3] + info[4]
    return a.snapshot()  # type: ignore[return-value]


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", action="store_true", help="also time the Python loop")
    args = parser.parse_args()
    if not native_core_available():
        sys.exit("the C core is not built: python -m jupyter_gpumem.engine._build_native")
    t = time.perf_counter()
    snap = record(args.events)
    n = len(snap["device_traces"][0])
    print(f"recorded {n:,} events in {time.perf_counter() - t:.1f} s")
    config = AllocatorConfig(max_split_size_mb=64)
    capacity = 4 * GiB
    program = build_program(snap, None, config, capacity)
    loop = best(lambda: run(program, config, capacity, native=True), args.repeat)
    print(f"loop (C core):   {n / loop / 1e6:6.2f} M events/s  ({loop * 1e3:.0f} ms)")
    whole = best(lambda: replay(snap, config), args.repeat)
    print(f"replay (whole):  {n / whole / 1e6:6.2f} M events/s  ({whole * 1e3:.0f} ms)")
    if args.python:
        py = best(lambda: run(program, config, capacity, native=True, python_loop=True), 1)
        print(f"loop (Python):   {n / py / 1e6:6.2f} M events/s  ({py * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
