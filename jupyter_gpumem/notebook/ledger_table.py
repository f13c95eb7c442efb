"""The ledger as the user sees it: ``LedgerTable`` (``%gpumem cells``), ``BlockDiff``
(``%gpumem diff``) of live blocks (``LiveBlock``: one of a cell's end state), and the one rule that
says whose a row is (Note [Whose row]), which the footer follows too.
"""

from __future__ import annotations

import html
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.units import format_bytes, format_signed_bytes
from jupyter_gpumem.notebook.advice import CellCause, held_by, peak_text
from jupyter_gpumem.notebook.folded_cells import KEEP_ROWS, FoldedCells, folded_note
from jupyter_gpumem.render.table import Table

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord

__all__ = ["DEFAULT_SOURCE", "BlockDiff", "LedgerTable", "LiveBlock", "row_source",
           "source_field", "source_label"]

#: The source whose rows do not name it (Note [Whose row]): our allocator.
DEFAULT_SOURCE = "cupy"


def row_source(row: CellRecord) -> str:
    """The name of the source a row is of (Note [Whose row])."""
    return row.get("memory_source", DEFAULT_SOURCE)


def source_field(name: str | None) -> str | None:
    """A source's name as a row's ``memory_source`` holds it: left out (None) for ours."""
    return None if name in (None, DEFAULT_SOURCE) else name


def source_label(name: str | None, names: Collection[str | None]) -> str | None:
    """The word a row (a footer, a diff) of source ``name`` is shown with, beside the rows of
    ``names``: none when every one of them is our allocator's, else the source's name (Note
    [Whose row]). None and ``DEFAULT_SOURCE`` name the same source."""
    if all(source_field(n) is None for n in names) and source_field(name) is None:
        return None
    return name or DEFAULT_SOURCE


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

    def _label(self, memory_source: str | None, names: Collection[str | None]) -> str:
        label = source_label(memory_source, names)  # Note [Whose row]
        return f" {label}" if label else ""

    def _folded_cells(self, f: FoldedCells, names: Collection[str | None]) -> tuple[str, ...]:
        return (f.label() + self._label(f.memory_source, names), *f.numbers(), "", f.source())

    def _cells(self, row: CellRecord, cause: CellCause | None, names: Collection[str | None]
               ) -> tuple[str, ...]:
        label = self._label(row.get("memory_source"), names)
        return (f"[{row['cell']}]{label}", format_signed_bytes(row["allocated_delta"]),
                format_signed_bytes(row["reserved_delta"]), peak_text(row),
                str(row["allocs"]), str(row["frees"]), str(row["segments_new"]), str(row["ooms"]),
                f"{row['wall_s']:.3f} s", held_by(cause) if cause else "", row["source"])

    def _table(self) -> Table:
        causes: list[CellCause | None] = list(self.causes[:len(self.rows)])
        causes += [None] * (len(self.rows) - len(causes))
        names = {r.get("memory_source") for r in self.rows} | {f.memory_source
                                                               for f in self.folded}
        rows = [self._folded_cells(f, names) for f in self.folded]
        rows += [self._cells(r, c, names) for r, c in zip(self.rows, causes, strict=True)]
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
    #: the source its text names ("torch: cell [1] → ..."); None: unnamed (Note [Whose row])
    memory_source: str | None = None

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


# Note [Whose row]: a row of the source "cupy" (ours, ``DEFAULT_SOURCE``) leaves
# ``memory_source`` out, as every row did before there were other sources (a ledger of CuPy
# alone reads as it always did); a row of any other source names it ("torch", "jax"), and
# carries ``peak_exact``, which a row of ours has only when its peak is a bound. In the API, None
# and "cupy" name the same source (``states_of``, ``diff``, ``recorded``). Shown, rows are
# labelled by one rule (``source_label``): unlabelled when every row beside them is ours, else
# each with its source's name. So ``%gpumem cells``, the footer and ``%gpumem diff`` read as
# before for CuPy alone, "torch" rows say so alone or beside ours, and with two sources every
# row (every footer line, every diff) says whose it is.
