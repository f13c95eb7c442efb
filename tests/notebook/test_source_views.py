"""Every view of ``%gpumem`` over a source registered at run time (``register_source``): the
status line, summary, stats, snapshot, the session plot, the live view, ``%gpumem history``,
and ``%gpumem source NAME|both|all`` (bare: the list), with no change to our code.

``ArenaSource`` is a library's pool as a third party would adapt it: one segment reserved up
front, blocks cut from it in order, counters in PyTorch's keys, and an event history that
records every event or none."""

from __future__ import annotations

import re
import threading
from types import MappingProxyType

import pytest
from bundle_checks import check_bundle
from fake_torch import FakeTorchMemory

from jupyter_gpumem import sources
from jupyter_gpumem.data.schema import Snapshot, TraceEntry
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.notebook.live_view import live_session
from jupyter_gpumem.sources import HistoryMode, SourceBase, registry

MiB = 1 << 20
GiB = 1 << 30
BASE = 0x7F00_0000_0000  # the arena's segment


class ArenaSource(SourceBase):
    """A pool of one ``capacity``-byte segment on a 1 GiB device, blocks cut in address order
    and never reused; ``ready`` false: its driver is not loaded."""

    name = "arena"
    title = "the arena pool (a test library)"
    shows = MappingProxyType({
        "stats": "yes", "blocks": "yes", "history": "yes (every event or none)",
        "cell_peak": "yes; a bound (≤) where the counters cannot tell",
        "stacks": "no: the pool keeps no stacks"})

    def __init__(self, capacity: int = 64 * MiB, *, ready: bool = True) -> None:
        super().__init__(clock_us=self._tick)
        self.capacity = capacity
        self.ready = ready
        self.blocks: dict[int, int] = {}  # address -> size, of the live blocks
        self.next_address = BASE
        self.peak = 0
        self.made = self.freed = 0
        self.events: list[TraceEntry] | None = None  # None: history off
        self._now = 0

    def _tick(self) -> int:
        self._now += 1
        return self._now

    def alloc(self, size: int) -> int:
        address = self.next_address
        self.next_address += size
        self.blocks[address] = size
        self.made += 1
        self.peak = max(self.peak, sum(self.blocks.values()))
        self._record("alloc", address, size)
        return address

    def free(self, address: int) -> None:
        size = self.blocks.pop(address)
        self.freed += 1
        self._record("free_completed", address, size)

    def _record(self, action: str, address: int, size: int) -> None:
        if self.events is not None:
            self.events.append({"action": action, "addr": address, "size": size,  # type: ignore[typeddict-item]
                                "stream": 0, "time_us": self._tick(), "frames": []})

    # -- the source ----------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        return None if self.ready else "its driver is not loaded"

    @property
    def device_index(self) -> int:
        return 0

    @property
    def device_name(self) -> str:
        return "Arena GPU"

    def memory_stats(self) -> dict[str, int]:
        allocated = sum(self.blocks.values())
        return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.current": self.capacity,
                "reserved_bytes.all.peak": self.capacity,
                "allocation.all.current": len(self.blocks), "allocation.all.allocated": self.made,
                "allocation.all.freed": self.freed, "segment.all.current": 1,
                "num_device_alloc": 1}

    def mem_get_info(self) -> tuple[int, int]:
        return GiB - self.capacity, GiB

    def snapshot(self) -> Snapshot:
        blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
                   "frames": []} for a, s in sorted(self.blocks.items())]
        used = sum(self.blocks.values())
        rest = BASE + self.capacity - self.next_address
        if rest:
            blocks.append({"address": self.next_address, "size": rest, "requested_size": 0,
                           "state": "inactive", "frames": []})
        segment = {"device": 0, "address": BASE, "total_size": self.capacity,
                   "allocated_size": used, "active_size": used, "requested_size": used,
                   "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                   "is_expandable": False, "frames": [], "blocks": blocks}
        return {"segments": [segment], "device_traces": [list(self.events or [])]}  # type: ignore[list-item]

    def status_notes(self) -> tuple[str, ...]:
        return (f"pool of {format_bytes(self.capacity)}",)

    def history_on(self) -> bool:
        return self.events is not None

    def record_history(self, mode: HistoryMode, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        if mode == "state":
            raise ValueError("the arena pool keeps no stacks without events")
        self.events = [] if mode == "all" else None


@pytest.fixture(autouse=True)
def _fresh_sources():
    """Every source made again in each test (another test's fake torch is not "all" here)."""
    registry.reset()
    yield
    registry.reset()


@pytest.fixture
def arena():
    """An arena registered as "arena" (the views still on cupy)."""
    made = ArenaSource()
    sources.register_source("arena", made)
    return made






def error_of(result) -> str:
    return str(result.error_in_exec)


def arena_line(arena: ArenaSource, cells: int) -> str:
    allocated = format_bytes(sum(arena.blocks.values()))
    return (f"gpumem · arena device 0 (Arena GPU) · allocated {allocated} (peak "
            f"{format_bytes(arena.peak)}) · reserved 64.0 MiB · device free 960 MiB of 1.0 GiB"
            f" · {'history on' if arena.history_on() else 'history off'} · {cells} cells "
            "recorded · pool of 64.0 MiB")


# -- %gpumem source ------------------------------------------------------------------------------

def test_source_name_picks_a_registered_source(gm, run, arena) -> None:
    result, out = run("%gpumem source arena")
    assert result.success
    assert out.stdout == "gpumem: the views read the arena pool (a test library)\n"
    assert sources.selected() == ("arena",)
    result, out = run("%gpumem source cupy")
    assert out.stdout == "gpumem: the views read our allocator (CuPy)\n"
    assert sources.selected() == ("cupy",)


def test_source_all_is_every_source_readable_here(gm, run, arena) -> None:
    result, out = run("%gpumem source all")
    assert result.success
    # torch and jax cannot be made here (torch is not installed): all leaves them out
    assert sources.selected() == ("cupy", "arena")
    assert out.stdout == ("gpumem: the views read our allocator (CuPy) and the arena pool (a "
                          "test library)\n")


def test_source_both_is_cupy_and_torch(gm, run) -> None:
    result, _ = run("%gpumem source both")  # torch is not installed here: nothing changes
    assert not result.success and sources.selected() == ("cupy",)
    assert error_of(result) == (
        "jupyter_gpumem: source 'torch' needs torch, which is not installed here; the views "
        "stay on cupy.")
    sources.use_torch(FakeTorchMemory())  # torch made once, reading a fake module
    result, out = run("%gpumem source both")
    assert result.success and sources.selected() == ("cupy", "torch")
    assert out.stdout == ("gpumem: the views read our allocator (CuPy) and PyTorch's allocator "
                          "(torch.cuda.memory)\n")
    run("%gpumem source cupy")


def test_an_unknown_source_lists_the_sources_and_changes_nothing(gm, run, arena) -> None:
    result, _ = run("%gpumem source tensorflow")
    assert not result.success and sources.selected() == ("cupy",)
    assert error_of(result) == (
        "source takes torch, cupy or both, all, or source names (cupy, torch, jax, "
        "arena), got 'tensorflow' (see %gpumem? for usage)")


def test_a_source_that_cannot_be_made_says_why(gm, run) -> None:
    def broken() -> ArenaSource:
        raise RuntimeError("the pool's library failed to start")

    sources.register_source("broken", broken)
    try:
        result, _ = run("%gpumem source broken")
        assert not result.success and sources.selected() == ("cupy",)
        assert error_of(result) == (
            "jupyter_gpumem: source 'broken' cannot be made (RuntimeError: the pool's library "
            "failed to start); the views stay on cupy.")
        _, out = run("%gpumem source")
        assert _row(out.stdout, "broken") == [
            "broken", "cannot be made: RuntimeError: the pool's library failed to start"]
    finally:
        sources.unregister_source("broken")


def _row(listing: str, name: str) -> list[str]:
    """The row of ``name`` in a bare ``%gpumem source``, its columns split."""
    (line,) = [ln for ln in listing.splitlines()[1:] if re.match(rf"^\*?\s+{name}\b", ln)]
    return re.split(r"\s{2,}", line.strip())


def test_bare_source_lists_what_each_shows_or_why_not(gm, run, arena) -> None:
    sources.register_source("offline", ArenaSource(ready=False))
    try:
        _, out = run("%gpumem source")
        lines = out.stdout.splitlines()
        assert lines[0] == ("gpumem: the views read cupy (*); %gpumem source NAME|both|all "
                            "picks others")
        assert lines[1].split() == ["source", "what", "shows"]
        assert _row(out.stdout, "cupy") == [
            "*", "cupy", "our allocator (CuPy)",
            "stats, blocks, stacks, history, cell peak, oom, holders, replay"]
        assert _row(out.stdout, "arena") == [
            "arena", "the arena pool (a test library)",
            "stats, blocks, history, cell peak; not stacks, oom, holders, replay"]
        assert _row(out.stdout, "offline") == [
            "offline", "the arena pool (a test library)",
            "cannot be read now: its driver is not loaded"]
        assert _row(out.stdout, "torch")[1].startswith("cannot be made: source 'torch' needs "
                                                       "torch, which is not installed here")
        assert sources.selected() == ("cupy",)  # listing picks nothing
    finally:
        sources.unregister_source("offline")


def test_a_source_that_cannot_be_read_is_picked_and_says_why(gm, run) -> None:
    sources.register_source("offline", ArenaSource(ready=False))
    try:
        result, out = run("%gpumem source offline")
        assert result.success and sources.selected() == ("offline",)
        assert out.stdout == ("gpumem: the views read the arena pool (a test library); offline "
                              "cannot be read now: its driver is not loaded\n")
        _, out = run("%gpumem")
        assert out.outputs[0].data["text/plain"] == "gpumem: its driver is not loaded"
        assert len(out.outputs) == 1  # no layout
        for view in ("summary", "stats", "snapshot", "plot"):
            result, _ = run(f"%gpumem {view}")
            assert error_of(result) == ("jupyter_gpumem: no memory source can be read now "
                                        "(offline: its driver is not loaded).")
        _, out = run("%gpumem history on")  # our allocators follow the settings all the same
        assert out.stdout == ("gpumem: history on (stacks on, up to 100000 events); offline "
                              "cannot be read now: its driver is not loaded\n")
        run("%gpumem source cupy")
    finally:
        sources.unregister_source("offline")


# -- the readouts ----------------------------------------------------------------------------------

def test_status_line_of_a_registered_source(gm, run, arena) -> None:
    run("%gpumem source arena")
    arena.alloc(3 * MiB)
    cells = gm.ledger.recorded(every_source=True)  # the cells before this one
    _, out = run("%gpumem")
    assert out.outputs[0].data["text/plain"] == arena_line(arena, cells)
    # and the layout of its one segment as the cell ran
    payload = check_bundle(out.outputs[1].data, kind="snapshot")
    assert re.fullmatch(r"block layout when cell \[\d+\] ran \(%gpumem snapshot shows it now\)",
                        payload["title"])
    assert out.outputs[1].data["text/plain"] == (
        "GPU memory snapshot: 1 segments, 64.0 MiB reserved, 3.0 MiB allocated in 1 blocks, 0 "
        "trace events")


def test_status_line_rows_labelled_by_source(gm, run, arena, sim) -> None:
    run("%gpumem source all")
    arena.alloc(2 * MiB)
    arena_cells = gm.ledger.recorded("arena")  # the cells before this one
    _, out = run("p = g.caching_allocator_alloc(3 * MiB)\n%gpumem")
    lines = out.outputs[0].data["text/plain"].splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("cupy: gpumem · sim device 0 (Simulated GPU 0) · allocated "
                               "3.0 MiB (peak 3.0 MiB) · reserved 20.0 MiB")
    assert lines[1] == "arena: " + arena_line(arena, arena_cells)
    # the layout shown is the first source's that has segments: ours
    try:
        title = check_bundle(out.outputs[1].data, kind="snapshot")["title"]
        assert title.startswith("cupy: block layout when cell [")
    finally:
        run("g.caching_allocator_delete(p)")


def test_a_source_that_raises_gives_a_cannot_read_line(gm, run, arena, monkeypatch) -> None:
    run("%gpumem source all")

    def fail() -> dict[str, int]:
        raise RuntimeError("device lost")

    monkeypatch.setattr(arena, "memory_stats", fail)
    _, out = run("%gpumem")
    lines = out.outputs[0].data["text/plain"].splitlines()
    assert lines[0].startswith("cupy: gpumem · sim device 0")
    assert lines[1] == ("arena: gpumem · arena: cannot read the arena pool (a test library) "
                        "(device lost)")


def test_summary_stats_snapshot_one_part_a_source(gm, run, arena) -> None:
    run("%gpumem source arena")
    arena.alloc(4 * MiB)
    _, out = run("%gpumem stats --json")
    assert '"allocated_bytes.all.current": 4194304' in out.stdout
    _, out = run("%gpumem stats")
    assert "allocations made 1, freed 0 · segments from the device 1" in out.stdout
    _, out = run("%gpumem summary")
    assert out.stdout.startswith("|====") and "Allocated memory" in out.stdout
    _, out = run("%gpumem snapshot")
    assert out.outputs and not out.stdout  # the picture of the arena's segment
    run("%gpumem source all")
    _, out = run("%gpumem stats")
    assert out.stdout.startswith("cupy:\n") and "\narena:\n" in out.stdout
    _, out = run("%gpumem summary")
    assert out.stdout.startswith("cupy:\n|====") and "\narena:\n|====" in out.stdout
    _, out = run("%gpumem snapshot")  # ours has no segment on a fresh device: a line
    assert out.stdout.startswith("cupy: 0 segment(s), 0 B reserved, 0 B allocated\narena:\n")
    assert len(out.outputs) == 1


def test_plot_is_each_sources_session_timeline(gm, run, arena) -> None:
    run("%gpumem source arena")
    _, out = run("%gpumem plot")  # the arena can record: the session's words, as for ours
    assert out.stdout == ("gpumem: no event history is recorded (history is off), and no "
                          "%%gpumem_trace cell has recorded any; run %gpumem history on, then "
                          "the cells to look at.\n")
    _, out = run("%gpumem history on")
    assert out.stdout == ("gpumem: history on (stacks on, up to 100000 events); arena's history "
                          "on (stacks on, up to 100000 events)\n")
    _, out = run("%gpumem plot")  # nothing recorded yet: the plot says so
    (picture,) = out.outputs
    assert picture.data["text/plain"] == "timeline of 0 events"
    a = arena.alloc(5 * MiB)
    arena.free(a)
    arena.alloc(1 * MiB)
    _, out = run("%gpumem plot")
    (picture,) = out.outputs
    assert picture.data["text/plain"] == "timeline of 3 events: the session's history"
    assert "Plot of allocated and reserved GPU memory over the timeline of 3 events" in (
        picture.data["text/html"])
    run("%gpumem source all")  # ours has no history to plot: one line, then the arena's plot
    _, out = run("%gpumem history state\n%gpumem plot")
    assert out.stdout.startswith(
        "gpumem: history state: the lines of live blocks only, no events (no timeline, no "
        "replay); arena's history as it was: the arena pool keeps no stacks without events\n"
        "cupy: gpumem: no event history is recorded (history is state)")
    assert [o.data["text/plain"] for o in out.outputs] == [
        "arena: timeline of 3 events: the session's history"]


def test_history_off_reaches_every_source(gm, run, arena, sim) -> None:
    run("%gpumem source all")
    run("%gpumem history on --max-entries 50")
    assert arena.history_on() and sim.history is not None and sim.history.max_entries == 50
    _, out = run("%gpumem history off")
    assert out.stdout == "gpumem: history off; arena's history off\n"
    assert not arena.history_on() and sim.history is None


# -- the live view ---------------------------------------------------------------------------------

def test_live_session_samples_the_source(arena) -> None:
    pytest.importorskip("anywidget")
    arena.alloc(6 * MiB)
    session = live_session(arena)
    assert session is not None
    try:
        assert session.sample_fn() == (6 * MiB, 64 * MiB, 64 * MiB)  # device used: total - free
    finally:
        session.stop()
    assert not [t for t in threading.enumerate() if t.name == "jupyter_gpumem-sampler"]


def test_live_session_without_device_numbers(arena, monkeypatch) -> None:
    pytest.importorskip("anywidget")

    def cannot_say() -> tuple[int, int]:
        raise NotImplementedError

    monkeypatch.setattr(arena, "mem_get_info", cannot_say)
    session = live_session(arena)
    assert session is not None
    try:
        assert session.sample_fn() == (0, 64 * MiB, None)
    finally:
        session.stop()


def test_bare_gpumem_follows_the_first_source(gm, run, arena) -> None:
    pytest.importorskip("anywidget")
    gm.settings.live_view = True
    try:
        run("%gpumem source arena")
        arena.alloc(2 * MiB)
        run("%gpumem")
        assert gm.live is not None and gm.live.sample_fn()[0] == 2 * MiB
        assert gm.live.widget.title == ""
        run("%gpumem source all")
        run("%gpumem")
        assert gm.live.widget.title == "(cupy)" and gm.live.sample_fn()[0] == 0
    finally:
        gm.stop_live()
