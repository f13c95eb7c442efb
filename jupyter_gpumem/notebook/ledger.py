"""The per-cell ledger: what every notebook cell did to the allocator, one ``CellRecord`` a cell.

For each cell the ledger keeps

- a ``CellRecord`` (``schema``): the change in allocated and reserved bytes, the cell's own peak
  (from a ``Watermark``, so the user's peak stats are never reset), the allocations, frees, new
  segments and OOMs (deltas of the stats counters ``allocation.all.allocated``,
  ``allocation.all.freed``, ``segment.all.allocated`` and ``num_ooms``), wall time, and the range
  of history events the cell produced;
- a compact end state: every live block's address, size, requested size, allocating line and
  the cell that allocated it. ``diff(a, b)`` compares two end states block by block;
- a ``CellCause``: what the cell left behind (its blocks still live at its end), which variables
  of the user's namespace hold them, the line that allocated most of them (when stacks are
  recorded), and a hint when cached memory is worth giving back. See Note [Naming the cause].

Rows and causes are kept for the last ``keep_rows`` cells (``KEEP_ROWS``, 200); older rows are
folded into one ``FoldedCells`` a memory source (``folded_cells``), end states for the last
``keep_states`` cells.

While a cell runs, ``allocator.current_cell`` is its execution count, so history events carry it.

Event positions (``start_event``/``end_event``) count every event the allocator's history has
recorded since it was last switched on, dropped ones included: subtract the snapshot's
``jupyter_gpumem["history_dropped"]`` to get an index into that snapshot's trace.

Nothing here imports IPython: ``Ledger.cell()`` is the plain-Python form of the extension's hooks.
"""

from __future__ import annotations

import contextlib
import html
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.codes import NO_CELL, NO_STACK
from jupyter_gpumem.data.holders import find
from jupyter_gpumem.data.schema import Frame
from jupyter_gpumem.data.sites import site_of
from jupyter_gpumem.data.units import format_bytes, format_signed_bytes
from jupyter_gpumem.notebook.advice import CellCause, cache_hint, held_by, peak_text
from jupyter_gpumem.notebook.folded_cells import KEEP_ROWS, FoldedCells, folded_note
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.sources.cupy import selected_allocator

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.engine.history import FrameTable
    from jupyter_gpumem.engine.stats import Watermark

__all__ = ["KEEP_ROWS", "BlockDiff", "CellCause", "FoldedCells", "Ledger", "LedgerTable",
           "LiveBlock", "name_cause", "site_of", "source_line", "where_of"]


@dataclass(frozen=True)
class LiveBlock:
    """One live block in a cell's end state."""

    address: int
    size: int  # bytes of the block (after rounding)
    requested: int  # bytes the user asked for
    site: str | None  # the allocating line, None without stack recording
    cell: int | None  # the cell that allocated it; None if before the ledger started
    #: ``(cell, line)`` of the outermost frame of its stack in a notebook cell: the line of the
    #: running cell that led to it. None without stacks or outside cells.
    origin: tuple[int, int] | None = None


@dataclass
class _OpenCell:
    cell: int
    source: str  # the whole cell
    allocator: CachingAllocator
    watermark: Watermark
    start_s: float
    allocated: int
    reserved: int
    allocs: int
    frees: int
    segments: int
    ooms: int
    start_event: int
    previous_cell: int


def block_rows(allocator: CachingAllocator) -> list[tuple[int, int, int, bool, int]]:
    """``(address, size, requested, allocated, stack id)`` of every block, live or cached.

    Read with ``allocator.state()``, so that no snapshot (and no "snapshot" history event) is
    made just to look at the blocks."""
    return [(b.address, b.size, b.requested_size, b.allocated, b.stack_id)
            for b in allocator.state().blocks]


def releasable_bytes(allocator: CachingAllocator) -> int:
    """Bytes ``empty_cache`` would give back now: cached blocks that are whole segments (reserved,
    less allocated, less the free parts of segments that still have live blocks)."""
    st = allocator.stats
    return max(0, allocator.memory_reserved() - st.allocated_bytes.all.current
               - st.inactive_split_bytes.all.current)


