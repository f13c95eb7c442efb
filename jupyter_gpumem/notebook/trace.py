"""``jupyter_gpumem.trace()``: record one block of code on a memory source, then explain what it
did to memory.

``%%gpumem_trace`` is a thin shell over this context manager (one a source it reads)::

    with jupyter_gpumem.trace() as t:            # our allocator; source="torch": PyTorch's
        x = cupy.ones((1 << 28,), cupy.float32)
    t                      # timeline, layouts at the peak and at the end, sites, survivors

Note [One trace over a source]: the block is recorded on any ``MemorySource`` the same way.

- History: the source records every event for the block (``trace_history``): our allocator
  whatever its history was, and exactly as it was after (off, "state", or on with its own
  stacks and length, its events kept); PyTorch only when its history was off, and off again
  after (a history the user had on is left alone).
- The block's events: the positions the source gives (``CellEnd.events``, our allocator: its
  history's event count, dropped ones included, so a ring that overflowed is cut right); else
  every event when the history was switched on for the block (PyTorch's starts cleared); else
  those from the block's start by ``time_us`` (a history the user had on holds earlier ones).
- The peak: the source's cell peak where exact (our allocator's watermark sees allocations
  pushed out of a full ring; PyTorch's counters, else its history).
- A source that records no event history (JAX) gives its end state: the layout and the
  holders at the end, its counters' peak, and the title says "no event history".

The result is a ``TraceResult`` (``render.trace_result.analyze``), titled ``cell [N] · NAME``
for every source but ours. A block whose history the source does not keep afterwards hands its
events to the session's timeline (``session_trace.keep``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.columns import as_columns, without_snapshots
from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES
from jupyter_gpumem.render.trace_result import TraceResult, analyze
from jupyter_gpumem.render.view_payload import BANDS, Bands

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot, TraceEntry
    from jupyter_gpumem.sources.protocol import CellEnd, CellMark, MemorySource

__all__ = ["TraceResult", "default_bands", "trace"]

#: The source a trace reads unless told: our allocator.
OURS = "cupy"


def _check(max_entries: int, bands: str | None) -> None:
    if (isinstance(max_entries, bool) or not isinstance(max_entries, int)
            or not 1 <= max_entries <= MAX_HISTORY_ENTRIES):
        raise ValueError(f"max_entries must be an int in [1, {MAX_HISTORY_ENTRIES}], got "
                         f"{max_entries!r}")
    if bands is not None and bands not in BANDS:
        raise ValueError(f"bands must be one of {BANDS}, got {bands!r}")


def default_bands(source: MemorySource) -> Bands:
    """What a trace of ``source`` bands its timeline by unless told: the source's
    ``trace_bands`` ("holder" for PyTorch), else by allocating "site"."""
    bands = getattr(source, "trace_bands", "site")
    return "holder" if bands == "holder" else "site"


def _trace_history(source: MemorySource, stacks: bool, max_entries: int
                   ) -> Callable[[], None] | None:
    """The source's ``trace_history`` (``SourceBase`` has it), or the rule every source follows
    for a source written without it."""
    from jupyter_gpumem.sources.base import record_for_block

    own = getattr(source, "trace_history", None)
    if callable(own):
        put_back: Callable[[], None] | None = own(stacks=stacks, max_entries=max_entries)
        return put_back
    return record_for_block(source, stacks=stacks, max_entries=max_entries)


class trace:  # used like a function: ``with trace() as t``
    """Record the allocations of a ``with`` block on a memory source; the ``as`` target is
    filled in at its end (Note [One trace over a source]).

    ``source`` is a source's name or a ``MemorySource`` (default: our allocator, on ``device``);
    history is switched on (with ``stacks``, keeping at most ``max_entries`` events) for the
    block and put back as it was afterwards; where that keeps no events, the block's are kept
    for the session's timeline (``session_trace``). ``namespace`` is where to look for the
    variables holding surviving blocks (default: the caller's globals and locals). ``bands``:
    the timeline's bands by allocating ``"site"`` or by ``"holder"`` (parameters, gradients,
    optimizer state, other variables, none, freed); by default the source's (``default_bands``).
    ``live`` shows the live widget while the block runs, where it is available. An exception in
    the block still fills the result, then propagates.
    """

    def __init__(self, *, stacks: bool = True, max_entries: int = 1_000_000, device: Any = None,
                 namespace: Mapping[str, Any] | None = None, save: str | None = None,
                 plot: bool = True, live: bool = False, cell: int | None = None,
                 cell_files: Mapping[str, int] | None = None, bands: Bands | None = None,
                 source: str | MemorySource | None = None) -> None:
        _check(max_entries, bands)
        self.source = _named(source, device)
        self.device = device
        self.stacks = stacks
        self.max_entries = max_entries
        self.namespace = namespace
        self.save = save
        self.plot = plot
        self.live = live
        self.cell = cell
        self.cell_files = cell_files
        self.bands = bands
        self.result: TraceResult | None = None
        self._placeholder = TraceResult.empty()
        self._session: Any | None = None  # the live view, while the block runs
        # the frame that made the tracer (its caller's): its variables hold blocks
        self._frame: FrameType | None = sys._getframe(1) if namespace is None else None

    def __enter__(self) -> TraceResult:
        src = self.source if self.source is not None else _ours(self.device)
        self._source = src
        try:
            self._put_back = _trace_history(src, self.stacks, self.max_entries)
        except ValueError:  # a source that records no event history (JAX): its end state
            self._put_back = None
        self._recorded = src.history_on()
        self._mark: CellMark = src.start_cell(self.cell if self.cell is not None else -1)
        self._session = _live(src) if self.live else None
        self._t0 = time.perf_counter()
        return self._placeholder

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._finish(exc)
        finally:
            self._stop_live()

    def _finish(self, exc: BaseException | None) -> None:
        wall = time.perf_counter() - self._t0
        src = self._source
        snap: Snapshot | None = None
        try:
            snap = src.snapshot()  # a view's read: where it can, nothing in the user's history
        finally:
            try:
                end = src.end_cell(self._mark, snap)
            finally:
                if self._put_back is not None:
                    self._put_back()
        traced = self._cut(snap, end)
        index = src.device_index
        result = analyze(traced, device=index, namespace=self._namespace(),
                         cell_files=self.cell_files, wall_s=wall, error=exc, cell=self.cell,
                         bands=self.bands or default_bands(src))
        if end.peak.exact:  # ours: a watermark, which sees allocations a full ring dropped
            result.peak_allocated = max(result.peak_allocated, end.peak.bytes)
        if src.name != OURS or not self._recorded:
            name = src.name if self._recorded else f"{src.name}, no event history"
            result.title = f"{result.title} · {name}" if result.title else name
        result.picture = self.plot
        result.history_on = self._recorded
        if self._recorded and _keeps_no_events(src):
            from jupyter_gpumem.notebook.session_trace import keep

            keep(src, traced, self.cell, result.timeline)  # the session's timeline has them
        # ``with trace() as t`` bound the placeholder: fill it in place.
        self._placeholder.__dict__.update(vars(result))
        self.result = self._placeholder
        if self.save:
            self.result.save(self.save)  # its views name the file (``full_trace``)

    def _cut(self, snap: Snapshot, end: CellEnd) -> Snapshot:
        """``snap`` with only the block's events in its trace (Note [One trace over a
        source])."""
        from jupyter_gpumem.notebook.session_trace import window_marks

        index = self._source.device_index
        traces = snap["device_traces"]
        full = as_columns(traces[index] if index < len(traces) else [])
        info: dict[str, Any] = dict(snap.get("jupyter_gpumem") or {})
        start, stop = end.events
        if not self._recorded:
            window = full[:0]
        elif start >= 0:  # positions in the history, dropped events included
            dropped = int(info.get("history_dropped") or 0)
            first = max(0, start - dropped)
            full = full[:max(first, stop - dropped)]
            window = full[first:]
            info["history_dropped"] = max(0, dropped - start)
            info["empty_cache"] = window_marks(full, first, info.get("empty_cache") or [])
        elif self._put_back is not None:  # recorded for the block alone
            window = full
        else:  # the user's history: the events from the block's start on
            window = full.take(full.column("time_us") >= self._mark.start_us)
        cut: list[Sequence[TraceEntry]] = [[] for _ in range(max(index + 1, len(traces)))]
        cut[index] = without_snapshots(window)
        if "jupyter_gpumem" in snap or start >= 0:
            return {**snap, "device_traces": cut, "jupyter_gpumem": info}
        return {**snap, "device_traces": cut}

    def _stop_live(self) -> None:
        """Stop the live view, whatever happened to the result: its output becomes the static
        curve (or a line) and its widget is closed (Note [A finished view lets go] in
        ``widget``). The live view is a nicety: never fail the user's code for it."""
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.stop(traced=True)  # the result below the cell shows the trace

    def _namespace(self) -> Mapping[str, Any]:
        if self.namespace is not None:
            return self.namespace
        frame, self._frame = self._frame, None
        if frame is None:
            return {}
        return {**frame.f_globals, **frame.f_locals}


