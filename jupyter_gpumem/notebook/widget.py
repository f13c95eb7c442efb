"""The live widget: a memory curve that grows while a cell runs, then (optionally) the trace.

``LiveSession(sample_fn)`` shows a ``MemoryWidget`` and starts a sampler thread that calls
``sample_fn() -> (allocated, reserved, device_used | None)`` every ``interval_s`` and sends only
the new samples as a small custom message with one binary buffer. ``stop()`` joins the thread,
freezes the series in the ``samples`` trait and, with a snapshot, puts its view payload
(``view_payload``, bytes columns) in ``view``. The browser draws both with the views built from
``labextension/src`` (``static/dist/widget.js``; no library, no network).

What a saved notebook keeps: the widget's bundle carries its static fallback beside the widget
view (a ``text/plain`` line saying what it shows, ``text/html`` with one ``<img alt>`` picture,
the same picture as ``image/png``, and the view payload under ``MIME_TYPE``), and a stopped
session replaces its output by that fallback alone, so the notebook shows the view with no
kernel. Saved widget state, if the user turns it on, is bounded too: ``samples`` holds at most
``max_points`` rows, ``view`` the bounded payload (``max_points``, ``max_lives``).

The widget reads only ``sample_fn``'s numbers and snapshot dicts; it never touches an allocator.

Messages, kernel → browser (custom, through ``widget.send``):
``{"type": "samples", "first": k, "n": m}`` + one buffer of m rows ``SAMPLE_FIELDS`` (float64):
samples ``k .. k+m-1``. A view that already has them ignores them.
Browser → kernel: ``{"type": "ready", "have": n}`` when a view starts (the kernel answers with
samples ``n ..``, so a view that opens late catches up once).

A widget that shows a trace keeps its ``TraceDetail`` (``detail`` is True) and answers the
view's questions (``answers``, Note [A view asks the kernel]):
``{"type": "window", "id": j, "i0": a, "i1": b, "columns": c}`` → ``{"type": "window", "id": j,
"timeline": ..., "lives": ...}``; ``{"type": "layout", "id": j, "k": k}`` → ``{"type": "layout",
"id": j, "lives": ...}``: the payload's shapes, each column's bytes one buffer
(``{"dtype", "buffer": index}``); a question it cannot answer → ``{"type": "error", "id": j,
"message": ...}``.

The sampler thread stops on ``stop()``, when the widget is closed (from either side), and on
``stop_all_sessions()``, which the extension's unload calls. A session that showed its own
widget closes it once its output is the static bundle (Note [A finished view lets go]).
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anywidget
import numpy as np
import traitlets

from jupyter_gpumem.data.units import MAX_INTERVAL, check_seconds, format_bytes
from jupyter_gpumem.notebook.answers import answer_question
from jupyter_gpumem.render.display import MIME_TYPE, figure_png, img_tag, png_data
from jupyter_gpumem.render.html import dist_asset
from jupyter_gpumem.render.view_payload import (
    MAX_POINTS,
    build_view,
    decode_column,
    encode,
    live_view,
    samples_array,
    samples_payload,
    trace_detail,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.render.view_detail import TraceDetail

SampleFn = Callable[[], tuple[int, int, int | None]]
Sample = tuple[float, int, int, int | None]
#: Samples a live curve needs to be kept above a trace of the same cell (2 s at the default
#: 0.2 s interval); a quicker cell's curve becomes one line.
MIN_PLOTTED = 10

#: What the widget draws where the built views are missing (a source checkout never built).
_MISSING_ESM = """export default { render({ el }) {
  el.textContent = "jupyter_gpumem: the view script is not built (run jlpm build in labextension/)";
} };
"""


def _asset(name: str, fallback: str) -> str:
    try:
        return dist_asset(name)
    except FileNotFoundError:
        return fallback


class ViewWidget(anywidget.AnyWidget):
    """A widget drawn by our ``widget.js``, told when its comm closes (``on_close``)."""

    _esm = _asset("widget.js", _MISSING_ESM)
    _css = _asset("view.css", "")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._close_callbacks: list[Callable[[], None]] = []

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the widget's comm closes (either side)."""
        self._close_callbacks.append(callback)

    @traitlets.observe("comm")
    def _comm_set(self, change: dict[str, Any]) -> None:
        new = change["new"]
        if new is None:
            self._closed()
        elif hasattr(new, "on_close"):
            new.on_close(lambda _msg: self._closed())

    def _closed(self) -> None:
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            cb()

    def close(self) -> None:
        """Close the widget's comm, and its layout's: ipywidgets keeps every open widget (the
        layout ipywidgets made for this one is a widget too) until it is closed."""
        layout = self.layout
        super().close()
        if layout is not None:
            layout.close()


