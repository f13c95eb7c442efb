"""The per-cell ledger: what every notebook cell did to each memory source, one ``CellRecord`` a
cell and source.

For each cell, and each source read while it ran (``sources.current_sources``: our allocator
"cupy", PyTorch's "torch", JAX's, a third party's), the ledger keeps

- a ``CellRecord`` (``schema``): the change in allocated and reserved bytes, the cell's own peak
  (the source's ``end_cell``: our allocator's watermark, else Note [Cell peak from counters] in
  ``sources.base``; the user's peak stats are never reset), the allocations, frees, new segments
  and OOMs (deltas of the ``memory_stats`` counters ``allocation.all.allocated``,
  ``allocation.all.freed``, ``segment.all.allocated`` and ``num_ooms``), wall time, and the range
  of history events the cell produced;
- a compact end state: every live block's address, size, requested size, allocating line and
  the cell that allocated it (from the source's ``live_blocks``). ``diff(a, b)`` compares two
  end states of a source block by block;
- a ``CellCause``: what the cell left behind (its blocks still live at its end), which variables
  of the user's namespace hold them, the line that allocated most of them (when stacks are
  recorded), and a hint when cached memory is worth giving back. See Note [Naming the cause].

A row says whose it is by Note [Whose row] (``ledger_table``, with the table and the diff
the user sees). Rows and causes are kept for the last ``keep_rows``
cells (``KEEP_ROWS``, 200); older rows are folded into one ``FoldedCells`` a memory source
(``folded_cells``), end states for the last ``keep_states`` cells of each source.

While a cell runs, our allocator's ``current_cell`` is its execution count, so history events
carry it (``CupySource.start_cell``). Event positions (``start_event``/``end_event``) count every
event the allocator's history has recorded since it was last switched on, dropped ones
included: subtract the snapshot's ``jupyter_gpumem["history_dropped"]`` to get an index into
that snapshot's trace.

Nothing here imports IPython: ``Ledger.cell()`` is the plain-Python form of the extension's hooks.
"""

from __future__ import annotations

import contextlib
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.holders import find
from jupyter_gpumem.data.reach import DEFAULT_BUDGET, Budget
from jupyter_gpumem.data.schema import Frame
from jupyter_gpumem.data.sites import site_of
from jupyter_gpumem.notebook.advice import CellCause, cache_hint
from jupyter_gpumem.notebook.folded_cells import KEEP_ROWS, FoldedCells
from jupyter_gpumem.notebook.ledger_table import (
    DEFAULT_SOURCE,
    BlockDiff,
    LedgerTable,
    LiveBlock,
    row_source,
    source_field,
    source_label,
)
from jupyter_gpumem.sources.protocol import NO_STACK, LiveBlocks, Stacks
from jupyter_gpumem.sources.registry import current_sources

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord
    from jupyter_gpumem.sources.protocol import CellMark, MemorySource

__all__ = ["DEFAULT_SOURCE", "KEEP_ROWS", "BlockDiff", "CellCause", "FoldedCells", "Ledger",
           "LedgerTable", "LiveBlock", "group_blocks", "name_cause", "releasable_bytes",
           "row_source", "site_of", "source_label", "source_line", "where_of"]


def releasable_bytes(stats: Mapping[str, int]) -> int:
    """Bytes ``empty_cache`` would give back, from a source's ``memory_stats()``: cached blocks
    that are whole segments (reserved, less allocated, less the free parts of segments that
    still have live blocks)."""
    return max(0, stats.get("reserved_bytes.all.current", 0)
               - stats.get("allocated_bytes.all.current", 0)
               - stats.get("inactive_split_bytes.all.current", 0))


def _counter_delta(after: int, before: int) -> int:
    # reset_accumulated_memory_stats inside the cell zeroes the counters: when a counter ends
    # below where it started, count from zero. (A reset that ends at or above the start value
    # cannot be told apart from no reset, and undercounts.)
    return after - before if after >= before else after


_Row = tuple[int, int, int, int]  # a ``LiveBlocks`` row: address, size, requested, stack id


