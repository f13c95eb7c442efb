"""The words the footer, the ledger and the status line use to say *why*: what a cell left behind
and who holds it, and cached memory worth giving back. (What our allocator's history records,
in words, is ``sources.cupy.history_words``.)

Pure functions of plain values (a ``CellRecord``, a ``CellCause``, byte counts), so each line can
be tested as an exact string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_gpumem.data.holders import FORGET_ERROR_CODE, HolderGroup
from jupyter_gpumem.data.reach import TRACEBACK
from jupyter_gpumem.data.sizes import GiB
from jupyter_gpumem.data.units import format_bytes, format_signed_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord

__all__ = ["CACHE_HINT_BYTES", "HOLDERS_SHOWN", "CellCause", "cache_hint", "cause_line",
           "footer_text", "forget_error_hint", "held_by", "peak_text"]

#: Cached memory that ``empty_cache`` would release is worth a word above this many bytes (and
#: when it is more than half of what is reserved).
CACHE_HINT_BYTES = 1 * GiB
#: Holders named in the footer and the ledger; the rest are counted.
HOLDERS_SHOWN = 3


@dataclass(frozen=True)
class CellCause:
    """Why a cell's memory changed: what it left behind and who holds it (Note [Naming the
    cause])."""

    new_bytes: int = 0  # bytes of the blocks the cell allocated that are still live at its end
    new_blocks: int = 0  # how many blocks
    holders: tuple[HolderGroup, ...] = ()  # the variables holding them, most bytes first
    unheld_bytes: int = 0  # bytes of new blocks no variable of the namespace was found holding
    #: the line of this cell behind most of them, ``cell [N] line L``; None without stacks
    line: str | None = None
    #: the innermost line of user code behind them (``line``, or a function it called; None
    #: without stacks)
    site: str | None = None
    cache_hint: str | None = None  # cached memory worth giving back, said once an occurrence
    search_cut: str | None = None  # "search stopped at 50 ms" when the holder search was cut

    @property
    def error_bytes(self) -> int:
        """Bytes that the last exception's traceback keeps alive (its frames' locals)."""
        return sum(g.bytes for g in self.holders if g.kind == TRACEBACK)


def cache_hint(releasable: int, reserved: int) -> str | None:
    """What to say about ``releasable`` bytes of whole cached segments out of ``reserved``: a hint
    with the fix when they are more than ``CACHE_HINT_BYTES`` and more than half of reserved,
    else None."""
    if releasable <= CACHE_HINT_BYTES or 2 * releasable <= reserved:
        return None
    return (f"{format_bytes(releasable)} of the {format_bytes(reserved)} reserved is cached but "
            "unused; %gpumem empty-cache or gm.empty_cache() gives it back to the device")


def held_by(cause: CellCause) -> str:
    """``losses (list of 20 × 64 MiB), x (2.0 MiB)``: who holds the memory a cell left behind;
    ``""`` when it left nothing."""
    if cause.new_bytes <= 0:
        return ""
    parts = [g.describe() for g in cause.holders[:HOLDERS_SHOWN]]
    if len(cause.holders) > HOLDERS_SHOWN:
        rest = cause.holders[HOLDERS_SHOWN:]
        parts.append(f"{len(rest)} more ({format_bytes(sum(g.bytes for g in rest))})")
    if cause.unheld_bytes:
        cut = f" ({cause.search_cut})" if cause.search_cut else ""
        parts.append(f"{format_bytes(cause.unheld_bytes)} by no variable found{cut}" if parts
                     else f"no variable found{cut}")
    return ", ".join(parts)


def forget_error_hint(cause: CellCause) -> str | None:
    """What to do when the last error's traceback keeps memory alive, None when it keeps none."""
    if cause.error_bytes <= 0:
        return None
    return (f"the last error keeps {format_bytes(cause.error_bytes)} alive in its traceback's "
            f"frames: %gpumem forget-error frees it (in plain Python: {FORGET_ERROR_CODE})")


def cause_line(cause: CellCause) -> str:
    """``left 1.2 GiB in 20 new blocks, held by losses (list of 20 × 64 MiB); allocated at cell
    [5] line 3``, with ``(in helpers.py:12)`` when that line called a function that allocated;
    the lines are named only when stacks are recorded."""
    blocks = f"{cause.new_blocks} new block{'' if cause.new_blocks == 1 else 's'}"
    line = f"left {format_bytes(cause.new_bytes)} in {blocks}, held by {held_by(cause)}"
    if cause.line is not None and cause.site not in (None, cause.line):
        line += f"; allocated at {cause.line} (in {cause.site})"
    elif cause.line is not None or cause.site is not None:
        line += f"; allocated at {cause.line or cause.site}"
    return line


def peak_text(row: CellRecord) -> str:
    """A row's peak: ``1.5 GiB``, or ``≤ 1.5 GiB`` when only a bound is known (Note [Cell peak
    from counters] in ``sources.base``)."""
    text = format_bytes(row["peak_allocated"])
    return text if row.get("peak_exact", True) else f"≤ {text}"


def footer_text(row: CellRecord, reserved: int, cause: CellCause | None = None,
                label: str | None = None) -> str:
    """The footer ``%gpumem auto on`` prints after each cell: one line of numbers, then what the
    cell left behind and a cache hint, each on its own line when there is one. ``label`` names
    the memory source (``gpumem [3] torch: ...``; ``ledger.source_label``, Note [Whose row]);
    a row of another source than ours is named without it."""
    oom = f" · {row['ooms']} OOM" if row["ooms"] else ""
    delta = format_signed_bytes(row["allocated_delta"])
    label = label or row.get("memory_source")
    head = f"gpumem [{row['cell']}] {label}:" if label else f"gpumem [{row['cell']}]:"
    lines = [f"{head} Δallocated {delta} · "
             f"peak {peak_text(row)} · reserved {format_bytes(reserved)} "
             f"(Δ {format_signed_bytes(row['reserved_delta'])}){oom}"]
    if cause is not None and cause.new_bytes > 0:
        lines.append("  " + cause_line(cause))
    if cause is not None and (hint := forget_error_hint(cause)) is not None:
        lines.append("  " + hint)
    if cause is not None and cause.cache_hint:
        lines.append("  " + cause.cache_hint)
    return "\n".join(lines)
