"""One trace and one replay input over any ``MemorySource``: ``%%gpumem_trace`` and
``%gpumem replay`` on a source registered at run time (``register_source``), written here on
``SourceBase`` with a few lines of bookkeeping: no allocator of ours, no PyTorch.

``Pool`` hands out one segment a request, logs PyTorch's trace events while its history is on
(each with the caller's frame, so the trace names the cell's lines), and says what its buffers
are (``owners``), so the holder search finds the variables. ``Pool(history=False)`` records no
events, as JAX: the trace shows its end state and says so.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from IPython.core.error import UsageError

from jupyter_gpumem import sources
from jupyter_gpumem.data.owners import Owner
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.replay_cmd import recorded_trace, replay_offer
from jupyter_gpumem.notebook.session_trace import kept_cells, session_timeline
from jupyter_gpumem.sources.base import SourceBase

MiB = 1 << 20
CAPACITY = 1 << 30


@dataclass(eq=False)
class Buffer:
    """What a ``Pool`` hands out: the memory at ``address``, ``nbytes`` long. Its ``data.ptr``
    is the surface the holder search reads today (a CuPy array's); ``Pool.owners`` says the
    same for the search that reads a source's owners."""

    address: int
    nbytes: int

    @property
    def data(self) -> Any:
        return types.SimpleNamespace(ptr=self.address)


class Pool(SourceBase):
    """A minimal memory source (see the module docstring)."""

    name = "pool"
    title = "a test pool"
    owners = (Owner("pool buffer", lambda t: t is Buffer, lambda b: (b.address, b.nbytes)),)

    def __init__(self, *, history: bool = True) -> None:
        self.now = 1_000  # µs: each event and each read of the clock is one later
        super().__init__(clock_us=self._tick)
        self.records = history
        self.live: dict[int, int] = {}  # address -> size
        self.frames: dict[int, list[dict[str, Any]]] = {}  # address -> the allocating line
        self.events: list[dict[str, Any]] | None = None  # None: history off
        self.peak = 0
        self._next = 0x5000_0000_0000  # not where the simulated device starts

    def _tick(self) -> int:
        self.now += 1
        return self.now

    def _log(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        if self.events is not None:
            self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                                "time_us": self._tick(), "frames": frames})

    def alloc(self, size: int) -> Buffer:
        caller = sys._getframe(1)
        frames = [{"filename": caller.f_code.co_filename, "line": caller.f_lineno,
                   "name": caller.f_code.co_name}]
        addr, self._next = self._next, self._next + size
        self.live[addr] = size
        self.frames[addr] = frames
        self.peak = max(self.peak, sum(self.live.values()))
        self._log("segment_alloc", addr, size, frames)
        self._log("alloc", addr, size, frames)
        return Buffer(addr, size)

    def free(self, buf: Buffer) -> None:
        size = self.live.pop(buf.address)
        del self.frames[buf.address]
        for action in ("free_requested", "free_completed", "segment_free"):
            self._log(action, buf.address, size, [])

    @property
    def device_index(self) -> int:
        return 0

    def memory_stats(self) -> dict[str, int]:
        used = sum(self.live.values())
        return {"allocated_bytes.all.current": used, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.current": used, "reserved_bytes.all.peak": self.peak}

    def mem_get_info(self) -> tuple[int, int]:
        return CAPACITY - sum(self.live.values()), CAPACITY

    def snapshot(self) -> Any:
        segments = [{"device": 0, "address": a, "total_size": s, "allocated_size": s,
                     "active_size": s, "requested_size": s, "stream": 0,
                     "segment_type": "large",
                     "blocks": [{"address": a, "size": s, "requested_size": s,
                                 "state": "active_allocated", "frames": self.frames[a]}]}
                    for a, s in sorted(self.live.items())]
        return {"segments": segments, "device_traces": [list(self.events or [])]}

    def history_on(self) -> bool:
        return self.events is not None

    def record_history(self, mode: Any, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        if mode == "all" and not self.records:
            super().record_history(mode)  # ValueError: no event history
        self.events = [] if mode == "all" else None


@pytest.fixture
def pool() -> Iterator[Pool]:
    made = Pool()
    sources.register_source("pool", made)
    yield made
    sources.use_sources(("cupy",))
    sources.unregister_source("pool")


@pytest.fixture
def on_pool(shell, run, sim, pool):
    """The extension loaded, every view on the pool alone (``%gpumem source pool``)."""
    assert run("%load_ext jupyter_gpumem")[0].success
    get_extension(shell).settings.live_view = False
    shell.user_ns["pool"] = pool
    sources.use_sources(("pool",))
    assert run("MiB = 1 << 20")[0].success
    return pool


CELL = ("%%gpumem_trace -o t --no-plot\n"
        "keep = pool.alloc(5 * MiB)\n"
        "tmp = pool.alloc(3 * MiB)\n"
        "pool.free(tmp)\n"
        "del tmp")


def test_trace_of_a_registered_source(on_pool, run, shell) -> None:
    result, out = run(CELL)  # cell 3
    assert result.success, result.error_in_exec
    t = shell.user_ns["t"]
    assert t.title == "cell [3] · pool"
    assert [e["action"] for e in t.snapshot["device_traces"][0]] == [
        "segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed",
        "segment_free"]
    assert t.peak_allocated == 8 * MiB
    assert t.bands == "site"  # a source without trace_bands: by site
    assert [(u.site, u.bytes) for u in t.top_sites] == [
        ("cell [3] line 2", 5 * MiB), ("cell [3] line 3", 3 * MiB)]
    assert [(b.size, b.site, b.holders) for b in t.surviving] == [
        (5 * MiB, "cell [3] line 2", ("keep",))]
    assert not on_pool.history_on()  # off before the cell: off again
    assert out.outputs[0].data["text/plain"].splitlines()[1:] == [
        "Top allocation sites at the peak:",
        "  5.0 MiB  1×  cell [3] line 2",
        "  3.0 MiB  1×  cell [3] line 3",
        "Blocks surviving the traced code:",
        "  0x500000000000  5.0 MiB  cell [3] line 2  ← keep"]


def test_the_sessions_timeline_and_replay_input_keep_the_traced_cell(on_pool, run) -> None:
    assert run(CELL)[0].success  # cell 3
    assert kept_cells(on_pool) == [3]
    found = session_timeline(on_pool)
    assert not isinstance(found, str)
    snap, caption = found
    assert caption == ("timeline of 7 events: traced cells [3] (history is off: other cells "
                       "record no events; %gpumem history on records every cell)")
    replayed = recorded_trace(on_pool)
    assert not isinstance(replayed, str)
    assert replayed[1] == 7 and replayed[0]["device_traces"] == snap["device_traces"]
    assert replay_offer(on_pool) is None  # it says no allocator setting (replay_setting)
    result, _ = run("%gpumem replay pool --config defaults -o r")
    assert result.success, result.error_in_exec
    assert run("%gpumem replay last --config defaults")[0].success  # the only source read


def test_a_history_the_user_had_on_is_left_on_and_cut_by_time(on_pool, run, shell) -> None:
    on_pool.record_history("all")
    assert run("early = pool.alloc(MiB)")[0].success
    result, _ = run("%%gpumem_trace -o t --no-plot\nlate = pool.alloc(2 * MiB)")
    assert result.success, result.error_in_exec
    t = shell.user_ns["t"]
    assert [(e["action"], e["size"]) for e in t.snapshot["device_traces"][0]] == [
        ("segment_alloc", 2 * MiB), ("alloc", 2 * MiB)]
    assert [b.holders for b in t.surviving] == [("late",)]
    assert on_pool.history_on() and len(on_pool.events or []) == 4  # the user's, untouched
    assert kept_cells(on_pool) == []  # the history keeps them itself


def test_a_source_with_no_event_history_shows_its_end_state(shell, run, sim) -> None:
    quiet = Pool(history=False)
    sources.register_source("pool", quiet)
    try:
        assert run("%load_ext jupyter_gpumem")[0].success
        get_extension(shell).settings.live_view = False
        shell.user_ns["pool"] = quiet
        sources.use_sources(("pool",))
        result, out = run("%%gpumem_trace -o t --no-plot\nkeep = pool.alloc(4 << 20)")
        assert result.success, result.error_in_exec
        t = shell.user_ns["t"]
        assert t.title == "cell [2] · pool, no event history"
        assert t.events == 0 and not t.history_on
        assert t.peak_allocated == 4 * MiB  # its counters' peak, exact
        assert [b["size"] for s in t.layout_end for b in s["blocks"]] == [4 * MiB]
        text = out.outputs[0].data["text/plain"].splitlines()
        assert text[0].startswith("gpumem cell [2] · pool, no event history: 0 events in ")
        assert text[1:] == [  # the end state: what is live, and the lines that allocated it
            "Top allocation sites at the peak:",
            "  4.0 MiB  1×  cell [2] line 2",
            "No trace events: history was off when this was recorded."]
        result, _ = run("%gpumem replay last")
        assert isinstance(result.error_in_exec, UsageError)
        assert str(result.error_in_exec) == (
            "gpumem: nothing to replay: a test pool records no event history.")
    finally:
        sources.use_sources(("cupy",))
        sources.unregister_source("pool")


def test_the_api_takes_a_source_by_name_or_object(pool) -> None:
    import jupyter_gpumem as g

    with g.trace(source="pool", plot=False) as t:
        kept = pool.alloc(MiB)
    assert t.title == "pool" and [b.holders for b in t.surviving] == [("kept",)]
    with g.trace(source=pool, plot=False, bands="holder") as t:
        pool.free(kept)
    assert t.bands == "holder" and t.events == 3
    with pytest.raises(ValueError) as bad_name:
        g.trace(source="nope")
    assert str(bad_name.value) == "no source 'nope': the sources are cupy, torch, jax, pool"
    with pytest.raises(TypeError) as not_one:
        g.trace(source=object())  # type: ignore[arg-type]
    assert str(not_one.value) == "source must be a source's name or a MemorySource, got object"
    with pytest.raises(ValueError) as both:
        g.trace(source="pool", device=0)
    assert str(both.value) == ("device= picks our allocator's device; the source 'pool' reads "
                               "its own")


def test_two_sources_one_tracer_each_in_the_order_picked(on_pool, run, shell, sim) -> None:
    sources.use_sources(("cupy", "pool"))
    run("import jupyter_gpumem as g")  # cell 3
    result, _ = run("%%gpumem_trace -o t --no-plot\n"
                    "p = g.caching_allocator_alloc(2 * MiB)\n"
                    "b = pool.alloc(6 * MiB)")  # cell 4
    assert result.success, result.error_in_exec
    ours, theirs = shell.user_ns["t"]
    assert (ours.title, ours.peak_allocated) == ("cell [4]", 2 * MiB)
    assert (theirs.title, theirs.peak_allocated) == ("cell [4] · pool", 6 * MiB)
    assert [b.holders for b in ours.surviving] == [("p",)]
    assert [b.holders for b in theirs.surviving] == [("b",)]
    assert sim.history.max_entries == 0  # ours back to "state", the extension's default
    run("g.caching_allocator_delete(p)")