class _Ref:
    """An object the ledger compares a later one with by identity (a source's ``owner``, a
    stacks table): held weakly where it can be, so the ledger keeps no allocator alive; an
    object that cannot be (a tuple) is held, and compared by equality."""

    __slots__ = ("_ref", "_value")

    def __init__(self, obj: Any) -> None:
        self._ref: weakref.ref[Any] | None
        try:
            self._ref, self._value = weakref.ref(obj), None
        except TypeError:
            self._ref, self._value = None, obj

    def refers_to(self, obj: Any) -> bool:
        if self._ref is not None:
            return self._ref() is obj
        return self._value is obj or bool(self._value == obj)


@dataclass
class _Track:
    """What the ledger remembers of one source between cells: its blocks at the last end state
    (or at the start of its first cell), whose they were, and its end states."""

    #: the ``owner`` and stacks table of the blocks listed last; None: none listed yet
    owner: _Ref | None = None
    stacks: _Ref | None = None
    #: the blocks listed last: ``LiveBlocks`` row -> block
    last: dict[_Row, LiveBlock] = field(default_factory=dict)
    #: cell number -> its end state (address -> LiveBlock), the last ``keep_states`` cells
    states: OrderedDict[int, dict[int, LiveBlock]] = field(default_factory=OrderedDict)
    cache_told: bool = False  # the cache hint was given for the current occurrence


@dataclass
class _OpenCell:
    cell: int
    source: str  # the whole cell
    start_s: float
    marks: list[tuple[MemorySource, CellMark]]  # one a source read at the start


_SourcesFor = Callable[[], Iterable["MemorySource"]]


