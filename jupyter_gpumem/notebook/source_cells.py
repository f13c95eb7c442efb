"""The per-cell ledger rows of PyTorch's allocator (the "torch" source), beside our allocator's.

``SourceCells`` does for a ``TorchSource`` what ``Ledger.start_cell``/``end_cell`` do for our
allocator, from what PyTorch tells: at the cell's start it reads ``memory_stats()`` (c0, the
peak p0, the counters); at its end the stats again and a ``_snapshot()`` (segments and blocks:
the live blocks with their stacks when PyTorch records them). The row (a ``CellRecord`` with
``source: "torch"``) goes into the same ledger, so ``%gpumem cells`` lists one row per source
per cell, and the end state (``LiveBlock``\\ s) into ``ledger.source_states["torch"]`` for
``%gpumem diff``. The cell's peak follows Note [Cell peak under PyTorch] (``runtime.sources``):
``peak_exact`` is false when only a bound is known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.notebook.advice import CellCause, cache_hint
from jupyter_gpumem.notebook.ledger import Ledger, LiveBlock, name_cause, source_line, where_of
from jupyter_gpumem.sources.torch import selected_torch

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord, Snapshot
    from jupyter_gpumem.sources.protocol import CellMark
    from jupyter_gpumem.sources.torch import TorchSource

__all__ = ["SourceCells", "live_blocks_of"]


@dataclass
class _Open:
    cell: int
    source: str
    src: TorchSource
    mark: CellMark
    stats: dict[str, int]
    reserved: int
    start_s: float


def _delta(after: int, before: int) -> int:
    return after - before if after >= before else after  # counters reset inside the cell


def live_blocks_of(snapshot: Snapshot, device: int, cell_files: dict[str, int]
                   ) -> list[tuple[int, int, int, str | None, tuple[int, int] | None]]:
    """``(address, size, requested, site, origin)`` of every allocated block of ``device``."""
    out = []
    for seg in snapshot["segments"]:
        if seg.get("device", device) != device:
            continue
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                site, origin = where_of(b["frames"], cell_files) if b["frames"] else (None, None)
                out.append((b["address"], b["size"], b["requested_size"] or b["size"], site,
                            origin))
    return out


class SourceCells:
    """Ledger rows of the torch source, one per cell (see the module docstring)."""

    def __init__(self, ledger: Ledger,
                 source_for: Callable[[], TorchSource | None] = selected_torch,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.ledger = ledger
        self._source_for = source_for
        self._clock = clock
        self._open: _Open | None = None
        self._last: dict[int, LiveBlock] = {}
        self._last_of: Any = None

    def start_cell(self, cell: int, source: str = "") -> None:
        self._open = None
        src = self._source_for()
        if src is None:
            return
        try:
            stats = src.memory_stats()
            if self._last_of is not src:
                self._last = self._state(src, None)
                self._last_of = src
            self._open = _Open(cell, source, src, src.start_cell(cell), stats,
                               stats.get("reserved_bytes.all.current", 0), self._clock())
        except Exception:  # PyTorch without CUDA: nothing to record
            self._open = None

    def end_cell(self) -> CellRecord | None:
        open_, self._open = self._open, None
        if open_ is None:
            return None
        src = open_.src
        wall = self._clock() - open_.start_s
        st = src.memory_stats()
        snap: Snapshot | None = None
        history = src.history_on()
        if history:
            snap = src.snapshot()
        peak = src.cell_peak(open_.mark, snapshot=snap)
        state = self._state(src, open_.cell, snap)
        cause, line = self._cause(open_.cell, state, st)
        s0 = open_.stats

        def counter(key: str) -> int:
            return _delta(st.get(key, 0), s0.get(key, 0))

        row: CellRecord = {
            "cell": open_.cell,
            "source": source_line(open_.source, line),
            "allocated_delta": (st.get("allocated_bytes.all.current", 0)
                                - s0.get("allocated_bytes.all.current", 0)),
            "reserved_delta": st.get("reserved_bytes.all.current", 0) - open_.reserved,
            "peak_allocated": peak.bytes,
            "allocs": counter("allocation.all.allocated"),
            "frees": counter("allocation.all.freed"),
            "segments_new": counter("segment.all.allocated"),
            "ooms": counter("num_ooms"),
            "wall_s": wall,
            "start_event": -1,
            "end_event": -1,
            "memory_source": "torch",
            "peak_exact": peak.exact,
        }
        self.ledger.add_row(row, cause, state, memory_source="torch")
        return row

    def _state(self, src: TorchSource, cell: int | None, snap: Snapshot | None = None
               ) -> dict[int, LiveBlock]:
        snap = snap if snap is not None else src.snapshot()
        out: dict[int, LiveBlock] = {}
        for addr, size, req, site, origin in live_blocks_of(snap, src.device_index,
                                                            self.ledger.cell_files):
            seen = self._last.get(addr)
            if seen is not None and seen.size == size and seen.requested == req:
                out[addr] = seen
            else:
                out[addr] = LiveBlock(addr, size, req, site, cell, origin)
        if cell is not None:
            self._last = out
        return out

    def _cause(self, cell: int, state: dict[int, LiveBlock], st: dict[str, int]
               ) -> tuple[CellCause, int | None]:
        reserved = st.get("reserved_bytes.all.current", 0)
        releasable = max(0, reserved - st.get("allocated_bytes.all.current", 0)
                         - st.get("inactive_split_bytes.all.current", 0))
        hint = cache_hint(releasable, reserved)
        return name_cause(cell, state, self.ledger.namespace, self.ledger.cell_files, hint)
