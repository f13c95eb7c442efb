"""``jupyter_gpumem.trace()``: record one block of code, then explain what it did to memory.

``%%gpumem_trace`` is a thin shell over this context manager::

    with jupyter_gpumem.trace() as t:
        x = cupy.ones((1 << 28,), cupy.float32)
    t                      # timeline, layouts at the peak and at the end, sites, survivors

It switches history on for the block, then cuts a snapshot whose trace holds only the block's
events and hands it to ``analyze``; the result is a ``TraceResult`` (``trace_result``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES
from jupyter_gpumem.notebook.live_view import live_session
from jupyter_gpumem.render.trace_result import TraceResult, analyze
from jupyter_gpumem.render.view_payload import BANDS, Bands
from jupyter_gpumem.sources.cupy import CupySource

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot, TraceEntry
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.sources.torch import TorchSource

__all__ = ["TorchTrace", "TraceResult", "trace"]


# -- the context manager ---------------------------------------------------------------------------

def _check(max_entries: int, bands: str) -> None:
    if (isinstance(max_entries, bool) or not isinstance(max_entries, int)
            or not 1 <= max_entries <= MAX_HISTORY_ENTRIES):
        raise ValueError(f"max_entries must be an int in [1, {MAX_HISTORY_ENTRIES}], got "
                         f"{max_entries!r}")
    if bands not in BANDS:
        raise ValueError(f"bands must be one of {BANDS}, got {bands!r}")


class _Options:
    """What both tracers take: the recording, where the holders live, and what to show."""

    def __init__(self, *, stacks: bool, max_entries: int,
                 namespace: Mapping[str, Any] | None, save: str | None, plot: bool,
                 live: bool, cell: int | None, cell_files: Mapping[str, int] | None,
                 bands: Bands) -> None:
        _check(max_entries, bands)
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
        self._session: Any | None = None  # the live view, while the block runs
        # the frame that made the tracer (this one's caller's caller): its variables hold blocks
        self._frame: FrameType | None = sys._getframe(2) if namespace is None else None

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


class trace(_Options):  # used like a function: ``with trace() as t``
    """Record the allocations of a ``with`` block; the ``as`` target is filled in at its end.

    History is switched on (with ``stacks``) for the block and put back as it was afterwards;
    where that keeps no events, the block's are kept for the session's timeline
    (``session_trace``).
    ``namespace`` is where to look for the variables holding surviving blocks (default: the
    caller's globals and locals). ``bands``: the timeline's bands by allocating ``"site"`` or by
    ``"holder"`` (parameters, gradients, optimizer state, other variables, none, freed).
    ``live`` shows the live widget while the block runs, where it is available. An exception
    in the block still fills the result, then propagates.
    """

    def __init__(self, *, stacks: bool = True, max_entries: int = 1_000_000, device: Any = None,
                 namespace: Mapping[str, Any] | None = None, save: str | None = None,
                 plot: bool = True, live: bool = False, cell: int | None = None,
                 cell_files: Mapping[str, int] | None = None, bands: Bands = "site") -> None:
        super().__init__(stacks=stacks, max_entries=max_entries, namespace=namespace, save=save,
                         plot=plot, live=live, cell=cell, cell_files=cell_files, bands=bands)
        self.device = device
        self._placeholder = TraceResult.empty()

    def __enter__(self) -> TraceResult:
        from jupyter_gpumem.runtime import registry

        self._allocator: CachingAllocator = registry.get_allocator(self.device)
        a = self._allocator
        h = a.history
        self._previous = None if h is None else (h.stacks, h.max_entries)
        a.record_history(True, stacks=self.stacks, max_entries=self.max_entries)
        history = a.history
        assert history is not None
        self._start = history.recorded
        self._watermark = a.start_watermark("trace")
        self._session = live_session(CupySource(a)) if self.live else None
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
        a = self._allocator
        a.stop_watermark(self._watermark)
        history = a.history
        assert history is not None
        dropped = history.dropped
        snap = a.snapshot(mark=False)  # the block's own read: no event in the user's history
        if self._previous is None:
            a.record_history(False)
        else:
            stacks, entries = self._previous
            a.record_history(True, stacks=stacks, max_entries=entries)
        # History back as it was keeps no events: the session keeps this block's (%gpumem plot).
        keep_events = self._previous is None or self._previous[1] == 0
        index = a.device.index
        full = snap["device_traces"][index]
        first = max(0, self._start - dropped)
        window = [e for e in full[first:] if e["action"] != "snapshot"]
        traces: list[list[TraceEntry]] = [[] for _ in range(index + 1)]
        traces[index] = window
        info = dict(snap.get("jupyter_gpumem", {}))
        info["history_dropped"] = max(0, dropped - self._start)
        from jupyter_gpumem.notebook.session_trace import keep, window_marks

        info["empty_cache"] = window_marks(full, first, info.get("empty_cache") or [])
        trace_snapshot: Snapshot = {"segments": snap["segments"], "device_traces": traces,
                                    "schema": snap.get("schema", 1), "jupyter_gpumem": info}
        result = analyze(trace_snapshot, device=index, namespace=self._namespace(),
                         cell_files=self.cell_files, wall_s=wall, error=exc, cell=self.cell,
                         bands=self.bands)
        # The watermark sees every allocation, even ones pushed out of a full history ring.
        result.peak_allocated = max(result.peak_allocated, self._watermark.peak_allocated)
        result.picture = self.plot
        result.history_on = True
        if keep_events:
            keep(a, trace_snapshot, self.cell, result.timeline)
        # ``with trace() as t`` bound the placeholder: fill it in place.
        self._placeholder.__dict__.update(vars(result))
        self.result = self._placeholder
        if self.save:
            result.save(self.save)


class TorchTrace(_Options):
    """``trace()`` for PyTorch's allocator: ``with TorchTrace(source) as t: ...``.

    PyTorch's history (``_record_memory_history(enabled="all", context="all",
    stacks="python", max_entries=N)``) is switched on for the block unless it is on already, and
    switched off again after; a history the user had on stays on, as the user set it, and the
    block's events are cut from it by time (``time_us`` from the block's start). The snapshot
    (``_snapshot()``) is analysed like ours: timeline, layouts, top sites, survivors, with the
    holders of the namespace (tensors, module parameters and gradients, optimizer state); the
    timeline's bands are by holder unless ``bands="site"``."""

    def __init__(self, source: TorchSource, *, stacks: bool = True, max_entries: int = 1_000_000,
                 namespace: Mapping[str, Any] | None = None, save: str | None = None,
                 plot: bool = True, live: bool = False, cell: int | None = None,
                 cell_files: Mapping[str, int] | None = None, bands: Bands = "holder") -> None:
        super().__init__(stacks=stacks, max_entries=max_entries, namespace=namespace, save=save,
                         plot=plot, live=live, cell=cell, cell_files=cell_files, bands=bands)
        self.source = source

    def __enter__(self) -> TorchTrace:
        src = self.source
        self._was_on = src.history_on()
        if not self._was_on:
            src.record_history("all", stacks=self.stacks, max_entries=self.max_entries)
        self._mark = src.start_cell(self.cell if self.cell is not None else -1)
        self._session = live_session(src) if self.live else None
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._finish(exc)
        finally:
            self._stop_live()

    def _finish(self, exc: BaseException | None) -> None:
        wall = time.perf_counter() - self._t0
        src = self.source
        try:
            snap = src.snapshot()
        finally:
            if not self._was_on:
                src.record_history("off")
        index = src.device_index
        traces = snap["device_traces"]
        full = traces[index] if index < len(traces) else []
        # Ours alone from a cleared history; the user's history holds earlier events too.
        start = self._mark.start_us if self._was_on else None
        window = [e for e in full if e["action"] != "snapshot"
                  and (start is None or e["time_us"] >= start)]
        cut: list[list[TraceEntry]] = [[] for _ in range(max(index + 1, len(traces)))]
        cut[index] = window
        trace_snapshot: Snapshot = {**snap, "device_traces": cut}  # with its device and config
        src.last_trace = trace_snapshot
        result = analyze(trace_snapshot, device=index, namespace=self._namespace(),
                         cell_files=self.cell_files, wall_s=wall, error=exc, cell=self.cell,
                         bands=self.bands)
        peak = src.cell_peak(self._mark, snapshot=trace_snapshot)
        if peak.exact:
            result.peak_allocated = max(result.peak_allocated, peak.bytes)
        result.title = f"{result.title} · torch" if result.title else "torch"
        result.picture = self.plot
        result.history_on = True
        self.result = result
        if self.save:
            result.save(self.save)