class Ledger:
    """Rows of ``CellRecord`` and per-cell end states of every source, with hooks called on every
    new row.

    ``sources_for`` gives the sources to read at a cell's start (the selected ones readable now,
    ``sources.current_sources``); tests pass their own. ``rows`` and ``causes`` hold the last
    ``keep_rows`` cells (every source's row of each); older rows are added into ``folded`` and
    let go."""

    def __init__(self, *, keep_states: int = 200, keep_rows: int = KEEP_ROWS,
                 clock: Callable[[], float] = time.perf_counter,
                 sources_for: _SourcesFor = current_sources,
                 namespace: Callable[[], Mapping[str, Any]] | None = None) -> None:
        if keep_states < 0:
            raise ValueError(f"keep_states must be >= 0, got {keep_states}")
        self.keep_states = keep_states
        self.keep_rows = _checked_keep_rows(keep_rows)
        self.rows: list[CellRecord] = []
        #: what each row's cell left behind, one ``CellCause`` a row (same order as ``rows``).
        self.causes: list[CellCause] = []
        #: the rows older than the last ``keep_rows`` cells, added up, by the rows'
        #: ``memory_source`` (None: our allocator)
        self.folded: dict[str | None, FoldedCells] = {}
        #: the variables searched for holders (the shell's ``user_ns``); None: no search.
        self.namespace = namespace
        #: source file name of a cell's code -> its cell number, so sites read "cell [N] line L".
        self.cell_files: dict[str, int] = {}
        #: how long the holder search may look (``GpuMem.holder_search_ms``)
        self.search_budget: Budget = DEFAULT_BUDGET
        self._running: int | None = None  # the cell between start_cell and end_cell
        self._clock = clock
        self._sources_for = sources_for
        self._open: _OpenCell | None = None
        self._hooks: list[Callable[[CellRecord], None]] = []
        self._tracks: dict[str, _Track] = {}  # by source name
        #: the rows of the cell recorded last, and the source of each (``source_of``)
        self._ended: list[tuple[CellRecord, MemorySource]] = []
        self._sites: weakref.WeakKeyDictionary[Any, dict[int, _Where]] = (
            weakref.WeakKeyDictionary())

    # -- hooks ---------------------------------------------------------------------------------

    def on_record(self, hook: Callable[[CellRecord], None]) -> Callable[[], None]:
        """Call ``hook(row)`` after every recorded row; returns a function that unsubscribes."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    # -- recording -----------------------------------------------------------------------------

    @property
    def running(self) -> int | None:
        """The cell being recorded now, if any."""
        return self._running

    def start_cell(self, cell: int, source: str = "") -> None:
        """Begin recording ``cell`` on every source readable now; a cell still open is closed
        first. A source that fails to say where it starts gets no row for this cell."""
        if self._open is not None:
            self.end_cell()
        self._running = cell
        marks: list[tuple[MemorySource, CellMark]] = []
        for src in self._sources_for():
            track = self._track(src.name)
            try:
                if track.owner is None:  # its first cell: the blocks from before are not its
                    self._list(track, src.live_blocks(), None)
                marks.append((src, src.start_cell(cell)))
            except Exception:  # e.g. PyTorch without a usable CUDA: no row of it this cell
                continue
        if marks:
            self._open = _OpenCell(cell, source, self._clock(), marks)

    def end_cell(self, *, filename: str | None = None) -> list[CellRecord]:
        """Finish the open cell and return its rows, one a source, in the order the sources were
        read (none when no cell was open).

        ``filename`` is the name the cell's code was compiled under, so that lines of this
        cell are shown as ``cell [N] line L``."""
        open_, self._open = self._open, None
        self._running = None
        if open_ is None:
            return []
        wall = self._clock() - open_.start_s
        if filename:
            self.cell_files[filename] = open_.cell
        self._ended = []
        for src, mark in open_.marks:
            row = self._record(open_, src, mark, wall)
            self._ended.append((row, src))
            for hook in list(self._hooks):
                hook(row)
        return [row for row, _ in self._ended]

    def _record(self, open_: _OpenCell, src: MemorySource, mark: CellMark, wall: float
                ) -> CellRecord:
        """The row of ``src`` for the cell ending now, with its cause and end state kept."""
        end = src.end_cell(mark)
        st = src.memory_stats()
        track = self._track(src.name)
        state = self._list(track, src.live_blocks(), open_.cell)
        cause, line = self._cause(open_.cell, state, st, track)
        s0 = mark.stats

        def delta(key: str) -> int:
            return st.get(key, 0) - s0.get(key, 0)

        def counter(key: str) -> int:
            return _counter_delta(st.get(key, 0), s0.get(key, 0))

        row: CellRecord = {
            "cell": open_.cell,
            "source": source_line(open_.source, line),
            "allocated_delta": delta("allocated_bytes.all.current"),
            "reserved_delta": delta("reserved_bytes.all.current"),
            "peak_allocated": end.peak.bytes,
            "allocs": counter("allocation.all.allocated"),
            "frees": counter("allocation.all.freed"),
            "segments_new": counter("segment.all.allocated"),
            "ooms": counter("num_ooms"),
            "wall_s": wall,
            "start_event": end.events[0],
            "end_event": end.events[1],
        }
        memory_source = source_field(src.name)
        if memory_source is not None:  # Note [Whose row]
            row["memory_source"] = memory_source
            row["peak_exact"] = end.peak.exact
        elif not end.peak.exact:
            row["peak_exact"] = False
        self._append(row, cause)
        if self.keep_states:
            track.states.pop(open_.cell, None)
            track.states[open_.cell] = state
            while len(track.states) > self.keep_states:
                track.states.popitem(last=False)
        return row

    @contextlib.contextmanager
    def cell(self, cell: int, source: str = "") -> Iterator[None]:
        """Record the body of the ``with`` block as cell ``cell`` (the hooks' plain-Python form)."""
        self.start_cell(cell, source)
        try:
            yield
        finally:
            self.end_cell()

    def source_of(self, row: CellRecord) -> MemorySource | None:
        """The source that recorded ``row``, a row of the cell recorded last (None for another
        row): the footer reads the reserved bytes now from it."""
        return next((src for r, src in self._ended if r is row), None)

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
        """Rows recorded for the source ``memory_source`` (None: ours, "cupy"), folded ones
        included; with ``every_source``, the rows of every source."""
        if every_source:
            return len(self.rows) + sum(f.cells for f in self.folded.values())
        key = source_field(memory_source)
        folded = self.folded.get(key)
        return (sum(1 for r in self.rows if r.get("memory_source") == key)
                + (folded.cells if folded is not None else 0))

    def _cause(self, cell: int, state: dict[int, LiveBlock], stats: Mapping[str, int],
               track: _Track) -> tuple[CellCause, int | None]:
        """The cause of ``cell``'s end ``state``, and the line of the cell that allocated most of
        what it left (None when unknown)."""
        hint = cache_hint(releasable_bytes(stats), stats.get("reserved_bytes.all.current", 0))
        if hint is None or track.cache_told:
            track.cache_told = hint is not None
            hint = None
        else:
            track.cache_told = True
        return name_cause(cell, state, self.namespace, self.cell_files, hint,
                          budget=self.search_budget)

    def cause_of(self, row: CellRecord) -> CellCause | None:
        """The ``CellCause`` recorded with ``row`` (a row of ``rows``), None for another row."""
        for i in range(len(self.rows) - 1, -1, -1):
            if self.rows[i] is row:
                return self.causes[i] if i < len(self.causes) else None
        return None

    def cache_hint_now(self, source: MemorySource | None = None) -> str | None:
        """The cache hint for ``source`` (default: the first source readable now) when its cached
        memory is worth giving back (for the status line, which says it whenever asked); the
        footers then leave it out until the occurrence is over."""
        src = source if source is not None else next(iter(self._sources_for()), None)
        if src is None:
            return None
        st = src.memory_stats()
        hint = cache_hint(releasable_bytes(st), st.get("reserved_bytes.all.current", 0))
        self._track(src.name).cache_told = hint is not None
        return hint

    def clear(self) -> None:
        """Forget every row, folded row and end state (an open cell stays open)."""
        self.rows.clear()
        self.causes.clear()
        self.folded.clear()
        self._tracks.clear()
        self._ended = []

    # -- end states ----------------------------------------------------------------------------

    def _track(self, name: str) -> _Track:
        track = self._tracks.get(name)
        if track is None:
            track = self._tracks[name] = _Track()
        return track

    def live_blocks(self, source: MemorySource) -> dict[int, LiveBlock]:
        """Every live block of ``source`` now, with its site and the cell that allocated it: a
        block unchanged since the source's last end state keeps the cell it had there; any
        other block has none. Changes nothing the next cell compares with."""
        track = self._tracks.get(source.name) or _Track()
        return self._list(track, source.live_blocks(), None, remember=False)

    def _list(self, track: _Track, live: LiveBlocks, cell: int | None, *, remember: bool = True
              ) -> dict[int, LiveBlock]:
        """``live`` as an end state (address -> block), Note [Blocks a cell left]: a block listed
        last time keeps its cell; any other block is attributed to ``cell``, unless the blocks
        listed last were another owner's (then to none). ``remember``: list them as the last."""
        same_owner = track.owner is not None and track.owner.refers_to(live.owner)
        if not same_owner:
            cell = None
        stacks = live.stacks
        sites = self._sites_of(stacks)
        cell_files = self.cell_files
        new_last: dict[_Row, LiveBlock] = {}
        if same_owner and track.stacks is not None and track.stacks.refers_to(stacks):
            last = track.last  # stack ids of one table: compare them too
            for row in live.rows:
                block = last.get(row)  # the same address, sizes and stack: the same block
                if block is None:
                    block = _new_block(row, cell, stacks, sites, cell_files)
                new_last[row] = block
        else:
            by_place = ({row[:3]: blk for row, blk in track.last.items()} if same_owner else {})
            for row in live.rows:
                block = by_place.get(row[:3])
                if block is None:
                    block = _new_block(row, cell, stacks, sites, cell_files)
                new_last[row] = block
        if remember:
            track.last = new_last
            track.owner = _Ref(live.owner)
            track.stacks = _Ref(stacks)
        return {row[0]: block for row, block in new_last.items()}

    def _sites_of(self, stacks: Stacks | None) -> dict[int, _Where]:
        """The sites found so far in the stacks table ``stacks``, by stack id (kept while the
        table lives; only for this call where it cannot be referred to weakly)."""
        if stacks is None:
            return {}
        try:
            return self._sites.setdefault(stacks, {})
        except TypeError:
            return {}

    def states_of(self, memory_source: str | None = None) -> Mapping[int, dict[int, LiveBlock]]:
        """The end states of the source ``memory_source`` (None: ours, "cupy"), by cell."""
        track = self._tracks.get(memory_source or DEFAULT_SOURCE)
        return track.states if track is not None else OrderedDict()

    @property
    def states(self) -> Mapping[int, dict[int, LiveBlock]]:
        """Our allocator's end states (``states_of("cupy")``)."""
        return self.states_of(DEFAULT_SOURCE)

    def state_after(self, cell: int, memory_source: str | None = None) -> dict[int, LiveBlock]:
        """The live blocks after ``cell``; KeyError (naming the cells kept) if not kept."""
        states = self.states_of(memory_source)
        try:
            return states[cell]
        except KeyError:
            kept = ", ".join(str(c) for c in states) or "none"
            raise KeyError(f"no state recorded after cell {cell} (kept: {kept})") from None

    def diff(self, a: int, b: int, memory_source: str | None = None) -> BlockDiff:
        """Blocks live after cell ``b`` but not after cell ``a``, and the other way round, of the
        source ``memory_source`` (None: ours); its text names the source as a row alone would
        (Note [Whose row])."""
        before = self.state_after(a, memory_source)
        after = self.state_after(b, memory_source)
        new = [blk for addr, blk in sorted(after.items()) if before.get(addr) != blk]
        gone = [blk for addr, blk in sorted(before.items()) if after.get(addr) != blk]
        return BlockDiff(a, b, new, gone, source_label(memory_source, ()))

    def holders(self, cell: int | None = None, memory_source: str | None = None
                ) -> list[tuple[int | None, str | None, int, int]]:
        """``(cell, site, bytes, blocks)`` of the live memory of a source (None: ours) after
        ``cell`` (default: the last recorded), largest first."""
        states = self.states_of(memory_source)
        if not states:
            return []
        state = states[cell if cell is not None else list(states)[-1]]
        return group_blocks(state.values())

    def table(self) -> LedgerTable:
        return LedgerTable(list(self.rows), list(self.causes), list(self.folded.values()),
                           self.keep_rows)


def _new_block(row: _Row, cell: int | None, stacks: Stacks | None, sites: dict[int, _Where],
               cell_files: Mapping[str, int]) -> LiveBlock:
    addr, size, requested, sid = row
    if stacks is None or sid == NO_STACK:
        where: _Where = (None, None)
    elif sid in sites:
        where = sites[sid]
    else:
        where = sites[sid] = where_of(stacks.frames(sid), cell_files)
    return LiveBlock(addr, size, requested, where[0], cell, where[1])


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
               hint: str | None = None, *, budget: Budget = DEFAULT_BUDGET
               ) -> tuple[CellCause, int | None]:
    """The cause of ``cell``'s end ``state`` (of any memory source): what it left behind, who
    holds it (``holders.find`` from ``namespace()``, asked only when the cell left a block),
    and the line of the cell that allocated most of it (None when unknown). Note [Naming the
    cause]."""
    new = [blk for blk in state.values() if blk.cell == cell]
    if not new:  # nothing left behind: no holder search
        return CellCause(cache_hint=hint), None
    found = None
    if namespace is not None:
        found = find(namespace(), [(b.address, b.size) for b in new], cell_files=cell_files,
                     budget=budget)
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
# ``empty_cache`` would release (from the source's counters: reserved, less allocated, less the
# free parts of segments with live blocks), and is said in the footer once an occurrence, per
# source: again only after those bytes have fallen back under the thresholds.
# ``bench/bench_ledger.py`` measures it all.

# Note [Blocks a cell left]: each source's blocks are listed at the end of every cell it is read
# in (``live_blocks``: rows of address, size, requested size and stack id, the stacks table,
# and the ``owner``), and once more at the start of its first cell, so that the blocks from
# before the ledger are nobody's. A block listed last time keeps the cell it had; any other is
# the cell's. Stack ids are compared only within one stacks table (our allocator's history keeps
# one for the session; a snapshot's ids are its own, so PyTorch's blocks compare by address and
# sizes). When the owner changed since the last listing (a device switch: another allocator's
# blocks), nothing is compared and no block is the cell's: the next cell compares with these.
# The owner is asked only at the end of a cell, so a cell that switches the device and then
# allocates on the new one is said to have left nothing there.
