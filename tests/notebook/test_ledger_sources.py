"""The per-cell ledger over any ``MemorySource``: an in-test source (``DictSource``, a dict of
blocks on ``SourceBase``) drives the rows, the cell's peak (exact and a bound), the end states
and their diff, the causes with their holders and lines, and two sources at once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from cupy_like import Array

from jupyter_gpumem import CachingAllocator
from jupyter_gpumem.data.schema import BlockInfo, Frame, SegmentInfo, Snapshot, TraceEntry
from jupyter_gpumem.notebook.advice import CellCause, footer_text
from jupyter_gpumem.notebook.ledger import Ledger, row_source, source_label
from jupyter_gpumem.sources import SourceBase
from jupyter_gpumem.sources.cupy import CupySource

MiB = 1 << 20
CELL_FILE = "<ipython-input-5-abc>"  # the file a notebook cell's code is compiled under


class Clock:
    """Seconds for the ledger's wall time: a quarter second a read."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


class DictSource(SourceBase):
    """A memory source that is a dict of live blocks, address -> (size, frames): each block is a
    segment of its own, freed to the device with it; ``history`` records trace events."""

    title = "a dict of blocks"

    def __init__(self, name: str = "dict", *, history: bool = False) -> None:
        self.us = 0
        super().__init__(clock_us=self._tick)
        self.name = name
        self.device = 0
        self.blocks: dict[int, tuple[int, list[Frame]]] = {}
        self.history = history
        self.events: list[TraceEntry] = []
        self.next_address = 0x7F0000000000
        self.peak = self.allocs = self.frees = self.segments = 0

    def _tick(self) -> int:
        self.us += 1
        return self.us

    def malloc(self, size: int, frames: Iterable[Frame] = ()) -> int:
        addr, self.next_address = self.next_address, self.next_address + size
        self.blocks[addr] = (size, list(frames))
        self.allocs += 1
        self.segments += 1
        self.peak = max(self.peak, self.memory_allocated())
        self._event("segment_alloc", addr, size)
        self._event("alloc", addr, size)
        return addr

    def free(self, addr: int) -> None:
        size, _ = self.blocks.pop(addr)
        self.frees += 1
        for action in ("free_requested", "free_completed", "segment_free"):
            self._event(action, addr, size)

    def _event(self, action: Any, addr: int, size: int) -> None:
        if self.history:
            self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                                "time_us": self._tick(), "frames": []})

    # -- the protocol ----------------------------------------------------------------------------

    @property
    def device_index(self) -> int:
        return self.device

    def memory_stats(self) -> dict[str, int]:
        allocated = sum(size for size, _ in self.blocks.values())
        return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.current": allocated, "allocation.all.allocated": self.allocs,
                "allocation.all.freed": self.frees, "segment.all.allocated": self.segments,
                "num_ooms": 0}

    def mem_get_info(self) -> tuple[int, int]:
        return 1 << 30, 1 << 30

    def history_on(self) -> bool:
        return self.history

    def snapshot(self) -> Snapshot:
        segments: list[SegmentInfo] = []
        for addr, (size, frames) in sorted(self.blocks.items()):
            block: BlockInfo = {"address": addr, "size": size, "requested_size": size,
                                "state": "active_allocated", "frames": frames}
            segments.append({"device": self.device, "address": addr, "total_size": size,
                             "allocated_size": size, "active_size": size,
                             "requested_size": size, "stream": 0, "segment_type": "large",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                             "blocks": [block]})
        return {"segments": segments, "device_traces": [list(self.events)]}


def in_cell(line: int) -> list[Frame]:
    """A stack allocated from line ``line`` of cell 5, through a helper in ``model.py``."""
    return [{"filename": "/home/u/model.py", "line": 9, "name": "make"},
            {"filename": CELL_FILE, "line": line, "name": "<module>"}]


@pytest.fixture
def src() -> DictSource:
    return DictSource()


def ledger_of(*sources: Any, **options: Any) -> Ledger:
    return Ledger(clock=Clock(), sources_for=lambda: sources, **options)


def test_one_cell_row_of_a_source(src: DictSource) -> None:
    ledger = ledger_of(src)
    before = src.malloc(MiB)
    with ledger.cell(1, "import x\ny = make(3)"):
        kept = src.malloc(3 * MiB)
        src.free(src.malloc(5 * MiB))
    (row,) = ledger.rows
    assert row == {"cell": 1, "source": "y = make(3)", "allocated_delta": 3 * MiB,
                   "reserved_delta": 3 * MiB, "peak_allocated": 9 * MiB, "allocs": 2,
                   "frees": 1, "segments_new": 2, "ooms": 0, "wall_s": 0.25,
                   "start_event": -1, "end_event": -1, "memory_source": "dict",
                   "peak_exact": True}
    assert row_source(row) == "dict" and ledger.recorded("dict") == 1 and ledger.recorded() == 0
    state = ledger.states_of("dict")[1]
    assert (state[before].cell, state[kept].cell) == (None, 1)  # from before the ledger: nobody's
    assert ledger.states == {}  # our allocator's: none recorded
    assert ledger.causes[0].new_bytes == 3 * MiB


