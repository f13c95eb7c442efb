"""A snapshot taken while other threads allocate is one consistent moment.

Its counters, its segments and blocks, and its trace must describe the same state: a snapshot
assembled from separate reads of a moving allocator contradicts itself.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpumem import CachingAllocator, OutOfMemoryError, SimulatedDevice, replay_segments

KiB = 1 << 10
MiB = 1 << 20
WORKERS = 8
OPS = 1200  # at least, per worker
SNAPSHOTS = 20  # workers go on until this many snapshots were taken (or MAX_OPS)
MAX_OPS = 6000
SIZES = [512, 3 * KiB, 100 * KiB, MiB, 3 * MiB, 12 * MiB]


@pytest.fixture(autouse=True)
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    yield
    sys.setswitchinterval(old)


def contradictions(snap: Any) -> list[str]:
    """What in one snapshot disagrees with the rest of it."""
    out = []
    stats = snap["jupyter_gpumem"]["stats"]
    segments = snap["segments"]
    active = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    pairs = [
        ("allocated_bytes.all.current", sum(b["size"] for b in active)),
        ("allocation.all.current", len(active)),
        ("requested_bytes.all.current", sum(b["requested_size"] for b in active)),
        ("reserved_bytes.all.current", sum(s["total_size"] for s in segments)),
        ("segment.all.current", len(segments)),
    ]
    for key, seen in pairs:
        if stats[key] != seen:
            out.append(f"{key} is {stats[key]} but the blocks say {seen}")
    for s in segments:
        if sum(b["size"] for b in s["blocks"]) != s["total_size"]:
            out.append(f"segment {s['address']:#x}: blocks do not cover it")
    trace = snap["device_traces"][0]
    if trace:
        last = trace[-1]
        if last["action"] != "snapshot" or last["size"] != stats["allocated_bytes.all.current"]:
            out.append(f"the trace ends with {last['action']} of {last['size']} B")
        if snap["jupyter_gpumem"]["history_dropped"] == 0:
            # Undoing every event of a complete trace must lead back to the empty allocator.
            try:
                start = replay_segments(snap, 0)
            except Exception as exc:  # a trace of another moment cannot be undone
                out.append(f"the trace does not replay: {exc!r}")
            else:
                if start != []:
                    out.append("the trace does not lead back to the empty start")
    return out


@pytest.mark.parametrize("native", [False, True], ids=["python", "c"])
@pytest.mark.parametrize("history", ["off", "events", "stacks"])
def test_snapshot_is_one_moment_under_threads(native: bool, history: str) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    if history != "off":
        a.record_history(stacks=history == "stacks", max_entries=1_000_000)
    start = threading.Barrier(WORKERS + 1)
    done = threading.Event()
    errors: list[BaseException] = []
    found: list[str] = []
    taken = [0]

    def work(tid: int) -> None:
        rng = random.Random(tid)
        mine: list[int] = []
        try:
            start.wait()
            ops = 0
            while ops < OPS or (taken[0] < SNAPSHOTS and ops < MAX_OPS):
                ops += 1
                if mine and rng.random() < 0.5:
                    a.free(mine.pop(rng.randrange(len(mine))))
                else:
                    with contextlib.suppress(OutOfMemoryError):
                        mine.append(a.malloc(rng.choice(SIZES), stream=tid % 2))
            for p in mine:
                a.free(p)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def snapshots() -> None:
        try:
            start.wait()
            while not done.is_set():
                found.extend(contradictions(a.snapshot()))
                taken[0] += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    snapper = threading.Thread(target=snapshots)
    for t in (*workers, snapper):
        t.start()
    for t in workers:
        t.join()
    done.set()
    snapper.join()
    assert errors == []
    assert taken[0] > 0
    assert found == [], f"{len(found)} contradictions in {taken[0]} snapshots: {found[:5]}"
    assert contradictions(a.snapshot()) == []
    a.check_invariants()
