"""The per-cell ledger, driven directly on a simulated allocator: exact numbers."""

from __future__ import annotations

import pytest
from cupy_like import Array

from jupyter_gpumem import CachingAllocator
from jupyter_gpumem.data.holders import HolderGroup
from jupyter_gpumem.data.schema import CellRecord
from jupyter_gpumem.data.sites import site_of
from jupyter_gpumem.notebook.advice import cache_hint, cause_line, held_by
from jupyter_gpumem.notebook.ledger import (
    KEEP_ROWS,
    CellCause,
    Ledger,
    LedgerTable,
    releasable_bytes,
    source_line,
)
from jupyter_gpumem.sources.cupy import CupySource

MiB = 1 << 20


def on(allocator: CachingAllocator):
    """The ledger's sources: our allocator ``allocator`` alone."""
    return lambda: [CupySource(allocator)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


@pytest.fixture
def ledger(allocator: CachingAllocator) -> Ledger:
    allocator.record_history(True, stacks=True)
    return Ledger(clock=Clock(), sources_for=on(allocator))


def test_one_cell_exact_numbers(ledger: Ledger, allocator: CachingAllocator) -> None:
    with ledger.cell(1, "\n  x = alloc(3 MiB)\nmore"):
        x = allocator.malloc(3 * MiB)
        y = allocator.malloc(5 * MiB)
        allocator.free(y)
    (row,) = ledger.rows
    assert row == {
        "cell": 1,
        "source": "x = alloc(3 MiB)",
        "allocated_delta": 3 * MiB,
        "reserved_delta": 20 * MiB,  # one 20 MiB segment for requests under 10 MiB
        "peak_allocated": 8 * MiB,
        "allocs": 2,
        "frees": 1,
        "segments_new": 1,
        "ooms": 0,
        "wall_s": 0.25,
        "start_event": 0,
        "end_event": 5,  # segment_alloc, alloc, alloc, free_requested, free_completed
    }
    allocator.free(x)


def test_peak_is_the_cells_own_and_user_peaks_are_untouched(
        ledger: Ledger, allocator: CachingAllocator) -> None:
    big = allocator.malloc(64 * MiB)
    allocator.free(big)
    with ledger.cell(2, "small"):
        p = allocator.malloc(MiB + 512)
    assert ledger.rows[0]["peak_allocated"] == MiB + 512  # not the 64 MiB from before
    assert allocator.memory_stats()["allocated_bytes.all.peak"] == 64 * MiB
    allocator.free(p)


def test_cell_tag_on_history_events_and_restored(ledger: Ledger,
                                                 allocator: CachingAllocator) -> None:
    with ledger.cell(7, "x"):
        assert allocator.current_cell == 7
        p = allocator.malloc(4096)
    assert allocator.current_cell == -1
    allocator.free(p)
    trace = allocator.snapshot()["device_traces"][0]
    assert [e.get("cell") for e in trace if e["action"] == "alloc"] == [7]
    assert all("cell" not in e for e in trace if e["action"] == "free_requested")


def test_without_history_event_range_is_minus_one(allocator: CachingAllocator) -> None:
    ledger = Ledger(sources_for=on(allocator))
    with ledger.cell(1):
        p = allocator.malloc(512)
    assert (ledger.rows[0]["start_event"], ledger.rows[0]["end_event"]) == (-1, -1)
    assert ledger.states[1][p].site is None  # no stacks without history
    allocator.free(p)


def test_oom_counted(ledger: Ledger, allocator: CachingAllocator) -> None:
    with pytest.raises(MemoryError), ledger.cell(3, "too big"):
        allocator.malloc(64 << 30)
    assert ledger.rows[0]["ooms"] == 1
    assert ledger.rows[0]["allocs"] == 0


def test_no_allocator_records_nothing() -> None:
    ledger = Ledger(sources_for=lambda: [])
    with ledger.cell(1, "x"):
        pass
    assert ledger.rows == []


def test_hooks_called_and_unsubscribed(ledger: Ledger) -> None:
    seen: list[int] = []
    unsubscribe = ledger.on_record(lambda row: seen.append(row["cell"]))
    with ledger.cell(1):
        pass
    unsubscribe()
    with ledger.cell(2):
        pass
    assert seen == [1]


def test_end_states_keep_the_allocating_cell_and_diff(ledger: Ledger,
                                                      allocator: CachingAllocator) -> None:
    with ledger.cell(1):
        a = allocator.malloc(2 * MiB)
    with ledger.cell(2):
        b = allocator.malloc(3 * MiB)
    with ledger.cell(3):
        allocator.free(a)
    assert ledger.states[2][a].cell == 1
    assert ledger.states[2][b].cell == 2
    site = ledger.states[2][b].site
    assert site is not None and site.startswith("test_ledger.py:")
    d = ledger.diff(1, 3)
    assert [blk.address for blk in d.new] == [b]
    assert [blk.address for blk in d.gone] == [a]
    assert d.net == MiB
    text = d.text()
    assert text.splitlines()[0] == ("cell [1] → cell [3]: 1 new block(s) (3.0 MiB), 1 freed "
                                    "(2.0 MiB), net +1.0 MiB")
    assert "+ " in text and site in text
    allocator.free(b)


def test_keep_states_and_missing_state(allocator: CachingAllocator) -> None:
    ledger = Ledger(keep_states=2, sources_for=on(allocator))
    for cell in (1, 2, 3):
        with ledger.cell(cell):
            pass
    assert list(ledger.states) == [2, 3]
    with pytest.raises(KeyError, match="kept: 2, 3"):
        ledger.diff(1, 3)
    with pytest.raises(ValueError):
        Ledger(keep_states=-1)


def test_counter_reset_inside_a_cell(ledger: Ledger, allocator: CachingAllocator) -> None:
    p = allocator.malloc(512)
    allocator.free(allocator.malloc(512))
    with ledger.cell(1):
        allocator.reset_accumulated_memory_stats()
        q = allocator.malloc(512)
    # The counters went from 2 to 1: the reset is seen, and the count starts from zero.
    assert ledger.rows[0]["allocs"] == 1
    assert ledger.rows[0]["frees"] == 0
    allocator.free(p)
    allocator.free(q)


def test_site_of_names_cells() -> None:
    frames = [{"filename": "/x/site-packages/cupy/_core.py", "line": 3, "name": "f"},
              {"filename": "<ipython-input-4-abcdef>", "line": 2, "name": "<module>"}]
    assert site_of(frames) == "cell [4] line 2"
    assert site_of(frames[1:2], {"<ipython-input-4-abcdef>": 9}) == "cell [9] line 2"
    assert site_of([{"filename": "/a/b/train.py", "line": 12, "name": "f"}]) == "train.py:12"
    assert site_of(frames[:1]) is None


def test_table_text_exact() -> None:
    table = LedgerTable([{
        "cell": 1, "source": "x = 1", "allocated_delta": 1024, "reserved_delta": 2 * MiB,
        "peak_allocated": 2048, "allocs": 1, "frees": 0, "segments_new": 1, "ooms": 0,
        "wall_s": 0.5, "start_event": -1, "end_event": -1}])
    assert table.text() == (
        "cell  Δ allocated  Δ reserved     peak  allocs  frees  segs  OOMs     time  source\n"
        "[1]      +1.0 KiB    +2.0 MiB  2.0 KiB       1      0     1     0  0.500 s  x = 1")
    assert ">x = 1</td>" in table._repr_mimebundle_()["text/html"]
    assert LedgerTable([]).text() == "no cells recorded yet"


# -- what a cell left behind, and who holds it ---------------------------------------------------


def test_holders_searched_only_when_a_cell_left_memory(allocator: CachingAllocator) -> None:
    namespace: dict[str, object] = {}
    searches: list[int] = []

    def user_ns() -> dict[str, object]:
        searches.append(1)
        return namespace

    ledger = Ledger(sources_for=on(allocator), namespace=user_ns)
    with ledger.cell(1, "import x\ntmp = alloc()\nfree(tmp)"):
        allocator.free(allocator.malloc(3 * MiB))
    assert searches == [] and ledger.causes[0] == CellCause()
    with ledger.cell(2, "keep = [alloc(), alloc()]"):
        namespace["keep"] = [Array(allocator.malloc(2 * MiB), 2 * MiB) for _ in range(2)]
    assert searches == [1]
    cause = ledger.cause_of(ledger.rows[1])
    assert cause is not None and cause.new_bytes == 4 * MiB and cause.new_blocks == 2
    assert [g.describe() for g in cause.holders] == ["keep (list of 2 × 2 MiB)"]
    assert (cause.unheld_bytes, cause.site, cause.line) == (0, None, None)  # no history
    assert ledger.rows[0]["source"] == "tmp = alloc()"
    with ledger.cell(3):  # the blocks of cell 2 are not new in cell 3
        pass
    assert ledger.causes[2].new_bytes == 0 and searches == [1]
    for array in namespace["keep"]:  # type: ignore[attr-defined]
        allocator.free(array.data.ptr)


def test_cause_names_the_allocating_line_with_stacks(ledger: Ledger,
                                                     allocator: CachingAllocator) -> None:
    with ledger.cell(1):
        kept = allocator.malloc(5 * MiB)
    cause = ledger.causes[0]
    assert cause.site is not None and cause.site.startswith("test_ledger.py:")
    assert cause.line is None  # not run from a notebook cell
    assert cause.unheld_bytes == 5 * MiB  # no namespace to search
    allocator.free(kept)


@pytest.mark.parametrize("source, line, shown", [
    ("import cupy as cp\nx = cp.ones(3)", None, "x = cp.ones(3)"),
    ("# setup\n%matplotlib inline\n!nvidia-smi\n\nfrom a import b\ny = 2", None, "y = 2"),
    ("from a import (\n    b,\n    c,\n)\nz = b(c)", None, "z = b(c)"),
    ("import cupy as cp\nxs = []\nfor i in range(9):\n    xs.append(cp.ones(i))", 4,
     "xs.append(cp.ones(i))"),
    ("import numpy as np", None, "import numpy as np"),  # nothing else: the first line
    ("import a\nb = 1", 7, "b = 1"),  # a line the cell does not have
    ("", None, ""),
    # under a cell magic, lines count as in the editor: the magic's own line is line 1
    ("%%gpumem_trace -o t\nacts = [f(i) for i in range(6)]\ndel acts[1:]", 2,
     "acts = [f(i) for i in range(6)]"),
    ("%%gpumem_trace\nimport cupy\nx = cupy.ones(3)", None, "x = cupy.ones(3)"),
    ("w = '" + "x" * 100 + "'", None, "w = '" + "x" * 72 + "..."),
])
def test_source_line(source: str, line: int | None, shown: str) -> None:
    assert source_line(source, line) == shown


def test_table_with_held_by_column() -> None:
    row: CellRecord = {
        "cell": 4, "source": "losses.append(x)", "allocated_delta": 40 * MiB,
        "reserved_delta": 40 * MiB, "peak_allocated": 40 * MiB, "allocs": 2, "frees": 0,
        "segments_new": 2, "ooms": 0, "wall_s": 0.5, "start_event": -1, "end_event": -1}
    group = HolderGroup("losses", "list", 2, 2, (0x1000, 0x2000), 40 * MiB, 20 * MiB)
    cause = CellCause(new_bytes=40 * MiB, new_blocks=2, holders=(group,))
    quiet = dict(row, cell=5, source="pass", allocated_delta=0, reserved_delta=0, allocs=0,
                 segments_new=0)
    table = LedgerTable([row, quiet], [cause, CellCause()])  # type: ignore[list-item]
    assert table.text() == (
        "cell  Δ allocated  Δ reserved      peak  allocs  frees  segs  OOMs     time  "
        "held by                      source\n"
        "[4]     +40.0 MiB   +40.0 MiB  40.0 MiB       2      0     2     0  0.500 s  "
        "losses (list of 2 × 20 MiB)  losses.append(x)\n"
        "[5]           0 B         0 B  40.0 MiB       0      0     0     0  0.500 s  "
        "                             pass")
    assert ">losses (list of 2 × 20 MiB)</td>" in table.html()


def test_held_by_words() -> None:
    groups = tuple(HolderGroup(f"v{i}", None, 1, 1, (i,), (5 - i) * MiB, (5 - i) * MiB)
                   for i in range(5))
    cause = CellCause(new_bytes=20 * MiB, new_blocks=6, holders=groups, unheld_bytes=5 * MiB)
    assert held_by(cause) == ("v0 (5.0 MiB), v1 (4.0 MiB), v2 (3.0 MiB), 2 more (3.0 MiB), "
                              "5.0 MiB by no variable found")
    cut = CellCause(new_bytes=MiB, new_blocks=1, unheld_bytes=MiB,
                    search_cut="search stopped at 50 ms")
    assert held_by(cut) == "no variable found (search stopped at 50 ms)"
    assert held_by(CellCause()) == ""
    assert cause_line(CellCause(new_bytes=MiB, new_blocks=1, unheld_bytes=MiB,
                                line="cell [3] line 2", site="model.py:9")) == (
        "left 1.0 MiB in 1 new block, held by no variable found; "
        "allocated at cell [3] line 2 (in model.py:9)")


def test_releasable_bytes(allocator: CachingAllocator) -> None:
    big = allocator.malloc(100 * MiB)
    allocator.free(big)
    assert releasable_bytes(allocator.memory_stats()) == 100 * MiB
    small = allocator.malloc(30 * MiB)  # splits the cached segment: nothing whole is free
    assert releasable_bytes(allocator.memory_stats()) == 0
    allocator.free(small)
    assert cache_hint(releasable_bytes(allocator.memory_stats()),
                      allocator.memory_reserved()) is None
    assert cache_hint(3 << 30, 4 << 30) is not None
    assert cache_hint(1 << 30, 1 << 30) is None  # exactly 1 GiB: not more
    assert cache_hint(2 << 30, 4 << 30) is None  # exactly half: not more


def test_blocks_from_before_the_ledger_are_not_left_by_its_first_cell(
        allocator: CachingAllocator, device) -> None:
    before = allocator.malloc(3 * MiB)
    other = CachingAllocator(device)
    current = [allocator]
    ledger = Ledger(sources_for=lambda: [CupySource(current[0])],
                    namespace=lambda: {"before": before})
    with ledger.cell(1):
        pass
    assert ledger.causes[0].new_bytes == 0 and ledger.states[1][before].cell is None
    ledger.clear()
    with ledger.cell(2):
        pass
    assert ledger.causes[0].new_bytes == 0
    elsewhere = other.malloc(MiB)  # on another allocator, before the switch to it
    current[0] = other
    with ledger.cell(3):
        pass
    assert ledger.causes[1].new_bytes == 0 and ledger.states[3][elsewhere].cell is None
    other.free(elsewhere)
    allocator.free(before)


# -- the bound: the last keep_rows cells in full, older ones folded --------------------------------


def test_rows_past_keep_rows_are_folded_into_one_summary_row(allocator: CachingAllocator) -> None:
    ledger = Ledger(keep_rows=3, clock=Clock(), sources_for=on(allocator))
    kept = []
    for cell in range(1, 7):
        with ledger.cell(cell, f"x{cell} = alloc({cell} MiB)"):
            kept.append(allocator.malloc(cell * MiB))
            allocator.free(allocator.malloc(512))
    assert [r["cell"] for r in ledger.rows] == [4, 5, 6]
    assert len(ledger.causes) == 3 and ledger.causes[-1].new_bytes == 6 * MiB
    (folded,) = ledger.folded.values()
    assert (folded.memory_source, folded.cells, folded.first_cell, folded.last_cell) == (
        None, 3, 1, 3)
    assert folded.allocated_delta == 6 * MiB  # 1 + 2 + 3 MiB left by cells 1-3
    assert folded.reserved_delta == 22 * MiB  # the segments cell 1 made: 20 MiB large, 2 small
    assert folded.peak_allocated == 6 * MiB + 512  # the highest: cell 3's
    assert (folded.allocs, folded.frees, folded.segments_new) == (6, 3, 2)
    assert folded.wall_s == pytest.approx(0.75)
    assert ledger.recorded() == 6 and ledger.recorded(every_source=True) == 6
    assert ledger.table().text() == (
        "older rows folded: the first row adds up 3 older cells (totals, and the highest peak); "
        "the last 3 cells are kept in full (GpuMem.keep_rows)\n"
        "cell     Δ allocated  Δ reserved      peak  allocs  frees  segs  OOMs     time  "
        "held by            source\n"
        "[1]–[3]     +6.0 MiB   +22.0 MiB   6.0 MiB       6      3     2     0  0.750 s  "
        "                   3 older cells, folded\n"
        "[4]         +4.0 MiB         0 B  10.0 MiB       2      1     0     0  0.250 s  "
        "no variable found  x4 = alloc(4 MiB)\n"
        "[5]         +5.0 MiB         0 B  15.0 MiB       2      1     0     0  0.250 s  "
        "no variable found  x5 = alloc(5 MiB)\n"
        "[6]         +6.0 MiB         0 B  21.0 MiB       2      1     0     0  0.250 s  "
        "no variable found  x6 = alloc(6 MiB)")
    assert "<p>older rows folded: the first row adds up 3 older cells" in ledger.table().html()
    ledger.clear()
    assert ledger.folded == {} and ledger.table().text() == "no cells recorded yet"
    for p in kept:
        allocator.free(p)


def test_keep_rows_is_checked_and_shrinking_it_folds_now(allocator: CachingAllocator) -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="keep_rows"):
            Ledger(keep_rows=bad)  # type: ignore[arg-type]
    ledger = Ledger(sources_for=on(allocator))
    assert ledger.keep_rows == KEEP_ROWS == 200
    for cell in range(1, 6):
        with ledger.cell(cell):
            pass
    ledger.keep_rows = 1
    ledger.fold()
    assert [r["cell"] for r in ledger.rows] == [5] and ledger.folded[None].cells == 4


def test_ledger_memory_per_1000_cells_is_bounded(allocator: CachingAllocator) -> None:
    """Rows, causes and end states of 1,000 more cells, past the bound: the ledger's own
    allocations (tracemalloc, this package's files) stay flat. Unbounded rows cost ~0.7 KB a
    plain cell here (~700 KB a thousand)."""
    import gc
    import os
    import tracemalloc

    import jupyter_gpumem

    allocator.record_history(True, stacks=True, max_entries=0)  # the extension's default
    ledger = Ledger(keep_rows=20, keep_states=20, clock=Clock(), sources_for=on(allocator))

    def cells(first: int, n: int) -> None:
        for cell in range(first, first + n):
            with ledger.cell(cell, f"y = work({cell})  # cell {cell}"):
                allocator.free(allocator.malloc(4096))

    cells(1, 40)  # past the bound, and every cache warm
    ours = [tracemalloc.Filter(True, os.path.join(os.path.dirname(jupyter_gpumem.__file__), "*"))]
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.take_snapshot().filter_traces(ours)
        cells(41, 1000)
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(ours)
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert grown < 32 * 1024, f"the ledger grew {grown} B over 1,000 cells"
    assert len(ledger.rows) == 20 and ledger.recorded() == 1040
