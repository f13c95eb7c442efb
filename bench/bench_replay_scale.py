"""How the what-if replay scales: distinct streams, and blocks freed in descending address order.

    python bench/bench_replay_scale.py                      # 20k / 80k / 1M streams, 200k frees
    python bench/bench_replay_scale.py --streams 20000 40000 80000 --frees 50000 100000

Three workloads, each timed once (seconds, wall clock; the machine's other load shows):

- streams: a trace in which every request is on a stream of its own (N streams, 4N events, one
  small segment each), replayed with ``jupyter_gpumem.replay``. The policy keeps free blocks per
  pool and stream: a lookup that walks the streams made this quadratic (20k / 40k / 80k
  streams: 0.4 / 2.0 / 6.3 s before). A replay takes at most ``MAX_STREAMS`` distinct streams
  (``whatif.program``); this script raises it to time a million;
- late frees: N blocks of 4 KiB live when the trace starts, freed in descending address order,
  then ``jupyter_gpumem.suggest_config`` (two dozen replays, each rebuilding the start layout);
- early frees: N blocks of 12 MiB (a segment each) allocated and freed in descending address
  order while recording, replayed once (each freed block goes to the front of its size's run
  in the stream's sorted free list).

Run it on two checkouts (``PYTHONPATH=...``) to compare before and after.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jupyter_gpumem as gm
from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.whatif import program

MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB
BASE = 0x7F00_0000_0000


def streams_trace(n: int) -> dict[str, Any]:
    """A snapshot of ``n`` requests of 512 B, each on a stream of its own, each freed."""
    trace: list[dict[str, Any]] = []
    for s in range(n):
        addr = BASE + s * SMALL_SEGMENT
        event = {"addr": addr, "stream": s + 1, "time_us": s, "frames": []}
        trace.append({**event, "action": "segment_alloc", "size": SMALL_SEGMENT})
        for action in ("alloc", "free_requested", "free_completed"):
            trace.append({**event, "action": action, "size": 512})
    segments = [{"device": 0, "address": BASE + s * SMALL_SEGMENT, "total_size": SMALL_SEGMENT,
                 "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": s + 1,
                 "segment_type": "small", "frames": [],
                 "blocks": [{"address": BASE + s * SMALL_SEGMENT, "size": SMALL_SEGMENT,
                             "requested_size": 0, "state": "inactive", "frames": []}]}
                for s in range(n)]
    return {"segments": segments, "device_traces": [trace]}


def descending_frees(n: int, size: int, *, late: bool) -> Any:
    """``n`` blocks of ``size`` freed in descending address order; history from the start, or
    (``late``) from after the mallocs."""
    a = CachingAllocator(SimulatedDevice(1 << 60), native=None)
    if not late:
        a.record_history(stacks=False, max_entries=6 * n + 100)
    ptrs = [a.malloc(size) for _ in range(n)]
    if late:
        a.record_history(stacks=False, max_entries=6 * n + 100)
    for p in sorted(ptrs, reverse=True):
        a.free(p)
    return a.snapshot()


def timed(what: str, fn: Any) -> None:
    start = time.perf_counter()
    fn()
    print(f"{what:<46} {time.perf_counter() - start:8.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[20_000, 80_000, 1_000_000])
    parser.add_argument("--frees", type=int, nargs="*", default=[200_000])
    args = parser.parse_args()
    if hasattr(program, "MAX_STREAMS"):
        program.MAX_STREAMS = max([program.MAX_STREAMS, *args.streams])
    for n in args.streams:
        snap = streams_trace(n)
        timed(f"replay, {n:,} streams", lambda snap=snap: gm.replay(snap))
    for n in args.frees:
        snap = descending_frees(n, 4096, late=True)
        timed(f"suggest_config, {n:,} late descending frees",
              lambda snap=snap: gm.suggest_config(snap))
        snap = descending_frees(n, 12 * MiB, late=False)
        timed(f"replay, {n:,} early descending frees of 12 MiB", lambda snap=snap: gm.replay(snap))


if __name__ == "__main__":
    main()