def _event_position(allocator: CachingAllocator) -> int:
    history = allocator.history
    if history is None or history.max_entries == 0:
        return -1
    return history.recorded


def _counter_delta(after: int, before: int) -> int:
    # reset_accumulated_memory_stats inside the cell zeroes the counters: when a counter ends
    # below where it started, count from zero. (A reset that ends at or above the start value
    # cannot be told apart from no reset, and undercounts.)
    return after - before if after >= before else after


_AllocatorFor = Callable[[], "CachingAllocator | None"]


class Ledger:
    """Rows of ``CellRecord`` and per-cell end states, with hooks called on every new row.

    ``rows`` and ``causes`` hold the last ``keep_rows`` cells (every memory source's row of
    each); older rows are added into ``folded`` and let go."""

    def __init__(self, *, keep_states: int = 200, keep_rows: int = KEEP_ROWS,
                 clock: Callable[[], float] = time.perf_counter,
                 allocator_for: _AllocatorFor = selected_allocator,
                 namespace: Callable[[], Mapping[str, Any]] | None = None) -> None:
        if keep_states < 0:
            raise ValueError(f"keep_states must be >= 0, got {keep_states}")
        self.keep_states = keep_states
        self.keep_rows = _checked_keep_rows(keep_rows)
        self.rows: list[CellRecord] = []
        #: what each row's cell left behind, one ``CellCause`` a row (same order as ``rows``).
        self.causes: list[CellCause] = []
        #: the rows older than the last ``keep_rows`` cells, added up, by memory source
        self.folded: dict[str | None, FoldedCells] = {}
        #: the variables searched for holders (the shell's ``user_ns``); None: no search.
        self.namespace = namespace
        #: cell number -> its end state (address -> LiveBlock), the last ``keep_states`` cells.
        self.states: OrderedDict[int, dict[int, LiveBlock]] = OrderedDict()
        #: the same for other memory sources ("torch"), by source.
        self.source_states: dict[str, OrderedDict[int, dict[int, LiveBlock]]] = {}
        self._running: int | None = None  # the cell between start_cell and end_cell
        #: source file name of a cell's code -> its cell number, so sites read "cell [N] line L".
        self.cell_files: dict[str, int] = {}
        self._clock = clock
        self._allocator_for = allocator_for
        self._open: _OpenCell | None = None
        self._hooks: list[Callable[[CellRecord], None]] = []
        #: the blocks of the last recorded state: ``(address, size, requested, stack id)`` -> block
        self._last: dict[tuple[int, int, int, int], LiveBlock] = {}
        #: the allocator whose blocks ``_last`` lists; when the next cell runs on another one (the
        #: first cell, a device switch, after ``clear``) its blocks are listed first, so that
        #: blocks from before the cell are not taken for blocks the cell left behind.
        self._last_of: weakref.ref[CachingAllocator] | None = None
        self._sites: weakref.WeakKeyDictionary[FrameTable, dict[int, _Where]] = (
            weakref.WeakKeyDictionary())
        self._cache_told = False  # the cache hint was given for the current occurrence

    # -- hooks ---------------------------------------------------------------------------------

    def on_record(self, hook: Callable[[CellRecord], None]) -> Callable[[], None]:
        """Call ``hook(row)`` after every recorded cell; returns a function that unsubscribes."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    # -- recording -----------------------------------------------------------------------------

    @property
    def running(self) -> int | None:
        """The cell being recorded now, if any."""
        return self._running

    def start_cell(self, cell: int, source: str = "") -> None:
        """Begin recording ``cell``; a cell still open is closed first."""
        if self._open is not None:
            self.end_cell()
        self._running = cell
        allocator = self._allocator_for()
        if allocator is None:
            return
        if self._last_of is None or self._last_of() is not allocator:
            self._last = self._live_blocks(allocator, None)[1]
            self._last_of = weakref.ref(allocator)
        st = allocator.stats
        self._open = _OpenCell(
            cell=cell,
            source=source,
            allocator=allocator,
            watermark=allocator.start_watermark(f"cell {cell}"),
            start_s=self._clock(),
            allocated=st.allocated_bytes.all.current,
            reserved=allocator.memory_reserved(),
            allocs=st.allocation.all.allocated,
            frees=st.allocation.all.freed,
            segments=st.segment.all.allocated,
            ooms=st.num_ooms,
            start_event=_event_position(allocator),
            previous_cell=allocator.current_cell,
        )
        allocator.current_cell = cell

    def end_cell(self, *, filename: str | None = None) -> CellRecord | None:
        """Finish the open cell and return its row (None when no cell was open).

        ``filename`` is the name the cell's code was compiled under, so that lines of this
        cell are shown as ``cell [N] line L``."""
        open_ = self._open
        self._running = None
        if open_ is None:
            return None
        self._open = None
        allocator = open_.allocator
        wall = self._clock() - open_.start_s
        allocator.stop_watermark(open_.watermark)
        allocator.current_cell = open_.previous_cell
        if filename:
            self.cell_files[filename] = open_.cell
        st = allocator.stats
        start_event = open_.start_event
        end_event = _event_position(allocator)
        if start_event < 0 or end_event < 0 or end_event < start_event:
            start_event = end_event = -1
        state = self.live_blocks(allocator, cell=open_.cell)
        cause, line = self._cause(open_.cell, state, allocator)
        row: CellRecord = {
            "cell": open_.cell,
            "source": source_line(open_.source, line),
            "allocated_delta": st.allocated_bytes.all.current - open_.allocated,
            "reserved_delta": allocator.memory_reserved() - open_.reserved,
            "peak_allocated": open_.watermark.peak_allocated,
            "allocs": _counter_delta(st.allocation.all.allocated, open_.allocs),
            "frees": _counter_delta(st.allocation.all.freed, open_.frees),
            "segments_new": _counter_delta(st.segment.all.allocated, open_.segments),
            "ooms": _counter_delta(st.num_ooms, open_.ooms),
            "wall_s": wall,
            "start_event": start_event,
            "end_event": end_event,
        }
        self._append(row, cause)
        self._store_state(open_.cell, state)
        for hook in list(self._hooks):
            hook(row)
        return row

    @contextlib.contextmanager
    def cell(self, cell: int, source: str = "") -> Iterator[None]:
        """Record the body of the ``with`` block as cell ``cell`` (the hooks' plain-Python form)."""
        self.start_cell(cell, source)
        try:
            yield
        finally:
            self.end_cell()

    def add_row(self, row: CellRecord, cause: CellCause, state: dict[int, LiveBlock],
                *, memory_source: str) -> None:
        """Add the row of another memory source (``source_cells``: PyTorch's) for a cell, with
        its cause and end state; the hooks see it like any row."""
        self._append(row, cause)
        if self.keep_states:
            states = self.source_states.setdefault(memory_source, OrderedDict())
            states.pop(row["cell"], None)
            states[row["cell"]] = state
            while len(states) > self.keep_states:
                states.popitem(last=False)
        for hook in list(self._hooks):
            hook(row)

    def _append(self, row: CellRecord, cause: CellCause) -> None:
        self.rows.append(row)
        self.causes.append(cause)
        self.fold()

    def fold(self) -> None:
        """Fold the rows of every cell before the last ``keep_rows`` cells into ``folded``.

        A cell is a run of rows with the same number (one a memory source), as they are
        recorded."""
        rows = self.rows
        if len(rows) <= self.keep_rows:
            return
        cells, cut, previous = 0, 0, None
        for i in range(len(rows) - 1, -1, -1):
            if rows[i]["cell"] != previous:
                previous = rows[i]["cell"]
                cells += 1
                if cells > self.keep_rows:
                    cut = i + 1
                    break
        for row in rows[:cut]:
            source = row.get("memory_source")
            folded = self.folded.get(source)
            if folded is None:
                folded = self.folded[source] = FoldedCells(source)
            folded.add(row)
        del rows[:cut]
        del self.causes[:cut]

    def recorded(self, memory_source: str | None = None, *, every_source: bool = False) -> int:
        """Rows recorded for ``memory_source`` (None: our allocator), folded ones included; with
        ``every_source``, the rows of every source."""
        if every_source:
            return len(self.rows) + sum(f.cells for f in self.folded.values())
        folded = self.folded.get(memory_source)
        return (sum(1 for r in self.rows if r.get("memory_source") == memory_source)
                + (folded.cells if folded is not None else 0))

    def _cause(self, cell: int, state: dict[int, LiveBlock], allocator: CachingAllocator
               ) -> tuple[CellCause, int | None]:
        """The cause of ``cell``'s end ``state``, and the line of the cell that allocated most of
        what it left (None when unknown)."""
        hint = cache_hint(releasable_bytes(allocator), allocator.memory_reserved())
        if hint is None or self._cache_told:
            self._cache_told = hint is not None
            hint = None
        else:
            self._cache_told = True
        return name_cause(cell, state, self.namespace, self.cell_files, hint)

    def cause_of(self, row: CellRecord) -> CellCause | None:
        """The ``CellCause`` recorded with ``row`` (a row of ``rows``), None for another row."""
        for i in range(len(self.rows) - 1, -1, -1):
            if self.rows[i] is row:
                return self.causes[i] if i < len(self.causes) else None
        return None

    def cache_hint_now(self) -> str | None:
        """The cache hint for the current allocator when its cached memory is worth giving back
        (for the status line, which says it whenever asked); the footers then leave it out
        until the occurrence is over."""
        allocator = self._allocator_for()
        if allocator is None:
            return None
        hint = cache_hint(releasable_bytes(allocator), allocator.memory_reserved())
        self._cache_told = hint is not None
        return hint

    def clear(self) -> None:
        """Forget every row, folded row and end state (an open cell stays open)."""
        self.rows.clear()
        self.causes.clear()
        self.folded.clear()
        self.states.clear()
        self.source_states.clear()
        self._last.clear()
        self._last_of = None

    # -- end states ----------------------------------------------------------------------------

    def live_blocks(self, allocator: CachingAllocator, *, cell: int | None = None
                    ) -> dict[int, LiveBlock]:
        """Every live block of ``allocator`` now, with its site and the cell that allocated it.

        A block unchanged since the last recorded state keeps the cell it had there; any other
        block is attributed to ``cell``."""
        out, new_last = self._live_blocks(allocator, cell)
        if cell is not None:
            self._last = new_last
            self._last_of = weakref.ref(allocator)
        return out

    def _live_blocks(self, allocator: CachingAllocator, cell: int | None
                     ) -> tuple[dict[int, LiveBlock], dict[tuple[int, int, int, int], LiveBlock]]:
        history = allocator.history
        table = history.table if history is not None else None
        sites = self._sites.setdefault(table, {}) if table is not None else {}
        last = self._last
        new_last: dict[tuple[int, int, int, int], LiveBlock] = {}
        for row in allocator.live_block_rows():
            block = last.get(row)  # the same address, sizes and stack: the same block
            if block is None:
                addr, size, requested, sid = row
                if table is None or sid == NO_STACK:
                    where: _Where = (None, None)
                elif sid in sites:
                    where = sites[sid]
                else:
                    where = sites[sid] = where_of(table.frames(sid), self.cell_files)
                block = LiveBlock(addr, size, requested, where[0], cell, where[1])
            new_last[row] = block
        return {row[0]: block for row, block in new_last.items()}, new_last

    def _store_state(self, cell: int, state: dict[int, LiveBlock]) -> None:
        if self.keep_states == 0:
            return
        self.states.pop(cell, None)
        self.states[cell] = state
        while len(self.states) > self.keep_states:
            self.states.popitem(last=False)

    def states_of(self, memory_source: str | None = None) -> Mapping[int, dict[int, LiveBlock]]:
        """The end states of our allocator (None) or of another memory source ("torch")."""
        if memory_source is None:
            return self.states
        return self.source_states.get(memory_source, OrderedDict())

    def state_after(self, cell: int, memory_source: str | None = None) -> dict[int, LiveBlock]:
        """The live blocks after ``cell``; KeyError (naming the cells kept) if not kept."""
        states = self.states_of(memory_source)
        try:
            return states[cell]
        except KeyError:
            kept = ", ".join(str(c) for c in states) or "none"
            raise KeyError(f"no state recorded after cell {cell} (kept: {kept})") from None

    def diff(self, a: int, b: int, memory_source: str | None = None) -> BlockDiff:
        """Blocks live after cell ``b`` but not after cell ``a``, and the other way round (of
        our allocator, or of ``memory_source``)."""
        before = self.state_after(a, memory_source)
        after = self.state_after(b, memory_source)
        new = [blk for addr, blk in sorted(after.items()) if before.get(addr) != blk]
        gone = [blk for addr, blk in sorted(before.items()) if after.get(addr) != blk]
        return BlockDiff(a, b, new, gone, memory_source)

    def holders(self, cell: int | None = None) -> list[tuple[int | None, str | None, int, int]]:
        """``(cell, site, bytes, blocks)`` of the live memory after ``cell`` (default: the last
        recorded), largest first."""
        if not self.states:
            return []
        state = self.states[cell if cell is not None else next(reversed(self.states))]
        return group_blocks(state.values())

    def table(self) -> LedgerTable:
        return LedgerTable(list(self.rows), list(self.causes), list(self.folded.values()),
                           self.keep_rows)


def _checked_keep_rows(keep_rows: int) -> int:
    # the footer reads the cause of the row just recorded: at least that one cell stays
    if isinstance(keep_rows, bool) or not isinstance(keep_rows, int) or keep_rows < 1:
        raise ValueError(f"keep_rows must be an int >= 1, got {keep_rows!r}")
    return keep_rows


def group_blocks(blocks: Iterator[LiveBlock] | Sequence[LiveBlock] | Any
                 ) -> list[tuple[int | None, str | None, int, int]]:
    """``(cell, site, bytes, blocks)`` per allocating cell and line, largest first."""
    groups: dict[tuple[int | None, str | None], list[int]] = {}
    for blk in blocks:
        g = groups.setdefault((blk.cell, blk.site), [0, 0])
        g[0] += blk.size
        g[1] += 1
    rows = [(c, s, n, k) for (c, s), (n, k) in groups.items()]
    rows.sort(key=lambda r: (-r[2], r[0] if r[0] is not None else -1, r[1] or ""))
    return rows


def name_cause(cell: int, state: Mapping[int, LiveBlock],
               namespace: Callable[[], Mapping[str, Any]] | None, cell_files: Mapping[str, int],
               hint: str | None = None) -> tuple[CellCause, int | None]:
    """The cause of ``cell``'s end ``state`` (of any memory source): what it left behind, who
    holds it (``holders.find`` from ``namespace()``, asked only when the cell left a block),
    and the line of the cell that allocated most of it (None when unknown). Note [Naming the
    cause]."""
    new = [blk for blk in state.values() if blk.cell == cell]
    if not new:  # nothing left behind: no holder search
        return CellCause(cache_hint=hint), None
    found = None
    if namespace is not None:
        found = find(namespace(), [(b.address, b.size) for b in new], cell_files=cell_files)
    held = found.held if found is not None else frozenset()
    # Where most of it came from: the line of this cell, and the innermost line of user code
    # (the same unless this cell's line called a function defined elsewhere).
    by_where: dict[tuple[int | None, str | None], int] = {}
    for blk in new:
        line = blk.origin[1] if blk.origin is not None and blk.origin[0] == cell else None
        if line is not None or blk.site is not None:
            by_where[line, blk.site] = by_where.get((line, blk.site), 0) + blk.size
    line, site = _largest(by_where) or (None, None)
    cause = CellCause(
        new_bytes=sum(b.size for b in new), new_blocks=len(new),
        holders=tuple(found.groups) if found is not None else (),
        unheld_bytes=sum(b.size for b in new if b.address not in held),
        line=None if line is None else f"cell [{cell}] line {line}", site=site,
        cache_hint=hint, search_cut=found.cut if found is not None else None)
    return cause, line


_Where = tuple[str | None, tuple[int, int] | None]  # a stack's site and its origin


def where_of(frames: list[Frame], cell_files: Mapping[str, int]) -> _Where:
    """The site of a stack and the ``(cell, line)`` of its outermost frame in a notebook cell.

    Under a cell magic that runs the cell's body (``%%gpumem_trace``), the outermost frame is
    the line that calls the magic (line 1 of the cell, as IPython compiles it); the body runs in
    a module-level frame of the same cell further in, and that frame's line is the origin."""
    origin: tuple[int, int] | None = None
    for f in reversed(frames):
        cell = cell_files.get(f["filename"])
        if cell is None:
            continue
        if origin is None:
            origin = (cell, f["line"])
            if f["name"] != "<module>":
                break
        elif cell == origin[0] and f["name"] == "<module>":
            origin = (cell, f["line"])  # the body, run by the magic of the line found first
        else:
            break
    return site_of(frames, cell_files), origin


def _largest(bytes_by: Mapping[Any, int]) -> Any:
    """The key with the most bytes (the first such in order), None for an empty mapping."""
    return max(bytes_by, key=lambda k: bytes_by[k]) if bytes_by else None


#: Lines the ledger's ``source`` column passes over: imports, comments, magics, shell commands.
_NOT_WORK = re.compile(r"^(import\s|from\s+\S+\s+import\s|#|%|!)")


def source_line(source: str, line: int | None = None) -> str:
    """The line of a cell that says what it did, stripped and cut to 80 characters: line number
    ``line`` (1-based) when given and present (the line that allocated the most), else the
    first that is not an import, comment, magic or shell command, else the first non-blank. Lines
    count as the editor counts them: under a cell magic (``%%gpumem_trace``), its line is line 1."""
    lines = source.splitlines()
    chosen = ""
    if line is not None and 1 <= line <= len(lines) and lines[line - 1].strip():
        chosen = lines[line - 1].strip()
    else:
        inside_import = False  # in the parentheses of "from x import (a, b)" across lines
        for text in (t.strip() for t in lines):
            if inside_import:
                inside_import = ")" not in text
                continue
            if not text:
                continue
            if _NOT_WORK.match(text):
                inside_import = text.startswith(("import", "from")) and text.endswith(("(", "\\"))
                continue
            chosen = text
            break
        else:
            chosen = next((t.strip() for t in lines if t.strip()), "")
    return chosen if len(chosen) <= 80 else chosen[:77] + "..."


@dataclass
class LedgerTable:
    """The ledger as a table: text/plain and text/html. ``causes`` (one a row, optional) fill the
    "held by" column: who holds the memory each cell left behind (shown when any cell did).
    ``folded`` (older cells added up, one a memory source) come first, under a line saying so."""

    rows: list[CellRecord] = field(default_factory=list)
    causes: list[CellCause] = field(default_factory=list)
    folded: list[FoldedCells] = field(default_factory=list)
    keep_rows: int = KEEP_ROWS  # the cells the ledger keeps in full, for that line

    HEADER = ("cell", "Δ allocated", "Δ reserved", "peak", "allocs", "frees", "segs", "OOMs",
              "time", "held by", "source")

    def _two_sources(self) -> bool:
        return (any("memory_source" in r for r in self.rows)
                or any(f.memory_source is not None for f in self.folded))

    def _label(self, memory_source: str | None) -> str:
        if memory_source is not None:
            return f" {memory_source}"
        return " cupy" if self._two_sources() else ""  # rows of two sources: each says whose

    def _folded_cells(self, f: FoldedCells) -> tuple[str, ...]:
        return (f.label() + self._label(f.memory_source), *f.numbers(), "", f.source())

    def _cells(self, row: CellRecord, cause: CellCause | None) -> tuple[str, ...]:
        label = self._label(row.get("memory_source"))
        return (f"[{row['cell']}]{label}", format_signed_bytes(row["allocated_delta"]),
                format_signed_bytes(row["reserved_delta"]), peak_text(row),
                str(row["allocs"]), str(row["frees"]), str(row["segments_new"]), str(row["ooms"]),
                f"{row['wall_s']:.3f} s", held_by(cause) if cause else "", row["source"])

    def _table(self) -> Table:
        causes: list[CellCause | None] = list(self.causes[:len(self.rows)])
        causes += [None] * (len(self.rows) - len(causes))
        rows = [self._folded_cells(f) for f in self.folded]
        rows += [self._cells(r, c) for r, c in zip(self.rows, causes, strict=True)]
        if any(r[9] for r in rows):
            return Table(self.HEADER, rows, "<>>>>>>>><", "jupyter-gpumem-cells")
        # no cell left memory behind: no "held by" column
        return Table(self.HEADER[:9] + self.HEADER[10:], [r[:9] + r[10:] for r in rows],
                     "<>>>>>>>>", "jupyter-gpumem-cells")

    def note(self) -> str | None:
        """The line saying that older rows were folded (None when none were)."""
        return folded_note(self.folded, self.keep_rows) if self.folded else None

    def text(self) -> str:
        if not (self.rows or self.folded):
            return "no cells recorded yet"
        note = self.note()
        return (f"{note}\n" if note else "") + self._table().text()

    def html(self) -> str:
        if not (self.rows or self.folded):
            return "<p>no cells recorded yet</p>"
        note = self.note()
        return (f"<p>{html.escape(note)}</p>" if note else "") + self._table().html()

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


@dataclass
class BlockDiff:
    """Blocks that appeared and disappeared between the end states of cells ``a`` and ``b``."""

    a: int
    b: int
    new: list[LiveBlock]
    gone: list[LiveBlock]
    memory_source: str | None = None  # "torch" for PyTorch's blocks; None: our allocator's

    @property
    def net(self) -> int:
        return sum(b.size for b in self.new) - sum(b.size for b in self.gone)

    def _table(self) -> Table:
        rows = []
        for sign, blocks in (("+", self.new), ("-", self.gone)):
            for blk in blocks:
                rows.append((sign, f"{blk.address:#x}", format_bytes(blk.size),
                             f"[{blk.cell}]" if blk.cell is not None else "?",
                             blk.site or "(line unknown: history off)"))
        return Table(("", "address", "size", "cell", "allocated at"), rows, "<<><")

    def text(self) -> str:
        whose = f"{self.memory_source}: " if self.memory_source else ""
        head = (f"{whose}cell [{self.a}] → cell [{self.b}]: {len(self.new)} new block(s) "
                f"({format_bytes(sum(b.size for b in self.new))}), {len(self.gone)} freed "
                f"({format_bytes(sum(b.size for b in self.gone))}), "
                f"net {format_signed_bytes(self.net)}")
        rows = self._table().text(indent="  ", header=False)
        return f"{head}\n{rows}" if rows else head

    def html(self) -> str:
        head = html.escape(self.text().splitlines()[0])
        return f"<p>{head}</p>{self._table().html()}"

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


_ = NO_CELL  # the value ``current_cell`` has outside cells

# Note [Naming the cause]: a cell "left behind" the blocks live at its end that were not in the
# previous end state (same address, size, requested size and stack), so it costs no history:
# the ledger already lists the live blocks at each cell's end. When there are none, nothing else
# is done. Otherwise the user namespace is searched for their holders (``data.holders``: one
# level of lists, tuples and dicts, summed by variable: ``losses (list of 20 × 64 MiB)``), and,
# when stacks are recorded (the default ``record_history="state"`` keeps them for live blocks),
# the line of the cell behind most of the bytes is named; without stacks, the holders alone.
# The ledger's ``source`` column shows that line, else the cell's first line of real code.
# Limits: a block freed and allocated again at the same address, with the same sizes and stack,
# between two cell ends looks unchanged; holders inside objects' attributes are not found
# (counted as "no variable"). The cache hint counts only whole cached segments, the bytes
# ``empty_cache`` would release, and is said in the footer once an occurrence: again only after
# those bytes have fallen back under the thresholds. ``bench/bench_ledger.py`` measures it all.
