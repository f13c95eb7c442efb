"""History keeps only what its live events and blocks refer to.

Every stack interned by the history, and every code object it keeps alive, must be held by an
event still in the ring buffer, a live block or a live segment (Note [Interned stacks are
reference-counted] in ``_history``); many distinct functions or notebook cells must not make it
grow past that, and stopping the history lets go of everything but the live blocks' stacks.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from types import CodeType

import pytest

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine.history import CODE_CACHE_SLACK

MiB = 1 << 20
DISTINCT = 2000
CORES = pytest.mark.parametrize("native", [False, True], ids=["python", "c"])


def make_function(a: CachingAllocator, i: int) -> Callable[[], int]:
    """A new function, with its own code object, that allocates one block."""
    namespace = {"a": a}
    exec(compile(f"def f{i}():\n    return a.malloc({512 * (1 + i % 4)})\n",
                 f"<generated {i}>", "exec"), namespace)
    return namespace[f"f{i}"]  # type: ignore[return-value]


def run_cell(a: CachingAllocator, i: int, keep: list[int]) -> None:
    """Run source compiled as a notebook cell: its module-level code allocates and frees."""
    source = f"p = a.malloc({1024 + i})\nkeep.append(p) if {i} % 500 == 0 else a.free(p)\n"
    exec(compile(source, f"<ipython-input-{i}-0123456789ab>", "exec"), {"a": a, "keep": keep})


def held(a: CachingAllocator) -> tuple[int, int]:
    stacks, codes = a._core.history_stats()
    return stacks, codes


@CORES
def test_distinct_functions_stay_bounded_by_live_events(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    a.record_history(stacks=True, max_entries=100)
    first: weakref.ref[CodeType] | None = None
    live = []
    for i in range(DISTINCT):
        f = make_function(a, i)
        if i == 1:
            first = weakref.ref(f.__code__)
        p = f()
        if i % 400 == 0:
            live.append(p)  # a few blocks stay live, holding their stacks
        else:
            a.free(p)
        del f
    stacks, codes = held(a)
    # Each event holds one stack; a live block or segment holds at most one more.
    assert stacks <= 100 + len(live) + a.memory_stats()["segment.all.current"]
    assert codes <= 2 * (stacks * 3) + CODE_CACHE_SLACK + 1, (stacks, codes)
    assert codes < DISTINCT // 2
    gc.collect()
    assert first is not None and first() is None, "the first function's code is still kept"
    a.snapshot()
    a.record_history(enabled=False)
    stacks, codes = held(a)
    # Only the live blocks (and their segments) keep a stack now.
    assert stacks <= 2 * len(live)
    for p in live:
        a.free(p)
    assert held(a)[0] <= a.memory_stats()["segment.all.current"]  # the segments' own stacks


@CORES
def test_stopping_releases_every_stack_but_the_live_blocks(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    a.record_history(stacks=True)
    functions = [make_function(a, i) for i in range(50)]
    codes = [weakref.ref(f.__code__) for f in functions]
    ptrs = [f() for f in functions]
    kept = ptrs.pop(0)
    for p in ptrs:
        a.free(p)
    a.snapshot()  # the frame table caches frames of these codes too
    assert held(a)[0] >= 50
    del functions
    gc.collect()
    assert all(c() is not None for c in codes)  # the history holds them while it records
    a.record_history(enabled=False)
    gc.collect()
    stacks, _ = held(a)
    assert stacks <= 2  # the live block's stack and its segment's
    assert codes[0]() is not None  # the live block's own code stays
    assert [c for c in codes[1:] if c() is not None] == []
    snap = a.snapshot()
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert live[0]["frames"][0]["name"] == "f0"
    a.free(kept)
    a.empty_cache()
    assert held(a)[0] == 0
    # Code objects of stacks released with the history off go at the next call (bounded by
    # what was live when it stopped meanwhile).
    a.record_history(enabled=False)
    gc.collect()
    assert held(a)[0] == 0
    assert codes[0]() is None


@CORES
def test_compiled_cells_stay_bounded(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    a.record_history(stacks=True, max_entries=1000)
    keep: list[int] = []
    for i in range(DISTINCT):
        run_cell(a, i, keep)
    stacks, codes = held(a)
    assert stacks <= 1000 + len(keep) + a.memory_stats()["segment.all.current"]
    assert codes < DISTINCT // 2, (stacks, codes)
    a.record_history(enabled=False)
    stacks, codes = held(a)
    assert stacks <= 2 * len(keep)
    for p in keep:
        a.free(p)
    assert held(a)[0] <= a.memory_stats()["segment.all.current"]


@CORES
def test_state_mode_keeps_stacks_of_live_blocks_only(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    a.record_history(stacks=True, max_entries=0)
    ptrs = [make_function(a, i)() for i in range(300)]
    stacks, _ = held(a)
    assert stacks <= 300 + a.memory_stats()["segment.all.current"]
    for p in ptrs:
        a.free(p)
    assert held(a)[0] <= a.memory_stats()["segment.all.current"]
    a.empty_cache()
    assert held(a)[0] == 0


@CORES
def test_stack_ids_are_not_reused(native: bool) -> None:
    """A released stack's id never names another stack: caches keyed by id stay right."""
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    a.record_history(stacks=True, max_entries=4)
    seen: dict[int, str] = {}
    for i in range(40):
        p = make_function(a, i)()
        snap = a.snapshot()
        live = [b for s in snap["segments"] for b in s["blocks"]
                if b["state"] == "active_allocated"]
        sid = next(row.stack_id for row in a.state().blocks if row.allocated)
        name = live[0]["frames"][0]["name"]
        assert name == f"f{i}"
        assert seen.setdefault(sid, name) == name
        a.free(p)