def _named(source: str | MemorySource | None, device: Any) -> MemorySource | None:
    """The source ``trace(source=)`` names (None: ours, found on entering); ValueError for an
    unknown name (``SourceError``), TypeError for what is not a source."""
    from jupyter_gpumem.sources.protocol import missing_members
    from jupyter_gpumem.sources.registry import get_source

    if source is None:
        return None
    if isinstance(source, str):
        made = get_source(source)
    elif missing_members(source):
        raise TypeError(f"source must be a source's name or a MemorySource, got "
                        f"{type(source).__name__}")
    else:
        made = source
    if device is not None and made.name != OURS:
        raise ValueError(f"device= picks our allocator's device; the source {made.name!r} "
                         "reads its own")
    return made


def _ours(device: Any) -> MemorySource:
    """Our allocator of ``device`` (the current one by default) as a source."""
    from jupyter_gpumem.runtime import registry
    from jupyter_gpumem.sources.cupy import CupySource

    return CupySource(registry.get_allocator(device))


def _keeps_no_events(source: MemorySource) -> bool:
    """Whether the source's history, as it is back after the block, keeps no events."""
    from jupyter_gpumem.notebook.session_trace import history_mode

    return history_mode(source) != "all"


def _live(source: MemorySource) -> Any | None:
    from jupyter_gpumem.notebook.live_view import live_session

    return live_session(source)