def test_peak_exact_a_bound_and_exact_again_from_history(src: DictSource) -> None:
    ledger = ledger_of(src)
    src.free(src.malloc(8 * MiB))  # the user's peak: 8 MiB, before the cell
    with ledger.cell(1):
        src.free(src.malloc(2 * MiB))
    row = ledger.rows[-1]
    assert (row["peak_allocated"], row["peak_exact"]) == (8 * MiB, False)  # at most the peak
    assert "peak ≤ 8.0 MiB" in footer_text(row, 0)
    assert " ≤ 8.0 MiB " in ledger.table().text()
    with ledger.cell(2):  # the counter passes the peak: exact
        src.free(src.malloc(10 * MiB))
    assert (ledger.rows[-1]["peak_allocated"], ledger.rows[-1]["peak_exact"]) == (10 * MiB, True)
    src.history = True  # the events since the cell's start tell it exactly
    with ledger.cell(3):
        src.free(src.malloc(2 * MiB))
    assert (ledger.rows[-1]["peak_allocated"], ledger.rows[-1]["peak_exact"]) == (2 * MiB, True)


def test_end_states_and_diff_of_a_source(src: DictSource) -> None:
    ledger = ledger_of(src)
    with ledger.cell(1):
        a = src.malloc(2 * MiB)
    with ledger.cell(2):
        b = src.malloc(3 * MiB, in_cell(4))
    with ledger.cell(3):
        src.free(a)
    assert list(ledger.states_of("dict")) == [1, 2, 3]
    assert ledger.states_of("dict")[3][b].cell == 2  # a snapshot's stacks compare by address
    d = ledger.diff(1, 3, "dict")
    assert (d.new, d.gone, d.net) == ([ledger.states_of("dict")[3][b]],
                                      [ledger.states_of("dict")[1][a]], MiB)
    assert d.text() == ("dict: cell [1] → cell [3]: 1 new block(s) (3.0 MiB), 1 freed (2.0 MiB), "
                        "net +1.0 MiB\n"
                        f"  +  {b:#x}  3.0 MiB  [2]  model.py:9\n"
                        f"  -  {a:#x}  2.0 MiB  [1]  (line unknown: history off)")
    assert ledger.holders(memory_source="dict") == [(2, "model.py:9", 3 * MiB, 1)]
    with pytest.raises(KeyError, match="kept: 1, 2, 3"):
        ledger.diff(1, 4, "dict")


def test_causes_name_holders_and_the_cells_line(src: DictSource) -> None:
    namespace: dict[str, Any] = {}
    ledger = ledger_of(src, namespace=lambda: namespace)
    ledger.cell_files[CELL_FILE] = 5
    with ledger.cell(5, "import m\nx = 1\nweights = [make(), make()]"):
        blocks = [src.malloc(4 * MiB, in_cell(3)) for _ in range(2)]
        namespace["weights"] = [Array(p, 4 * MiB) for p in blocks]
        src.malloc(MiB, in_cell(2))  # held by no variable
    cause = ledger.causes[0]
    assert (cause.new_bytes, cause.new_blocks, cause.unheld_bytes) == (9 * MiB, 3, MiB)
    assert [g.describe() for g in cause.holders] == ["weights (list of 2 × 4 MiB)"]
    assert (cause.line, cause.site) == ("cell [5] line 3", "model.py:9")
    assert ledger.rows[0]["source"] == "weights = [make(), make()]"  # the line behind most
    with ledger.cell(6):  # nothing new: no search, no cause
        pass
    assert ledger.causes[1] == CellCause()


def test_a_new_owner_is_not_compared(src: DictSource) -> None:
    ledger = ledger_of(src)
    with ledger.cell(1):
        pass
    src.device = 1  # another device's blocks: the owner, (name, device), changed
    elsewhere = src.malloc(MiB)
    with ledger.cell(2):
        pass
    assert ledger.causes[1].new_bytes == 0 and ledger.states_of("dict")[2][elsewhere].cell is None
    with ledger.cell(3):
        mine = src.malloc(MiB)
    assert ledger.states_of("dict")[3][mine].cell == 3 and ledger.causes[2].new_bytes == MiB


def test_a_source_that_cannot_start_gets_no_row(src: DictSource) -> None:
    class Broken(DictSource):
        def start_cell(self, cell: int) -> Any:
            raise RuntimeError("no CUDA")

    ledger = ledger_of(Broken("broken"), src)
    with ledger.cell(1):
        pass
    assert [row_source(r) for r in ledger.rows] == ["dict"]
    assert ledger_of().end_cell() == []  # no cell open: no rows


