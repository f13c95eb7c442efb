"""``SourceBase``: the parts of a ``MemorySource`` that follow from its counters and snapshot.

A source written on it gives ``name``, ``title``, ``device_index``, ``device_name``,
``memory_stats``, ``mem_get_info`` and ``snapshot`` (and ``oom_errors`` for the explainer);
the rest has a default here that reads those: the allocated and reserved bytes, the live blocks
(from the snapshot's blocks and their frames), the summary table, the status line's numbers, the
recorded trace (the snapshot's events), and each cell's peak (Note [Cell peak from counters]).
A source that knows better overrides any of it (our allocator reads its own watermark).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from jupyter_gpumem.render.summary import format_summary
from jupyter_gpumem.sources.protocol import (
    NO_STACK,
    CellEnd,
    CellMark,
    CellPeak,
    HistoryMode,
    LiveBlocks,
    MemorySource,
    Owner,
    Status,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.columns import TraceColumns
    from jupyter_gpumem.data.schema import Frame, Snapshot, TraceEntry
    from jupyter_gpumem.engine.oom import OomReport
    from jupyter_gpumem.render.view_payload import Bands

__all__ = ["SnapshotStacks", "SourceBase", "events_of", "history_peak", "record_for_block",
           "wall_us"]


def wall_us() -> int:
    """The wall clock in µs, as trace events' ``time_us``."""
    return time.time_ns() // 1000


class SnapshotStacks:
    """The stacks of a snapshot's blocks, by the stack ids ``SourceBase.live_blocks`` gave."""

    def __init__(self) -> None:
        self._frames: list[list[Frame]] = []

    def add(self, frames: list[Frame]) -> int:
        if not frames:
            return NO_STACK
        self._frames.append(frames)
        return len(self._frames) - 1

    def frames(self, stack_id: int) -> list[Frame]:
        return self._frames[stack_id] if 0 <= stack_id < len(self._frames) else []


def events_of(snapshot: Snapshot, device: int) -> TraceColumns:
    """The trace events of ``device`` in ``snapshot``, without "snapshot" marks."""
    from jupyter_gpumem.data.columns import without_snapshots

    traces = snapshot["device_traces"]
    return without_snapshots(traces[device] if device < len(traces) else [])


def history_peak(snapshot: Snapshot, device: int, start_us: int, start_allocated: int
                 ) -> int | None:
    """The highest allocated bytes over the events of ``snapshot``'s trace from ``start_us`` on,
    when those events account for the whole time since (the allocated bytes they work back to
    at their start equal ``start_allocated``); None otherwise."""
    from jupyter_gpumem.data.timeline import build_timeline

    traces = snapshot["device_traces"]
    if device >= len(traces):
        return None
    events = [e for e in traces[device] if e["time_us"] >= start_us and e["action"] != "snapshot"]
    window: Snapshot = {"segments": snapshot["segments"],
                        "device_traces": [events if i == device else []
                                          for i in range(len(traces))]}
    tl = build_timeline(window, device)
    if tl.start_allocated != start_allocated:
        return None  # events before the cell's start are missing: not the whole cell
    return max(start_allocated, int(tl.allocated.max()) if len(tl) else start_allocated)


def record_for_block(source: MemorySource, *, stacks: bool, max_entries: int
                     ) -> Callable[[], None] | None:
    """``trace_history`` of any source: a history that records every event is left as it is
    (None); else it records every event for the block and is switched off again after."""
    if source.history_on():
        return None
    source.record_history("all", stacks=stacks, max_entries=max_entries)
    return lambda: source.record_history("off")


