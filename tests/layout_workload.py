"""A random malloc/free workload and the block layouts it goes through: from the view's lives,
and as ``replay_segments`` rebuilds them from the trace (the two must agree)."""

from __future__ import annotations

import random
from typing import Any

from render_workload import MiB

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.render.payload_columns import decode_column
from jupyter_gpumem.render.view_detail import view_stack


def random_snapshot(seed: int, steps: int = 400, *, tail: int | None = None) -> Snapshot:
    """A random malloc/free workload on the simulated device; with ``tail`` the history keeps
    only the last events (blocks and segments older than the trace)."""
    rng = random.Random(seed)
    a = CachingAllocator(SimulatedDevice(8 << 30, clock=ManualClock(tick_ns=1000)))
    a.record_history(True, max_entries=tail or 1_000_000)
    live: list[int] = []
    for _ in range(steps):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 64 * MiB)])
            live.append(a.malloc(size))
        if rng.random() < 0.02:
            a.empty_cache()
    return a.snapshot()


def blocks_at(lives: dict[str, Any], k: int) -> set[tuple[int, int, tuple[Any, ...]]]:
    """(address, size, shown frames) of the blocks of ``lives`` live after event ``k``."""
    b = lives["blocks"]
    live = (decode_column(b["start"]) <= k) & (k < decode_column(b["end"]))
    stacks = lives["stacks"]
    out = set()
    for a, size, sid in zip(decode_column(b["addr"])[live].astype(int).tolist(),
                            decode_column(b["size"])[live].astype(int).tolist(),
                            decode_column(b["stack"])[live].tolist(), strict=True):
        frames = tuple(map(tuple, stacks[sid])) if sid >= 0 else ()
        out.add((a, size, frames))
    return out


def segments_at(lives: dict[str, Any], k: int) -> set[tuple[int, int]]:
    s = lives["segments"]
    live = (decode_column(s["start"]) <= k) & (k < decode_column(s["end"]))
    return set(zip(decode_column(s["addr"])[live].astype(int).tolist(),
                   decode_column(s["size"])[live].astype(int).tolist(), strict=True))


def replayed(snap: Snapshot, k: int) -> tuple[set[Any], set[Any]]:
    """The layout after event ``k`` as ``replay_segments`` rebuilds it from the trace."""
    segs = replay_segments(snap, k + 1)
    blocks = {(b["address"], b["size"], tuple(map(tuple, view_stack(b["frames"])))
               if b["frames"] else ())
              for s in segs for b in s["blocks"] if b["state"] != "inactive"}
    return blocks, {(s["address"], s["total_size"]) for s in segs}
