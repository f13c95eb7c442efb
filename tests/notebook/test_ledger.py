"""The per-cell ledger, driven directly on a simulated allocator: exact numbers."""

from __future__ import annotations

import pytest

from jupyter_gpumem import CachingAllocator
from jupyter_gpumem.data.sites import site_of
from jupyter_gpumem.notebook.ledger import Ledger, LedgerTable

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


@pytest.fixture
def ledger(allocator: CachingAllocator) -> Ledger:
    allocator.record_history(True, stacks=True)
    return Ledger(clock=Clock(), allocator_for=lambda: allocator)


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
    ledger = Ledger(allocator_for=lambda: allocator)
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
    ledger = Ledger(allocator_for=lambda: None)
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
    ledger = Ledger(keep_states=2, allocator_for=lambda: allocator)
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
    assert "<td>x = 1</td>" in table._repr_mimebundle_()["text/html"]
    assert LedgerTable([]).text() == "no cells recorded yet"
