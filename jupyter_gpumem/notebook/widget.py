"""The live widget: a memory curve that grows while a cell runs, then the trace and block layout.

``LiveSession(sample_fn)`` shows a ``MemoryWidget`` and starts a sampler thread that calls
``sample_fn() -> (allocated, reserved, device_used | None)`` every ``interval_s`` and sends only
the new samples as a small custom message with one binary buffer. ``stop(snapshot)`` joins the
thread and hands the widget the trace's timeline and block layout (``widget_payload``), which
the browser draws with its own code (``static/widget.js``; no library, no network).

The widget reads only ``sample_fn``'s numbers and snapshot dicts; it never touches an allocator.

Messages, kernel → browser (custom, through ``widget.send``):

- ``{"type": "samples", "first": k, "n": m}`` + one buffer of m rows ``SAMPLE_FIELDS`` (float64):
  samples ``k .. k+m-1``. A view that already has them ignores them.
- ``{"type": "picked", "allocation": {...} | None}``: the answer to a ``pick``.

Browser → kernel: ``{"type": "ready", "have": n}`` when a view starts (the kernel answers with
samples ``n ..``, so a view that opens late catches up once) and
``{"type": "pick", "event": i, "band": g, "offset": bytes}`` when a band is clicked.

The sampler thread stops on ``stop()``, when the widget is closed (from either side), and on
``stop_all_sessions()``, which the extension's unload calls.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from jupyter_gpumem.data.devices import device_segments, snapshot_device
from jupyter_gpumem.render.widget_payload import (
    PickIndex,
    layout_payload,
    pick_allocation,
    samples_buffer,
    timeline_payload,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot

SampleFn = Callable[[], tuple[int, int, int | None]]
Sample = tuple[float, int, int, int | None]

_STATIC = Path(__file__).parent.parent / "render" / "static"


class MemoryWidget(anywidget.AnyWidget):
    """Allocated/reserved bytes over time, and the segments' blocks. See the module notes."""

    _esm = _STATIC / "widget.js"
    _css = _STATIC / "widget.css"

    #: "live" while samples arrive, "final" once the trace and layout are in.
    mode = traitlets.Unicode("live").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    interval_s = traitlets.Float(0.2).tag(sync=True)
    #: the whole live series, set once when sampling stops (a view opened later draws it).
    samples = traitlets.Dict().tag(sync=True)
    #: ``_widget_payload.timeline_payload`` of the final snapshot ({} until then).
    timeline = traitlets.Dict().tag(sync=True)
    #: ``_widget_payload.layout_payload`` of the final snapshot ({} until then).
    block_layout = traitlets.Dict().tag(sync=True)
    #: blocks in ``block_layout``, for quick checks.
    block_count = traitlets.Int(0).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pick: PickIndex | None = None
        self._close_callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self.on_msg(self._on_browser_msg)

    # -- data in ----------------------------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, device: int | None = None,
                      max_points: int = 4000, title: str = "",
                      cell_files: Mapping[str, int] | None = None) -> MemoryWidget:
        """A static widget of a saved or live snapshot: its trace's timeline and its blocks."""
        widget = cls(title=title)
        widget.show_snapshot(snapshot, device=device, max_points=max_points,
                             cell_files=cell_files)
        return widget

    def show_snapshot(self, snapshot: Snapshot, *, device: int | None = None,
                      max_points: int = 4000,
                      cell_files: Mapping[str, int] | None = None) -> None:
        """Replace what the widget shows after the cell by ``snapshot``'s timeline and layout,
        of one device (``device``, by default ``snapshot_device``'s choice); sites in notebook
        cells are named ``cell [N] line L`` with ``cell_files`` (the ledger's)."""
        device = snapshot_device(snapshot, device)
        timeline, pick = timeline_payload(snapshot, device=device, max_points=max_points,
                                          cell_files=cell_files)
        layout = layout_payload(device_segments(snapshot, device))
        self._pick = pick
        with self.hold_sync():
            self.timeline = timeline
            self.block_layout = layout
            self.block_count = layout["n_blocks"]
            self.mode = "final"

    def push_samples(self, rows: Sequence[Sample]) -> None:
        """Append ``rows`` to the series and send just them (any thread)."""
        if not rows:
            return
        with self._lock:
            first = len(self._samples)
            self._samples.extend(rows)
        self.send({"type": "samples", "first": first, "n": len(rows)},
                  buffers=[samples_buffer(rows)])

    def freeze_samples(self) -> None:
        """Put the whole series in the ``samples`` trait, once, for views opened later."""
        with self._lock:
            rows = list(self._samples)
        if rows:
            self.samples = {"n": len(rows), "data": samples_buffer(rows)}

    @property
    def n_samples(self) -> int:
        return len(self._samples)

    # -- browser messages -------------------------------------------------------------------

    def _on_browser_msg(self, _widget: Any, content: dict[str, Any],
                        _buffers: Sequence[Any]) -> None:
        kind = content.get("type")
        if kind == "ready":
            have = max(0, int(content.get("have", 0)))
            with self._lock:
                rows = self._samples[have:]
            if rows:
                self.send({"type": "samples", "first": have, "n": len(rows)},
                          buffers=[samples_buffer(rows)])
        elif kind == "pick":
            found = None
            if self._pick is not None:
                found = pick_allocation(self._pick, int(content.get("event", 0)),
                                        int(content.get("band", 0)),
                                        float(content.get("offset", 0.0)))
            self.send({"type": "picked", "allocation": found})

    # -- closing ----------------------------------------------------------------------------

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


_SESSIONS: weakref.WeakSet[LiveSession] = weakref.WeakSet()


class LiveSession:
    """Sample ``sample_fn`` every ``interval_s`` into a live ``MemoryWidget`` until ``stop``.

    ``clock`` gives seconds (default ``time.perf_counter``); a sample's time is seconds since
    ``start``. If ``sample_fn`` raises, sampling stops and the error is kept in ``error``.
    """

    def __init__(self, sample_fn: SampleFn, interval_s: float = 0.2, *, title: str = "",
                 clock: Callable[[], float] = time.perf_counter,
                 widget: MemoryWidget | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.sample_fn = sample_fn
        self.interval_s = interval_s
        self.clock = clock
        self.widget = widget if widget is not None else MemoryWidget(title=title)
        self.widget.interval_s = interval_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._halted = False
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

            show: Callable[[Any], object] = ipython_display.display
            show(self.widget)
        self._t0 = self.clock()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="jupyter_gpumem-sampler",
                                        daemon=True)
        _SESSIONS.add(self)
        self._thread.start()
        return self

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
             cell_files: Mapping[str, int] | None = None) -> None:
        """Stop and join the sampler; with ``snapshot``, show its timeline and block layout."""
        was_running = self._halt()
        if was_running and self.error is None and self.widget.comm is not None:
            self.sample()  # the state at the cell's end
        self.widget.freeze_samples()
        if snapshot is not None:
            self.widget.show_snapshot(snapshot, cell_files=cell_files)

    def _halt(self) -> bool:
        """Stop the sampler and join it; True only the first time, if it had started."""
        self._stop.set()
        _SESSIONS.discard(self)
        thread = self._thread
        if thread is None or self._halted:
            return False
        self._halted = True
        if thread is not threading.current_thread():
            thread.join()
        return True

    def _widget_closed(self) -> None:
        self._halt()

    def __enter__(self) -> LiveSession:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def stop_all_sessions() -> int:
    """Stop every running ``LiveSession`` (the extension's unload calls this); how many."""
    sessions = list(_SESSIONS)
    for s in sessions:
        s.stop()
    return len(sessions)
