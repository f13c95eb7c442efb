"""The live view of every worker of a Dask cluster: a heat strip that grows once a second.

``ClusterLive(client, interval=1.0).start()`` displays a ``ClusterWidget`` and starts a
``ClusterSampler`` (``jupyter_gpumem.dask.live``) whose every round is sent to the browser as one
small custom message: only that round, never the history. The displayed output carries the
strip's static fallback beside the widget view (a ``text/plain`` line saying what it shows, one
``<img alt>`` of the strip and the same PNG as ``image/png``: Note [Static fallbacks] in
``render.display``), brought up to date after a cell at most every 10 s (``refresh``), so a
notebook saved while it runs keeps a recent strip. ``stop()`` (``%gpumem cluster --stop``, the
next ``%gpumem cluster``, the widget closing, the client closing, the extension's unload) stops
the sampler, replaces the displayed widget by that fallback alone and closes the widget (Note
[A finished view lets go] in ``widget``).

Messages, kernel → browser (custom, through ``widget.send``):
``{"type": "rounds", "first": k, "t": [...], "counts": [...], "tasks": [...]}`` with two buffers:
the rounds' worker rows (int32) and their values (float64, ``FIELDS`` per row), rounds
``k .. k+len(t)-1`` back to back. Browser → kernel: ``{"type": "ready", "have": n}`` when a view
starts or finds a gap: the kernel answers with the rounds from ``n`` still in the window.
The worker list (row, name, GPU, device total, state) is the ``workers`` trait, set only when it
changes (a worker joins, leaves, goes stale or comes back).
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import traitlets

from jupyter_gpumem.dask.live import (
    DEFAULT_CAPACITY,
    DEFAULT_INTERVAL,
    FIELDS,
    GONE,
    STALE,
    ClusterSampler,
    Round,
    WorkerRow,
)
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.notebook.widget import ViewWidget
from jupyter_gpumem.render.display import figure_png, img_tag, png_data

__all__ = ["ClusterLive", "ClusterWidget", "refresh_cluster_views", "stop_all_cluster_views"]

#: Colours the strip's picture keeps: a heat map's cells need more than line art
#: (``display.PALETTE_COLOURS``) for each to keep its own colour.
STRIP_COLOURS = 256


class ClusterWidget(ViewWidget):
    """The heat strip of a cluster's workers (drawn by ``widget.js``, its cluster view)."""

    #: Which view of ``widget.js`` draws this model.
    view_kind = traitlets.Unicode("cluster").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    interval_s = traitlets.Float(DEFAULT_INTERVAL).tag(sync=True)
    #: Rounds the browser keeps (the window), as the sampler's.
    capacity = traitlets.Int(DEFAULT_CAPACITY).tag(sync=True)
    #: "allocated" or "reserved": what the colour shows (the browser has a toggle too).
    color_by = traitlets.Unicode("allocated").tag(sync=True)
    #: ``WorkerRow.as_dict()`` of every worker with a row.
    workers: traitlets.List[dict[str, Any]] = traitlets.List().tag(sync=True)
    #: False once the sampler stopped.
    running = traitlets.Bool(True).tag(sync=True)
    #: The rounds in the window when the view was shown (``rounds_message``'s content and its
    #: two buffers as ``rows`` and ``values``): a view drawn while the kernel is busy cannot
    #: ask for them, so they come with the model's state. Set by ``ClusterLive.start``.
    history = traitlets.Dict().tag(sync=True)

    def __init__(self, source: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Where the rounds come from: anything with ``snapshot_rounds()`` (a ClusterSampler).
        self.source = source
        #: The static bundle shown beside the widget view (``ClusterLive.static_bundle``).
        self.fallback: Callable[[], dict[str, Any]] | None = None
        self._send_lock = threading.Lock()
        self.on_msg(self._on_browser_msg)

    def close(self) -> None:
        """Close the widget (and its layout); shown again, it is its fallback alone."""
        super().close()
        self.__dict__.pop("_repr_mimebundle_", None)  # ipywidgets blanks it on close

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        static = self.fallback() if self.fallback is not None else {}
        if self.comm is None:  # closed: no view to show
            return (static, {}) if static else None
        shown = super()._repr_mimebundle_(**kwargs)
        if shown is None:
            return None
        data, metadata = shown
        return {**data, **static}, metadata


    def push_round(self, rnd: Round, workers: Sequence[WorkerRow]) -> None:
        """Send one new round (any thread); the worker list only if it changed."""
        listing = [w.as_dict() for w in workers]
        with self._send_lock:
            if listing != self.workers:
                self.workers = listing
            self._send_rounds([rnd])

    def _send_rounds(self, rounds: Sequence[Round]) -> None:
        if rounds:
            content, buffers = rounds_message(rounds)
            self.send(content, buffers=buffers)

    def set_history(self, rounds: Sequence[Round], workers: Sequence[WorkerRow]) -> None:
        """Put ``rounds`` (the window so far) in the ``history`` trait."""
        content, (rows, values) = rounds_message(rounds)
        with self._send_lock:
            self.workers = [w.as_dict() for w in workers]
            self.history = {**content, "rows": rows, "values": values} if rounds else {}

    def _on_browser_msg(self, _widget: Any, content: dict[str, Any],
                        _buffers: Sequence[Any]) -> None:
        if content.get("type") != "ready" or self.source is None:
            return
        have = int(content.get("have", 0) or 0)
        rounds, workers = self.source.snapshot_rounds()
        with self._send_lock:
            self.workers = [w.as_dict() for w in workers]
            self._send_rounds([r for r in rounds if r.index >= have])


def rounds_message(rounds: Sequence[Round]) -> tuple[dict[str, Any], list[bytes]]:
    """The "rounds" message of ``rounds`` (back to back) and its two buffers."""
    if not rounds:
        return {"type": "rounds", "first": 0, "t": [], "counts": [], "tasks": []}, [b"", b""]
    rows = np.concatenate([r.rows for r in rounds]).astype(np.int32)
    values = np.concatenate([r.values for r in rounds]).astype(np.float64)
    return ({"type": "rounds", "first": rounds[0].index, "t": [r.t for r in rounds],
             "counts": [len(r.rows) for r in rounds],
             "tasks": [t for r in rounds for t in r.tasks]},
            [rows.tobytes(), values.tobytes()])


def strip_arrays(rounds: Sequence[Round], workers: Sequence[WorkerRow], value: str = "allocated"
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(times, bytes, states, totals)``: workers (in ``workers`` order) × rounds."""
    at = {w.row: i for i, w in enumerate(workers)}
    col = FIELDS.index(value)
    state_col = FIELDS.index("state")
    times = np.asarray([r.t for r in rounds], dtype=np.float64)
    data = np.full((len(workers), len(rounds)), np.nan)
    states = np.full((len(workers), len(rounds)), np.nan)
    for j, r in enumerate(rounds):
        for k, row in enumerate(r.rows):
            i = at.get(int(row))
            if i is not None:
                data[i, j] = r.values[k, col]
                states[i, j] = r.values[k, state_col]
    totals = np.asarray([w.total for w in workers], dtype=np.float64)
    return times, data, states, totals


def _label(w: WorkerRow) -> str:
    gpu = f" GPU {w.gpu}" if w.gpu >= 0 else ""
    return f"{w.short_name}{gpu}" + (" (gone)" if w.state == GONE else "")


def _natural(w: WorkerRow) -> tuple[Any, ...]:
    name = w.short_name
    return (0, int(name), w.address) if name.isdigit() else (1, name, w.address)


class ClusterLive:
    """``%gpumem cluster``'s live view: a sampler, a widget, and the output they live in."""

    def __init__(self, client: Any, interval: float = DEFAULT_INTERVAL, *,
                 capacity: int = DEFAULT_CAPACITY, title: str = "",
                 sampler: Any = None) -> None:
        self.sampler = sampler if sampler is not None else ClusterSampler(
            client, interval, capacity=capacity)
        self.widget = ClusterWidget(self.sampler, title=title, interval_s=self.sampler.interval,
                                    capacity=self.sampler.capacity)
        self.widget.fallback = self.static_bundle
        self._display: Any = None
        self._stopped = False
        self._refreshed = 0.0  # when refresh() last re-showed the widget (time.monotonic)
        self._lock = threading.Lock()
        self.sampler.on_round(lambda s, rnd: self.widget.push_round(rnd, s.snapshot_rounds()[1]))
        on_end = getattr(self.sampler, "on_end", None)
        if on_end is not None:
            on_end(self.stop)
        self.widget.on_close(self.stop)

    @property
    def running(self) -> bool:
        return bool(self.sampler.running)

    def start(self, *, display: bool = True) -> ClusterLive:
        """Show the widget (unless ``display=False``) and start sampling. A view shown with no
        round yet takes one first, so its saved fallback has a strip to draw."""
        if display and not self.sampler.snapshot_rounds()[0]:
            self.sampler.sample()
        self.widget.set_history(*self.sampler.snapshot_rounds())
        if display:
            from IPython import display as ipython_display

            show: Any = ipython_display.display
            self._display = show(self.widget, display_id=True)
            self._refreshed = time.monotonic()
        _VIEWS.add(self)
        self.sampler.start()
        return self

    def refresh(self, every_s: float = 10.0) -> bool:
        """Re-show the running widget with its fallback brought up to date, at most once every
        ``every_s`` seconds; True if it did."""
        handle = self._display
        now = time.monotonic()
        if handle is None or self._stopped or now - self._refreshed < every_s:
            return False
        self._refreshed = now
        handle.update(self.widget)
        return True

    def stop(self) -> None:
        """Stop sampling; the displayed widget becomes the static bundle (once)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        _VIEWS.discard(self)
        self.sampler.stop()
        self.widget.running = False
        handle, self._display = self._display, None
        if handle is not None:
            handle.update(self.static_bundle(), raw=True)
            self.widget.close()  # Note [A finished view lets go] in ``widget``

    # -- what a saved notebook keeps ---------------------------------------------------------

    def _arrays(self) -> tuple[list[WorkerRow], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        rounds, workers = self.sampler.snapshot_rounds()
        workers = sorted(workers, key=_natural)
        times, data, states, totals = strip_arrays(rounds, workers, self.widget.color_by)
        return workers, times, data, states, totals

    def describe(self) -> str:
        """One line: the workers, samples, span, and the most allocated, on which worker."""
        rounds, workers = self.sampler.snapshot_rounds()
        workers = sorted(workers, key=_natural)
        if not rounds or not workers:
            return "gpumem cluster live view: no samples yet"
        times, alloc, _states, _ = strip_arrays(rounds, workers, "allocated")
        gone = sum(w.state == GONE for w in workers)
        stale = sum(w.state == STALE for w in workers)
        span = float(times[-1] - times[0]) if len(times) > 1 else 0.0
        text = (f"gpumem cluster live view: {len(workers)} worker{'s' if len(workers) != 1 else ''}"
                + (f" ({gone} gone)" if gone else "") + (f" ({stale} stale)" if stale else "")
                + f", {len(rounds)} sample{'s' if len(rounds) != 1 else ''} over {span:.1f} s")
        if np.isfinite(alloc).any():
            i, _j = np.unravel_index(np.nanargmax(alloc), alloc.shape)
            w = workers[int(i)]
            text += (f"; allocated peaked at {format_bytes(int(np.nanmax(alloc)))} on worker "
                     f"{_label(w)} ({w.address})")
        return text

    def _picture(self) -> tuple[bytes, str] | None:
        """The strip's PNG and its alt text (None without matplotlib)."""
        try:
            from jupyter_gpumem.render.cluster_strip import plot_cluster_strip, strip_alt
        except ImportError:
            return None
        workers, times, data, states, totals = self._arrays()
        with np.errstate(invalid="ignore", divide="ignore"):
            fractions = data / np.where(totals > 0, totals, np.nan)[:, None]
        value = self.widget.color_by
        ax = plot_cluster_strip(times, fractions, [_label(w) for w in workers], states=states,
                                value=value, title=self.widget.title)
        if np.isfinite(data).any():
            i, _j = np.unravel_index(np.nanargmax(data), data.shape)
            peak, who = int(np.nanmax(data)), _label(workers[int(i)])
        else:
            peak, who = 0, "(none)"
        span = float(times[-1] - times[0]) if len(times) > 1 else 0.0
        alt = strip_alt(len(workers), len(times), span, value, peak, who)
        return figure_png(ax.figure, STRIP_COLOURS), alt

    def static_bundle(self) -> dict[str, Any]:
        """text/plain (``describe``), text/html with one ``<img alt>`` of the strip, and the
        same PNG as image/png; the strip drawn once."""
        line = self.describe()
        picture = self._picture()
        img = f"\n{img_tag(*picture)}" if picture is not None else ""
        return {"text/plain": line, "text/html": f"<p>{html.escape(line)}</p>{img}",
                **png_data(picture[0] if picture is not None else None)}

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return self.static_bundle()

    def __repr__(self) -> str:
        return self.describe()


_VIEWS: weakref.WeakSet[ClusterLive] = weakref.WeakSet()


def refresh_cluster_views() -> int:
    """Bring the saved fallback of every running cluster view up to date (each at most every
    10 s: ``ClusterLive.refresh``; the extension calls this after each cell); how many."""
    return sum(v.refresh() for v in list(_VIEWS))


def stop_all_cluster_views() -> int:
    """Stop every running cluster view (the next ``%gpumem cluster``, the extension's unload);
    how many."""
    views = list(_VIEWS)
    for v in views:
        v.stop()
    return len(views)
