"""The ledger's older cells, folded: one summary a memory source of the rows it no longer keeps.

The ledger keeps the rows (and causes) of its last ``keep_rows`` cells in full (``KEEP_ROWS``,
the setting ``GpuMem.keep_rows``); a row older than that is added into the ``FoldedCells`` of
its memory source and let go, so a session of ten thousand cells costs what one of
``KEEP_ROWS`` does. ``%gpumem cells`` shows each fold as the first row of the table, its cells
as a range (``[1]–[800]``), the totals of its counters, the highest of its peaks and the words
``N older cells, folded``, under a line that says the rows were folded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_gpumem.data.units import format_bytes, format_signed_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord

__all__ = ["KEEP_ROWS", "FoldedCells", "folded_note"]

#: Cells whose ledger rows are kept in full (``GpuMem.keep_rows``): as many as end states are kept
#: by default (``keep_states``), so ``%gpumem diff`` reaches the cells ``%gpumem cells`` lists.
KEEP_ROWS = 200


@dataclass
class FoldedCells:
    """The rows of one memory source folded out of the ledger, added up."""

    #: the rows' ``memory_source``: None for our allocator's, else the source's name ("torch");
    #: Note [Whose row] in ``ledger_table``
    memory_source: str | None
    cells: int = 0  # rows folded (one a cell)
    first_cell: int | None = None
    last_cell: int | None = None
    allocated_delta: int = 0
    reserved_delta: int = 0
    peak_allocated: int = 0  # the highest peak of the folded cells
    peak_exact: bool = True  # False when one of those peaks was only a bound
    allocs: int = 0
    frees: int = 0
    segments_new: int = 0
    ooms: int = 0
    wall_s: float = 0.0

    def add(self, row: CellRecord) -> None:
        """Fold ``row`` in (rows come oldest first)."""
        self.cells += 1
        if self.first_cell is None:
            self.first_cell = row["cell"]
        self.last_cell = row["cell"]
        self.allocated_delta += row["allocated_delta"]
        self.reserved_delta += row["reserved_delta"]
        self.peak_allocated = max(self.peak_allocated, row["peak_allocated"])
        self.peak_exact = self.peak_exact and row.get("peak_exact", True)
        self.allocs += row["allocs"]
        self.frees += row["frees"]
        self.segments_new += row["segments_new"]
        self.ooms += row["ooms"]
        self.wall_s += row["wall_s"]

    def label(self) -> str:
        """``[1]–[800]``: the cells folded."""
        if self.first_cell == self.last_cell:
            return f"[{self.first_cell}]"
        return f"[{self.first_cell}]–[{self.last_cell}]"

    def numbers(self) -> tuple[str, ...]:
        """The table's cells from Δ allocated to time, as the ledger's rows give them."""
        peak = format_bytes(self.peak_allocated)
        return (format_signed_bytes(self.allocated_delta),
                format_signed_bytes(self.reserved_delta),
                peak if self.peak_exact else f"≤ {peak}", str(self.allocs), str(self.frees),
                str(self.segments_new), str(self.ooms), f"{self.wall_s:.3f} s")

    def source(self) -> str:
        return f"{self.cells} older cell{'s' if self.cells != 1 else ''}, folded"


def folded_note(folds: list[FoldedCells], keep_rows: int) -> str:
    """The line above the table: that older rows were folded, and how many cells are kept."""
    cells = max(f.cells for f in folds)
    rows = "the first row adds" if len(folds) == 1 else "the first rows (one a source) add"
    return (f"older rows folded: {rows} up {cells} older cell{'s' if cells != 1 else ''} "
            f"(totals, and the highest peak); the last {keep_rows} cells are kept in full "
            "(GpuMem.keep_rows)")