class MemoryWidget(ViewWidget):
    """Allocated/reserved bytes over time, then the trace's views. See the module notes."""

    #: "live" while samples arrive, "final" once a view payload is in.
    mode = traitlets.Unicode("live").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    interval_s = traitlets.Float(0.2).tag(sync=True)
    #: the live series, frozen once when sampling stops: ``{"n", "data": column}``, at most
    #: ``max_points`` rows (a view opened later draws it).
    samples = traitlets.Dict().tag(sync=True)
    #: the view payload of the final snapshot, bytes columns ({} until then).
    view = traitlets.Dict().tag(sync=True)
    #: allocated blocks at the end of ``view``, for quick checks.
    block_count = traitlets.Int(0).tag(sync=True)
    #: whether this kernel answers the view's windows and layouts (it keeps the trace's detail)
    detail = traitlets.Bool(False).tag(sync=True)

    def __init__(self, max_points: int = MAX_POINTS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_points = max_points
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        #: a reading taken before the widget was shown, for its saved fallback only (a sample
        #: sent before the browser's model exists would be lost, Note [Samples in order])
        self.preview: Sample | None = None
        self._snapshot: Snapshot | None = None
        self._detail: TraceDetail | None = None
        self.on_msg(self._on_browser_msg)

    # -- data in ----------------------------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, device: int | None = None,
                      max_points: int = MAX_POINTS, title: str = "",
                      cell_files: Mapping[str, int] | None = None) -> MemoryWidget:
        """A static widget of a saved or live snapshot: its trace's timeline and its blocks."""
        widget = cls(title=title, max_points=max_points)
        widget.show_snapshot(snapshot, device=device, cell_files=cell_files)
        return widget

    def show_snapshot(self, snapshot: Snapshot, *, device: int | None = None,
                      cell_files: Mapping[str, int] | None = None) -> None:
        """Show ``snapshot``'s views after the curve: its timeline, block layout and tables, of
        one device (``device``, by default ``snapshot_device``'s choice); sites in notebook
        cells are named ``cell [N] line L`` with ``cell_files`` (the ledger's)."""
        detail = trace_detail(snapshot, device=device, cell_files=cell_files)
        view = build_view(snapshot, kind="trace", device=device, title=self.title,
                          cell_files=cell_files, max_points=self.max_points, detail=detail,
                          binary=True)
        self.show_view(view, detail)
        self._snapshot = snapshot

    def show_view(self, view: dict[str, Any], detail: TraceDetail | None = None) -> None:
        """Show a view payload (bytes or base64 columns); with the ``detail`` it was made
        from, answer the view's windows and layouts."""
        view = encode(view, "bytes")
        blocks = view["lives"]["blocks"]
        n = view["n_events"]
        ends = decode_column(blocks["end"])
        self._detail = detail
        with self.hold_sync():
            self.view = view
            self.block_count = int(np.count_nonzero(ends >= n)) if len(ends) else 0
            self.detail = detail is not None
            self.mode = "final"

    # Note [Samples in order]: samples go to the browser as numbered batches ("first", "n").
    # The browser appends a batch only where its series ends; at a gap it asks again ("ready"
    # with what it has), and the kernel answers that only between cells, since its shell thread
    # runs the cell. A batch sent before the browser's model exists is lost, and with it every
    # later batch until the cell ends. So nothing is sent before the widget is shown: the
    # reading a saved fallback needs at display time is kept aside as ``preview``.

    def push_samples(self, rows: Sequence[Sample]) -> None:
        """Append ``rows`` to the series and send just them (any thread)."""
        if not rows:
            return
        with self._lock:
            first = len(self._samples)
            self._samples.extend(rows)
        self.send({"type": "samples", "first": first, "n": len(rows)},
                  buffers=[samples_array(rows).tobytes()])

    def freeze_samples(self) -> None:
        """Put the series, downsampled to ``max_points`` rows, in the ``samples`` trait."""
        with self._lock:
            rows = list(self._samples)
        if rows:
            self.samples = samples_payload(rows, self.max_points)

    @property
    def n_samples(self) -> int:
        return len(self._samples)

    # -- what a saved notebook keeps --------------------------------------------------------

    def _shown_rows(self) -> list[Sample]:
        """The samples a saved fallback shows: those taken, else the preview reading."""
        with self._lock:
            rows = list(self._samples)
        return rows or ([self.preview] if self.preview is not None else [])

    def sample_count(self) -> int:
        with self._lock:
            return len(self._samples)

    def describe(self) -> str:
        """One line saying what the widget shows (its ``text/plain``)."""
        rows = self._shown_rows()
        parts = []
        if rows:
            data = samples_array(rows)
            parts.append(f"{len(rows)} sample{'s' if len(rows) != 1 else ''} over "
                         f"{data[-1, 0] - data[0, 0]:.1f} s, allocated peaked at "
                         f"{format_bytes(int(data[:, 1].max()))}, reserved "
                         f"{format_bytes(int(data[:, 2].max()))}")
        view = self.view
        if view:
            parts.append(f"a trace of {view['n_events']} events, allocated peaked at "
                         f"{format_bytes(view['peak']['allocated'])}, {self.block_count} "
                         "blocks live at the end")
        what = "; then ".join(parts) if parts else "no samples yet"
        title = f" {self.title}" if self.title else ""
        return f"gpumem live view{title}: {what}"

    def _picture(self) -> tuple[bytes, str] | None:
        """The PNG of what the widget shows and its alt text (None without matplotlib)."""
        try:
            from jupyter_gpumem.render.plots import plot_samples, plot_timeline
        except ImportError:
            return None
        if self._snapshot is not None:
            ax = plot_timeline(self._snapshot, color_by="site")
            alt = (f"Plot of allocated and reserved GPU memory over the trace's "
                   f"{self.view['n_events']} events, peaking at "
                   f"{format_bytes(self.view['peak']['allocated'])} allocated.")
        else:
            ax = plot_samples(samples_array(self._shown_rows()))
            alt = ("Plot of allocated and reserved GPU memory sampled over time: "
                   + self.describe().split(": ", 1)[1] + ".")
        return figure_png(ax.figure), alt

    def static_bundle(self) -> dict[str, Any]:
        """The bundle a saved notebook keeps with no kernel: text/plain, text/html with one
        ``<img alt>``, the same PNG as image/png, and the view payload (the final view, else
        kind live with samples)."""
        line = self.describe()
        if self.view:
            payload = encode(self.view, "base64")
        else:
            payload = live_view(self._shown_rows(), title=self.title,
                                max_points=self.max_points)
        picture = self._picture()
        img = f"\n{img_tag(*picture)}" if picture is not None else ""
        return {"text/plain": line, "text/html": f"<p>{html.escape(line)}</p>{img}",
                **png_data(picture[0] if picture is not None else None), MIME_TYPE: payload}

    def close(self) -> None:
        """Close the widget (and its layout); shown again, it is its static bundle alone. It
        lets go of the trace's detail: nothing asks for it any more."""
        super().close()
        self._detail = None
        self.__dict__.pop("_repr_mimebundle_", None)  # ipywidgets blanks it on close

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if self.comm is None:  # closed: no view to show, what a saved notebook keeps
            return self.static_bundle(), {}
        shown = super()._repr_mimebundle_(**kwargs)
        if shown is None:
            return None
        data, metadata = shown
        return {**data, **self.static_bundle()}, metadata

    # -- browser messages -------------------------------------------------------------------

    def _on_browser_msg(self, _widget: Any, content: dict[str, Any],
                        _buffers: Sequence[Any]) -> None:
        if content.get("type") in ("window", "layout"):
            answer_question(self.send, self._detail, content)
        elif content.get("type") == "ready":
            have = max(0, int(content.get("have", 0)))
            with self._lock:
                rows = self._samples[have:]
            if rows:
                self.send({"type": "samples", "first": have, "n": len(rows)},
                          buffers=[samples_array(rows).tobytes()])