class SourceBase:
    """Defaults for a ``MemorySource`` (see the module docstring); not a source by itself."""

    name = "source"
    title = "a memory source"
    shows: Mapping[str, str] = {}
    owners: Sequence[Owner] = ()
    library_files: Sequence[str] = ()
    #: the out-of-memory exception classes of the library (``is_oom`` matches them)
    oom_errors: tuple[type[BaseException], ...] = ()
    #: what a trace's timeline is banded by unless the user says (``trace(bands=)``): the
    #: allocating "site", or the "holder" (parameters, gradients, optimizer state...)
    trace_bands: Bands = "site"

    def __init__(self, *, clock_us: Callable[[], int] = wall_us) -> None:
        self._clock_us = clock_us

    # -- what a source must give ---------------------------------------------------------------

    @property
    def device_index(self) -> int:
        raise NotImplementedError

    @property
    def device_name(self) -> str:
        return f"device {self.device_index}"

    def memory_stats(self) -> dict[str, int]:
        raise NotImplementedError

    def mem_get_info(self) -> tuple[int, int]:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    # -- what follows from it ------------------------------------------------------------------

    def unavailable(self) -> str | None:
        return None

    def memory_allocated(self) -> int:
        return self.memory_stats().get("allocated_bytes.all.current", 0)

    def memory_reserved(self) -> int:
        return self.memory_stats().get("reserved_bytes.all.current", 0)

    def live_blocks(self) -> LiveBlocks:
        return self.blocks_of(self.snapshot())

    def blocks_of(self, snapshot: Snapshot) -> LiveBlocks:
        """The allocated blocks of ``snapshot`` on this source's device, with their stacks."""
        device = self.device_index
        stacks = SnapshotStacks()
        rows = [(b["address"], b["size"], b["requested_size"] or b["size"], stacks.add(b["frames"]))
                for seg in snapshot["segments"] if seg.get("device", device) == device
                for b in seg["blocks"] if b["state"] == "active_allocated"]
        return LiveBlocks(rows, stacks, owner=(self.name, device))

    def memory_summary(self, abbreviated: bool = False) -> str:
        # keys the source cannot fill read as 0 (``memory_stats``)
        return format_summary(defaultdict(int, self.memory_stats()), self.device_index,
                              abbreviated=abbreviated)

    def history_words(self) -> str:
        return "history on" if self.history_on() else "history off"

    def status(self) -> Status:
        st = self.memory_stats()
        try:
            free: int | None
            total: int | None
            free, total = self.mem_get_info()
        except Exception:  # a library that cannot say
            free = total = None
        return Status(self.name, self.device_index, self.device_name,
                      st.get("allocated_bytes.all.current", 0),
                      st.get("allocated_bytes.all.peak", 0),
                      st.get("reserved_bytes.all.current", 0), free, total, self.history_words(),
                      self.status_notes())

    def status_notes(self) -> tuple[str, ...]:
        return ()

    def history_on(self) -> bool:
        return False

    def history_mode(self) -> HistoryMode:
        """What the history records now: every event ("all"), the stacks of live blocks only
        ("state"), or nothing ("off")."""
        return "all" if self.history_on() else "off"

    def record_history(self, mode: HistoryMode, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        if mode == "all":
            raise ValueError(f"{self.title} records no event history")

    def trace_history(self, *, stacks: bool, max_entries: int) -> Callable[[], None] | None:
        """Record every event for a traced block (``trace``) and return what puts the history
        back as it was after it; None when the history is left as it was (it records every
        event already). ValueError when the source records no event history."""
        return record_for_block(self, stacks=stacks, max_entries=max_entries)

    def recorded_trace(self) -> Snapshot | str:
        if not self.history_on():
            return f"gpumem: {self.title} records no event history."
        snapshot = self.snapshot()
        device = self.device_index
        events = events_of(snapshot, device)
        if not len(events):
            return f"gpumem: {self.title} has recorded no events yet."
        cut: list[Sequence[TraceEntry]] = list(snapshot["device_traces"])
        cut += [[] for _ in range(device + 1 - len(cut))]
        cut[device] = events
        return {**snapshot, "device_traces": cut}

    # -- a cell's peak: Note [Cell peak from counters] -----------------------------------------

    def start_cell(self, cell: int) -> CellMark:
        return CellMark(cell, self.memory_stats(), self._clock_us())

    def end_cell(self, mark: CellMark, snapshot: Snapshot | None = None) -> CellEnd:
        return CellEnd(self.cell_peak(mark, snapshot))

    def cell_peak(self, mark: CellMark, snapshot: Snapshot | None = None) -> CellPeak:
        st = self.memory_stats()
        c1 = st.get("allocated_bytes.all.current", 0)
        p1 = st.get("allocated_bytes.all.peak", 0)
        if p1 > mark.peak:
            return CellPeak(p1, True, "counter")
        low = max(mark.allocated, c1)
        if low >= mark.peak:
            return CellPeak(low, True, "counter")
        if snapshot is None and self.history_on():
            snapshot = self.snapshot()
        if snapshot is not None:
            found = history_peak(snapshot, self.device_index, mark.start_us, mark.allocated)
            if found is not None:
                return CellPeak(found, True, "history")
        return CellPeak(mark.peak, False, "bound")

    # -- out of memory -------------------------------------------------------------------------

    def is_oom(self, exc: BaseException) -> bool:
        return bool(self.oom_errors) and isinstance(exc, self.oom_errors)

    def oom_report(self, exc: BaseException) -> OomReport | None:
        return None

    def oom_steps(self, report: OomReport | None) -> list[str]:
        return []

    def replay_setting(self) -> str | None:
        return None


# Note [Cell peak from counters]: the footer and the ledger show each cell's peak allocated bytes
# without calling ``reset_peak_memory_stats`` (the user's own peak stays theirs). At the cell's
# start the source reads c0 (``allocated_bytes.all.current``) and p0 (``.peak``); at its end c1
# and p1. If p1 > p0, the peak was passed while the cell ran, so the cell's peak is p1 exactly.
# Otherwise it is at most p0 and at least max(c0, c1): exact when those are equal. Else, when
# the source records history, the events since the cell's start (by ``time_us``) give it exactly,
# provided they reach back to the start (they work back to c0); else the footer and the ledger
# show the bound, "≤ p0", and ``CellRecord["peak_exact"]`` is false. A reset of the peak inside
# the cell keeps the rule true: p1 > p0 is still a high reached in the cell. Our allocator needs
# none of this: it keeps a watermark per cell (``sources.cupy``).
