"""Our caching allocator (CuPy's, once installed) as a ``MemorySource``: "cupy".

It reads the current allocator (``runtime.registry``) on every call, so it follows
``%gpumem device sim|cuda`` and device switches. What it knows better than the defaults of
``SourceBase``: the live blocks come from the allocator's own rows, without a snapshot; each
cell's peak is a watermark of its own (the user's peak counters stay); while a cell runs, the
allocator tags history events with its number; and the history can keep the stacks of live
blocks only ("state", PyTorch's ``enabled="state"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from jupyter_gpumem.data.owners import CUPY_ARRAY, CUPY_POINTER
from jupyter_gpumem.runtime import registry, torch_share
from jupyter_gpumem.sources.base import SourceBase, events_of
from jupyter_gpumem.sources.protocol import (
    CellEnd,
    CellMark,
    CellPeak,
    HistoryMode,
    LiveBlocks,
    Status,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.engine.history import HistoryView
    from jupyter_gpumem.engine.oom import OomReport

__all__ = ["CUPY_OWNERS", "CupySource", "HistorySetting", "history_words", "our_sources"]


#: CuPy's arrays and memory pointers (``data.owners``: the holder search knows them built in).
CUPY_OWNERS = (CUPY_ARRAY, CUPY_POINTER)


#: What our allocator's history records, to put it back: ``(stacks, max_entries)``, or None (off).
HistorySetting = tuple[bool, int] | None


def history_words(history: HistoryView | None) -> str:
    """What the allocator's history records, in words for the status line.

    ``record_history="state"`` (PyTorch's ``enabled="state"``) keeps the stacks of live blocks but
    no events: lines can be named for memory still held, but there is no timeline."""
    if history is None:
        return "history off"
    if history.max_entries == 0:
        return ("history: lines of live blocks only" if history.stacks
                else "history: live blocks only, no lines")
    return "history on" if history.stacks else "history on, no lines"


def _event_position(allocator: CachingAllocator) -> int:
    history = allocator.history
    if history is None or history.max_entries == 0:
        return -1
    return history.recorded


class CupySource(SourceBase):
    """Our allocator as a ``MemorySource`` (see the module docstring). ``allocator`` pins one
    allocator; by default it is the current one of ``runtime.registry``."""

    name = "cupy"
    shows = MappingProxyType({
        "stats": "yes", "blocks": "yes", "stacks": "yes", "history": "yes",
        "cell_peak": "yes, exact (a watermark per cell)", "oom": "yes", "holders": "yes",
        "replay": "yes"})
    owners = CUPY_OWNERS
    library_files = ("/cupy/", "/cupyx/", "/cupy_backends/", "\\cupy\\")

    def __init__(self, allocator: CachingAllocator | None = None) -> None:
        super().__init__()
        self._pinned = allocator

    @property
    def title(self) -> str:  # type: ignore[override]
        """Whose memory it is: CuPy's, or CuPy's and PyTorch's in one cache (Note [One cache,
        one source] in ``sources.registry``)."""
        if torch_share.shared():
            return "our allocator (CuPy and PyTorch, one cache)"
        return "our allocator (CuPy)"

    @property
    def allocator(self) -> CachingAllocator:
        """The allocator read; ``LookupError`` when there is none (no GPU, no simulated one)."""
        allocator = self._pinned if self._pinned is not None else registry.current_allocator()
        if allocator is None:
            raise LookupError("no allocator: no GPU here; %gpumem device sim uses a simulated one")
        return allocator

    def unavailable(self) -> str | None:
        if self._pinned is None and registry.current_allocator() is None:
            return "no GPU here; `%gpumem device sim` uses a simulated device"
        return None

    @property
    def device_index(self) -> int:
        return int(self.allocator.device.index)

    @property
    def device_name(self) -> str:
        return str(self.allocator.device.name)

    def memory_stats(self) -> dict[str, int]:
        return self.allocator.memory_stats()

    def memory_allocated(self) -> int:
        return self.allocator.memory_allocated()

    def memory_reserved(self) -> int:
        return self.allocator.memory_reserved()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.allocator.device.mem_get_info()
        return int(free), int(total)

    def snapshot(self) -> Snapshot:
        return self.allocator.snapshot(mark=False)  # a view's read: the user's trace stays

    def live_blocks(self) -> LiveBlocks:
        a = self.allocator
        history = a.history
        return LiveBlocks(a.live_block_rows(), history.table if history is not None else None,
                          owner=a)

    def memory_summary(self, abbreviated: bool = False) -> str:
        return self.allocator.memory_summary(abbreviated=abbreviated)

    def history_words(self) -> str:
        return history_words(self.allocator.history)

    def status(self) -> Status:
        return replace(super().status(), backend=registry.backend())

    def device_processes(self) -> list[tuple[int, str, int]] | None:
        """The other processes on the device, ``(pid, name, bytes)`` (the simulated device
        plays them); None where NVML cannot tell."""
        device = self.allocator.device
        listed = getattr(device, "nvml_processes", None)
        if listed is None:  # a simulated device lists the other processes itself
            own = getattr(device, "processes", None)
            return list(own()) if own is not None else None
        from jupyter_gpumem.devices import nvml

        try:
            rows = listed()
        except nvml.NvmlUnavailable:
            return None
        me = os.getpid()
        return [row for row in rows if row[0] != me]

    def allocator_config(self) -> str:
        """The allocator's settings in ``key:value,...`` form ("" for the defaults)."""
        return self.allocator.config.as_text()

    def status_notes(self) -> tuple[str, ...]:
        if torch_share.shared() and registry.backend() == "cuda":
            return ("one cache for CuPy and PyTorch",)
        return ()

    def releasable_bytes(self) -> int:
        """Bytes ``empty_cache`` would give back now: cached blocks that are whole segments."""
        st = self.memory_stats()
        return max(0, st.get("reserved_bytes.all.current", 0)
                   - st.get("allocated_bytes.all.current", 0)
                   - st.get("inactive_split_bytes.all.current", 0))

    # -- history -------------------------------------------------------------------------------

    def history_on(self) -> bool:
        h = self.allocator.history
        return h is not None and h.max_entries > 0

    def record_history(self, mode: HistoryMode, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        a = self.allocator
        if mode == "off":
            a.record_history(False)
        else:
            a.record_history(True, stacks=stacks, max_entries=max_entries if mode == "all" else 0)

    def history_mode(self) -> HistoryMode:
        h = self.allocator.history
        return "off" if h is None else "state" if h.max_entries == 0 else "all"

    def history_setting(self) -> HistorySetting:
        """The history as it is set now, to put back later (``restore_history``)."""
        h = self.allocator.history
        return None if h is None else (h.stacks, h.max_entries)

    def restore_history(self, setting: HistorySetting) -> None:
        """Set the history back to ``setting`` (``history_setting``); events recorded so far
        are kept."""
        if setting is None:
            self.allocator.record_history(False)
        else:
            self.allocator.record_history(True, stacks=setting[0], max_entries=setting[1])

    def trace_history(self, *, stacks: bool, max_entries: int) -> Callable[[], None]:
        """Every event with ``stacks``, up to ``max_entries``, for the block, whatever the history
        was; after it, exactly the history it was (off, "state", or on with its own stacks and
        length), the events recorded so far kept (``record_history`` keeps them)."""
        pinned = CupySource(self.allocator)  # the block's allocator, whatever happens meanwhile
        previous = pinned.history_setting()
        pinned.record_history("all", stacks=stacks, max_entries=max_entries)
        return lambda: pinned.restore_history(previous)

    def recorded_trace(self) -> Snapshot | str:
        """The allocator's history as it is, the user's own snapshot marks included (a view's
        read logs none here, so they are events of the trace, replayed as nothing)."""
        if not self.history_on():
            return ("gpumem: no event history is recorded (`%gpumem history on` records it, or "
                    "trace a cell with `%%gpumem_trace`).")
        snapshot = self.snapshot()
        if not len(events_of(snapshot, self.device_index)):
            return f"gpumem: {self.title} has recorded no events yet."
        return snapshot

    # -- cells ---------------------------------------------------------------------------------

    def start_cell(self, cell: int) -> CellMark:
        a = self.allocator
        mark = CellMark(cell, a.memory_stats(), self._clock_us(), _event_position(a),
                        (a, a.start_watermark(f"cell {cell}"), a.current_cell))
        if cell >= 0:  # history events carry the cell while it runs; a block of no cell of its
            a.current_cell = cell  # own (``trace()`` in a cell) leaves the tag as it is
        return mark

    def end_cell(self, mark: CellMark, snapshot: Snapshot | None = None) -> CellEnd:
        a, watermark, previous = mark.token
        a.stop_watermark(watermark)
        a.current_cell = previous
        start, end = mark.start_event, _event_position(a)
        if start < 0 or end < 0 or end < start:
            start = end = -1
        return CellEnd(CellPeak(watermark.peak_allocated, True, "watermark"), (start, end))

    # -- out of memory -------------------------------------------------------------------------

    def is_oom(self, exc: BaseException) -> bool:
        from jupyter_gpumem.engine.oom import OutOfMemoryError

        return isinstance(exc, OutOfMemoryError) or torch_share.is_our_oom(exc) or any(
            c.__name__ == "OutOfMemoryError" and c.__module__.startswith("cupy")
            for c in type(exc).__mro__)

    def oom_report(self, exc: BaseException) -> OomReport | None:
        """The error's own report; for PyTorch's error raised with our message (one cache), the
        report the core kept of that failure."""
        from jupyter_gpumem.engine.oom import OomReport

        report = getattr(exc, "report", None)
        if isinstance(report, OomReport):
            return report
        return torch_share.report_for(exc) if torch_share.is_our_oom(exc) else None

    def replay_setting(self) -> str | None:
        return "`%gpumem config ...` or `JUPYTER_GPUMEM_ALLOC_CONF`"



def our_sources() -> list[CupySource]:
    """Our allocators, each as a source pinned to it: every device made so far on the current
    backend, the current one first (they follow the notebook's history settings)."""
    current = registry.current_allocator()
    found = [current] if current is not None else []
    unique = {id(a): a for a in (*found, *registry.allocators().values())}
    return [CupySource(a) for a in unique.values()]