_SESSIONS: weakref.WeakSet[LiveSession] = weakref.WeakSet()


#: How long ``stop`` waits for the sampler thread. A sample takes microseconds; a ``sample_fn``
#: that hangs (a lock held by the cell, a device call that never returns) must not hang the cell
#: with it: past this the thread is left to end on its own (it is a daemon, and takes no sample
#: after the one it is in), the session says so in ``stuck``, and no final sample is taken.
JOIN_BOUND_S = 2.0


class LiveSession:
    """Sample ``sample_fn`` every ``interval_s`` into a live ``MemoryWidget`` until ``stop``.

    ``clock`` gives seconds (default ``time.perf_counter``); a sample's time is seconds since
    ``start``. If ``sample_fn`` raises, sampling stops and the error is kept in ``error``.
    """

    def __init__(self, sample_fn: SampleFn, interval_s: float = 0.2, *, title: str = "",
                 clock: Callable[[], float] = time.perf_counter,
                 widget: MemoryWidget | None = None) -> None:
        interval_s = check_seconds("interval_s", interval_s, most=MAX_INTERVAL)
        self.sample_fn = sample_fn
        self.interval_s = interval_s
        self.clock = clock
        self.widget = widget if widget is not None else MemoryWidget(title=title)
        #: made here: ``stop`` closes it (Note [A finished view lets go])
        self._own_widget = widget is None
        self.widget.interval_s = interval_s
        self.error: BaseException | None = None
        #: the sampler was still inside ``sample_fn`` ``JOIN_BOUND_S`` after ``stop`` asked it
        #: to end: ``stop`` returned without it
        self.stuck = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._refreshed = 0.0  # when refresh() last re-showed the widget
        self._halted = False
        self._display: Any = None  # the DisplayHandle of the widget's output
        self.widget.on_close(self._widget_closed)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, *, display: bool = True) -> LiveSession:
        """Show the widget (unless ``display=False``) and start the sampler thread."""
        if self._thread is not None:
            raise RuntimeError("this LiveSession was already started")
        if display:
            from IPython import display as ipython_display

            self.widget.preview = self._reading()
            show: Callable[..., Any] = ipython_display.display
            self._display = show(self.widget, display_id=True)
        self._t0 = self._refreshed = self.clock()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="jupyter_gpumem-sampler",
                                        daemon=True)
        _SESSIONS.add(self)
        self._thread.start()
        return self

    def _reading(self) -> Sample | None:
        """One reading at time 0, sent nowhere; None if ``sample_fn`` raised."""
        try:
            allocated, reserved, device_used = self.sample_fn()
        except Exception:
            return None
        return (0.0, int(allocated), int(reserved),
                None if device_used is None else int(device_used))

    def sample(self) -> bool:
        """Take one sample and send it; False (and sampling ends) if ``sample_fn`` raised."""
        try:
            allocated, reserved, device_used = self.sample_fn()
        except Exception as exc:
            self.error = exc
            self._stop.set()
            return False
        t = self.clock() - self._t0
        self.widget.push_samples([(t, int(allocated), int(reserved),
                                   None if device_used is None else int(device_used))])
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.sample():
                break

    def stop(self, snapshot: Snapshot | None = None,
             cell_files: Mapping[str, int] | None = None, *, traced: bool = False) -> None:
        """Stop and join the sampler; with ``snapshot``, show its views. The output the session
        displayed becomes the widget's static bundle (no widget view), so a saved notebook
        keeps what it showed with no kernel. ``traced``: a trace of the same cell is shown
        below; a curve of fewer than ``MIN_PLOTTED`` samples then becomes one line of text (a
        cell that quick has nothing to show over time that the trace does not)."""
        was_running = self._halt()
        if (was_running and self.error is None and not self.stuck
                and self.widget.comm is not None):
            self.sample()  # the state at the cell's end
        self.widget.freeze_samples()
        if snapshot is not None:
            self.widget.show_snapshot(snapshot, cell_files=cell_files)
        handle, self._display = self._display, None
        if handle is None:
            return
        if traced and snapshot is None and self.widget.sample_count() < MIN_PLOTTED:
            line = (f"{self.widget.describe()} (too quick to plot over time: the trace below "
                    "has every event)")
            handle.update({"text/plain": line, "text/html": f"<p>{html.escape(line)}</p>"},
                          raw=True)
        else:
            handle.update(self.widget.static_bundle(), raw=True)
        if self._own_widget:  # Note [A finished view lets go]
            self.widget.close()

    def refresh(self, every_s: float = 10.0) -> bool:
        """Re-show the running widget with its static fallback brought up to date, at most once
        every ``every_s`` seconds (a notebook saved while it still runs keeps a recent curve,
        not the empty one it was first shown with). True if it re-showed it."""
        every_s = check_seconds("every_s", every_s, least_ok=True)
        handle = self._display
        now = self.clock()
        if handle is None or not self.running or now - self._refreshed < every_s:
            return False
        self._refreshed = now
        handle.update(self.widget)
        return True

    def _halt(self) -> bool:
        """Stop the sampler and join it; True only the first time, if it had started."""
        self._stop.set()
        _SESSIONS.discard(self)
        thread = self._thread
        if thread is None or self._halted:
            return False
        self._halted = True
        if thread is not threading.current_thread():
            thread.join(JOIN_BOUND_S)
            self.stuck = thread.is_alive()
        return True

    def _widget_closed(self) -> None:
        self._halt()

    def __enter__(self) -> LiveSession:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# Note [A finished view lets go]: ipywidgets keeps every open widget in its registry (and the
# browser its model) until the widget is closed, so a session per traced cell that left its
# widget open kept it, its layout, its samples and the session for the rest of the kernel's life
# (two widgets and ~23 KB a quick traced cell; more with a long cell's samples). Once ``stop``
# has replaced the session's output by the static bundle, no output shows the widget's view, so
# a session closes the widget it made and showed; the browser then drops the model too, and a
# notebook saved with its widget state keeps none of it. The Python object still reads as
# before (``samples``, ``view``, ``static_bundle()``) and, shown again, is its static bundle. A
# widget handed in (``widget=``) or a session started with ``display=False`` is the caller's:
# left open.


def stop_all_sessions() -> int:
    """Stop every running ``LiveSession`` (the extension's unload calls this); how many."""
    sessions = list(_SESSIONS)
    for s in sessions:
        s.stop()
    return len(sessions)