def test_two_sources_at_once_each_row_labelled(allocator: CachingAllocator) -> None:
    ours, torch = CupySource(allocator), DictSource("torch")
    ledger = ledger_of(ours, torch)
    with ledger.cell(1, "x = 1"):
        p = allocator.malloc(MiB)
        t = torch.malloc(2 * MiB)
    rows = ledger.rows
    assert [row_source(r) for r in rows] == ["cupy", "torch"]
    assert "memory_source" not in rows[0] and "peak_exact" not in rows[0]  # ours, as always
    assert [ledger.source_of(r) for r in rows] == [ours, torch]  # the footer reads them
    whose = [r.get("memory_source") for r in rows]
    assert [source_label(r.get("memory_source"), whose) for r in rows] == ["cupy", "torch"]
    assert footer_text(rows[0], 0, None, "cupy").startswith("gpumem [1] cupy: Δallocated +1.0 MiB")
    assert footer_text(rows[1], 0).startswith("gpumem [1] torch: Δallocated +2.0 MiB")
    assert [line.split("  ")[0] for line in ledger.table().text().splitlines()[1:]] == [
        "[1] cupy", "[1] torch"]
    assert ledger.states[1][p].cell == 1 and ledger.states_of("torch")[1][t].cell == 1
    assert ledger.recorded() == ledger.recorded("cupy") == ledger.recorded("torch") == 1
    assert ledger.recorded(every_source=True) == 2
    allocator.free(p)


def test_source_of_the_last_cells_rows(src: DictSource) -> None:
    ledger = ledger_of(src)
    with ledger.cell(1):
        pass
    ledger.start_cell(2)
    (row,) = ledger.end_cell()
    assert ledger.source_of(row) is src and ledger.source_of(ledger.rows[0]) is None


def test_one_labelling_rule() -> None:
    assert source_label(None, [None]) is None  # ours alone: as before sources
    assert source_label("cupy", ["cupy", None]) is None
    assert source_label("torch", ["torch"]) == "torch"  # another's names itself, alone too
    assert source_label(None, [None, "torch"]) == "cupy"  # beside another's, ours says so
    assert source_label("jax", []) == "jax"


def test_folding_keeps_every_source_row_of_the_last_cells(allocator: CachingAllocator) -> None:
    torch = DictSource("torch")
    ledger = ledger_of(CupySource(allocator), torch, keep_rows=2)
    for cell in range(1, 5):
        if cell == 2:
            torch.free(torch.malloc(MiB))  # before cell 2: its torch peak is only a bound
        with ledger.cell(cell, "pass"):
            pass
    assert [(r["cell"], r.get("memory_source")) for r in ledger.rows] == [
        (3, None), (3, "torch"), (4, None), (4, "torch")]
    assert {s: f.cells for s, f in ledger.folded.items()} == {None: 2, "torch": 2}
    assert ledger.recorded("torch") == 4 and ledger.recorded(every_source=True) == 8
    lines = ledger.table().text().splitlines()
    assert lines[0].startswith("older rows folded: the first rows (one a source) add up 2 older "
                               "cells")
    assert [line.split("  ")[0] for line in lines[2:4]] == ["[1]–[2] cupy", "[1]–[2] torch"]
    assert " ≤ 1.0 MiB " in lines[3]  # cell 2's torch peak was only a bound


def test_diff_and_footer_in_a_shell_with_both_sources(shell, run, sim) -> None:
    """``%gpumem source both``: every footer line and every diff says whose it is; with PyTorch's
    alone, its diff and footer name it, as before."""
    from fake_torch import FakeTorchMemory, views_on_fake

    from jupyter_gpumem import sources

    fake = FakeTorchMemory()
    views_on_fake(shell, run, fake, footer=True)
    try:
        sources.use_sources(("cupy", "torch"), memory_module=fake)
        run("import jupyter_gpumem as g\nMiB = 1 << 20")
        first, _ = run("pass")
        result, out = run("p = g.caching_allocator_alloc(4 * MiB)\nx = mem.empty(2 * MiB)")
        assert result.success
        heads = [ln.split(":")[0] for ln in out.stdout.splitlines() if ln.startswith("gpumem [")]
        assert heads == [f"gpumem [{result.execution_count}] cupy",
                         f"gpumem [{result.execution_count}] torch"]
        _, out = run(f"%gpumem diff {first.execution_count} {result.execution_count}")
        texts = [o.data["text/plain"].splitlines()[0] for o in out.outputs]
        assert texts == [
            f"cupy: cell [{first.execution_count}] → cell [{result.execution_count}]: 1 new "
            "block(s) (4.0 MiB), 0 freed (0 B), net +4.0 MiB",
            f"torch: cell [{first.execution_count}] → cell [{result.execution_count}]: 1 new "
            "block(s) (2.0 MiB), 0 freed (0 B), net +2.0 MiB"]
        bad, out = run(f"%gpumem diff {first.execution_count} 99")
        assert not bad.success and "no state recorded after cell 99 (cells kept: 2, " in out.stderr
    finally:
        run("g.caching_allocator_delete(p)")
        sources.use_sources(("cupy",))
