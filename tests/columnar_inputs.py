"""Snapshots whose trace is given both as a list of dicts and as ``TraceColumns``: every reader
of a trace must give the same result for the two (issue 22)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from expandable_workload import random_expandable

from jupyter_gpumem.data.columns import TraceColumns, as_columns, plain_snapshot
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.sizes import MiB
from jupyter_gpumem.devices.simulated import ManualClock, SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator


def oom_snapshot() -> Snapshot:
    """A recording with out-of-memory errors, frees and a cached segment released."""
    device = SimulatedDevice(64 * MiB, clock=ManualClock(tick_ns=1000))
    a = CachingAllocator(device, native=None)
    a.record_history(True, max_entries=10_000)
    live = [a.malloc(s) for s in (512, 3 * MiB, 20 * MiB, 700, 9 * MiB)]
    a.free(live.pop(1))
    for size in (60 * MiB, 50 * MiB):
        with contextlib.suppress(MemoryError):
            a.malloc(size)
    live.append(a.malloc(4 * MiB))
    for p in live[:-1]:
        a.free(p)
    a.empty_cache()
    live.append(a.malloc(1000))
    return a.snapshot()


def with_unknown_action(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with an event of an action this package does not know in its trace."""
    snap = plain_snapshot(snapshot)
    trace = list(snap["device_traces"][0])
    e = dict(trace[len(trace) // 2])
    trace.insert(len(trace) // 2, {**e, "action": "future_event", "compile_context": "x"})
    snap["device_traces"] = [trace, *snap["device_traces"][1:]]
    return snap


def both(snapshot: Snapshot) -> tuple[Snapshot, Snapshot]:
    """``(snapshot with lists of dicts, the same with TraceColumns)``."""
    dicts = plain_snapshot(snapshot)
    dicts["device_traces"] = [list(t) for t in dicts["device_traces"]]
    cols: dict[str, Any] = copy.copy(dict(dicts))
    cols["device_traces"] = [as_columns(t) for t in dicts["device_traces"]]
    assert all(isinstance(t, TraceColumns) for t in cols["device_traces"])
    return dicts, cols  # type: ignore[return-value]


def snapshots() -> dict[str, Snapshot]:
    """Named snapshots covering OOMs, expandable segments (segment_map / segment_unmap) and an
    unknown action."""
    oom = oom_snapshot()
    expandable = random_expandable(3, None, steps=120)
    return {"oom": oom, "expandable": expandable, "unknown_action": with_unknown_action(oom),
            "expandable_unknown": with_unknown_action(expandable)}
