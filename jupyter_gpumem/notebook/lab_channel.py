"""The kernel's side of JupyterLab's GPU memory panel and cell badges: one comm target,
``COMM_TARGET``, and what goes through it (``data.lab_schema`` has the shapes).

``%load_ext`` makes a ``LabChannel`` when the shell runs in a kernel (``comm_layer``); it

- registers the comm target, so a frontend can open a comm of its own, and opens one comm to the
  frontends with the whole state as its data (so a notebook already open learns of the load);
- answers ``{"type": "hello"}`` on any of its comms with the whole state (a frontend that
  attaches to an open comm, found with ``comm_info``, says it once);
- at each cell's start and end takes a sample of every source read (``sources.current_sources``)
  on the session's time axis (Note [Session time] in ``session_series``), and at its end sends
  the cell's badge, its span, the new samples, the devices and the sources;
- while a cell runs, and only while a frontend listens, samples every ``INTERVAL_S`` from a
  thread and sends what is new at most every ``SEND_EVERY_S`` (Note [Messages from a thread]).

The browser never asks a busy kernel anything: everything during a cell is pushed. ``close()``
(unload) stops the thread, closes every comm with ``{"reason": "unload"}`` and unregisters the
target.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from jupyter_gpumem.data.lab_schema import (
    COMM_TARGET,
    LAB_SCHEMA,
    CellEntry,
    CellMessage,
    CellSpan,
    SamplesMessage,
    StateMessage,
)
from jupyter_gpumem.notebook.folded_cells import KEEP_ROWS
from jupyter_gpumem.notebook.lab_records import (
    badge_record,
    cell_badge,
    device_uses,
    source_infos,
)
from jupyter_gpumem.notebook.live_view import INTERVAL_S, reading
from jupyter_gpumem.notebook.session_series import SessionClock, SessionSeries
from jupyter_gpumem.render.view_payload import MAX_POINTS
from jupyter_gpumem.sources.registry import current_sources

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord
    from jupyter_gpumem.notebook.ledger import Ledger
    from jupyter_gpumem.sources.protocol import MemorySource

__all__ = ["INTERVAL_S", "SEND_EVERY_S", "CommLayer", "LabChannel", "comm_layer", "request_ids"]

#: Seconds between two messages of samples while a cell runs, at least.
SEND_EVERY_S = 0.5
#: How long ``close`` waits for the sampler thread (it takes microseconds a sample).
JOIN_BOUND_S = 2.0


class CommLayer(Protocol):
    """What the channel uses of the ``comm`` package (a kernel's, or a test's)."""

    def create_comm(self, target_name: str, data: Any) -> Any: ...

    def register_target(self, target_name: str, callback: Callable[[Any, Any], None]) -> None: ...

    def unregister_target(self, target_name: str, callback: Callable[[Any, Any], None]
                          ) -> None: ...


class _KernelComms:
    """The ``comm`` package of the running kernel (ipykernel sets its create and manager)."""

    def __init__(self) -> None:
        import comm

        self._comm = comm

    def create_comm(self, target_name: str, data: Any) -> Any:
        return self._comm.create_comm(target_name=target_name, data=data)

    def register_target(self, target_name: str, callback: Callable[[Any, Any], None]) -> None:
        self._comm.get_comm_manager().register_target(target_name, callback)

    def unregister_target(self, target_name: str, callback: Callable[[Any, Any], None]) -> None:
        manager = self._comm.get_comm_manager()
        with contextlib.suppress(KeyError):
            manager.unregister_target(target_name, callback)


def comm_layer(shell: Any) -> CommLayer | None:
    """The comms of the kernel ``shell`` runs in; None outside a kernel (a terminal IPython)."""
    if getattr(shell, "kernel", None) is None:
        return None
    try:
        return _KernelComms()
    except ImportError:  # no comm package: no panel, the rest works
        return None


def request_ids(shell: Any, info: Any = None) -> tuple[str | None, str | None]:
    """``(msg_id, cell_id)`` of the execute request the running cell came from: the id of the
    request's message, and the notebook cell's id (IPython's ``info.cell_id``, else the request's
    ``metadata.cellId`` as JupyterLab sends it). Nones outside a kernel."""
    cell_id = getattr(info, "cell_id", None)
    parent: Any = {}
    get_parent = getattr(getattr(shell, "kernel", None), "get_parent", None)
    if callable(get_parent):
        with contextlib.suppress(Exception):
            parent = get_parent("shell") or {}
    header = parent.get("header") if isinstance(parent, dict) else None
    meta = parent.get("metadata") if isinstance(parent, dict) else None
    msg_id = header.get("msg_id") if isinstance(header, dict) else None
    if cell_id is None and isinstance(meta, dict):
        cell_id = meta.get("cellId")
    return (msg_id if isinstance(msg_id, str) else None,
            cell_id if isinstance(cell_id, str) else None)


_Sources = Callable[[], Iterable["MemorySource"]]


class LabChannel:
    """One shell's comm target and comms for the panel and badges (module docstring)."""

    def __init__(self, ledger: Ledger, comms: CommLayer, *,
                 sources_for: _Sources = current_sources,
                 clock: Callable[[], float] = time.perf_counter,
                 interval_s: float = INTERVAL_S, send_every_s: float = SEND_EVERY_S,
                 max_points: int = MAX_POINTS, keep_cells: int = KEEP_ROWS) -> None:
        self.ledger = ledger
        self._layer = comms
        self._sources_for = sources_for
        self._clock = clock
        self.interval_s = interval_s
        self.send_every_s = send_every_s
        self.session = SessionClock(clock)
        self.series = SessionSeries(max_points)
        self.cells: deque[CellEntry] = deque(maxlen=keep_cells)
        self._comms: list[Any] = []
        self._lock = threading.RLock()
        self._request: tuple[str | None, str | None] = (None, None)
        #: the span of the cell whose code ended, until its message is sent
        self._stopped: CellSpan | None = None
        self._busy = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._open = False

    # -- the comms -------------------------------------------------------------------------------

    def open(self) -> None:
        """Register the target and announce the load to the frontends with the state."""
        if self._open:
            return
        self._open = True
        self._layer.register_target(COMM_TARGET, self._on_open)
        comm = self._layer.create_comm(COMM_TARGET, self.state())
        self._attach(comm)

    @property
    def comms(self) -> list[Any]:
        """The comms open now (a frontend's, or the one the load opened)."""
        with self._lock:
            return list(self._comms)

    def _attach(self, comm: Any) -> None:
        comm.on_msg(lambda msg: self._on_msg(comm, msg))
        comm.on_close(lambda _msg: self._forget(comm))
        with self._lock:
            self._comms.append(comm)

    def _forget(self, comm: Any) -> None:
        with self._lock:
            if comm in self._comms:
                self._comms.remove(comm)

    def _on_open(self, comm: Any, _msg: Any) -> None:
        """A frontend opened a comm of its own: it gets the state."""
        self._attach(comm)
        comm.send(self.state())

    def _on_msg(self, comm: Any, msg: Any) -> None:
        data = (msg or {}).get("content", {}).get("data") or {}
        if isinstance(data, dict) and data.get("type") == "hello":
            comm.send(self.state())

    def _send(self, message: Any) -> None:
        """Send ``message`` on every comm (under the lock, so messages keep their order)."""
        for comm in list(self._comms):
            try:
                comm.send(message)
            except Exception:  # a comm closed under us: the frontend opens another
                self._comms.remove(comm)

    def close(self) -> None:
        """Unload: stop sampling, close every comm saying why, unregister the target."""
        self._stop.set()
        self._busy.set()  # wake the thread, to end
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_BOUND_S)
        with self._lock:
            comms, self._comms = self._comms, []
        for comm in comms:
            with contextlib.suppress(Exception):
                comm.close({"reason": "unload"})
        if self._open:
            self._layer.unregister_target(COMM_TARGET, self._on_open)
            self._open = False

    # -- what is sent ----------------------------------------------------------------------------

    def state(self) -> StateMessage:
        """Everything known now: the lanes, the cells' spans and badges, the devices, the
        sources."""
        srcs = list(self._sources_for())
        devices, infos = device_uses(srcs), source_infos(srcs)
        with self._lock:
            return {"type": "state", "version": LAB_SCHEMA, "running": self.session.running,
                    "lanes": self.series.lanes(), "spans": [s.copy() for s in self.series.spans],
                    "cells": list(self.cells), "devices": devices, "sources": infos}

    def _sample(self, sources: Sequence[MemorySource] | None = None) -> None:
        """One sample of every source read, now on the session's axis."""
        for src in sources if sources is not None else list(self._sources_for()):
            try:
                allocated, reserved, used = reading(src)
                key = (src.name, int(src.device_index), str(src.device_name))
            except Exception:  # a source that cannot be read now (a device switch under way)
                continue
            with self._lock:
                t = round(self.session.now(), 4)
                self.series.add(*key, (t, allocated, reserved, used))

    # -- cells -----------------------------------------------------------------------------------

    def cell_started(self, cell: int, msg_id: str | None, cell_id: str | None) -> None:
        """A cell begins: its span, a sample; the sampler wakes if a frontend listens."""
        with self._lock:
            start = self.session.start_cell()
            self.series.start_span(cell, cell_id, msg_id, start)
            self._request = (msg_id, cell_id)
        self._sample()
        if self._comms:
            self._ensure_thread()
            self._busy.set()

    def cell_stopped(self) -> None:
        """The cell's code has run (the first thing after it): the sampler sleeps, the session
        clock stops, a sample is taken. The extension's own work after a cell (the ledger, its
        holder search) is not the cell's."""
        self._busy.clear()
        with self._lock:
            if not self.session.running:
                return  # no cell was started (the cell that loaded the extension), or said
            self._stopped = self.series.end_span(self.session.end_cell())
        self._sample()

    def cell_ended(self, rows: Sequence[CellRecord], execution_count: int | None) -> None:
        """The ledger recorded the cell's ``rows`` (one a source): its message, to every comm."""
        self.cell_stopped()  # if the extension did not say so first
        records = []
        for row in rows:
            src = self.ledger.source_of(row)
            try:
                where = (int(src.device_index), str(src.device_name)) if src else (0, "")
            except Exception:
                where = (0, "")
            record = badge_record(row, self.ledger.cause_of(row), *where)
            records.append(record)
            span = self._stopped
            if span is not None and src is not None and record["peak_exact"]:
                with self._lock:  # Note [A cell's peak between samples] in session_series
                    self.series.mark_peak(src.name, where[0], span["start"],
                                          record["peak_allocated"])
        count = execution_count if execution_count is not None else (
            rows[0]["cell"] if rows else None)
        srcs = list(self._sources_for()) if self._comms else []
        devices, infos = device_uses(srcs), source_infos(srcs)
        with self._lock:
            span, self._stopped = self._stopped, None
            if span is None:
                return
            if count is not None:
                span["cell"] = count  # the number the frontend shows (Note [Cell numbers])
            msg_id, cell_id = self._request
            badge = cell_badge(records, count) if records and count is not None else None
            if badge is not None:
                self.cells.append({"cell_id": cell_id, "msg_id": msg_id, "badge": badge})
            if not self._comms:
                return
            lanes, new = self.series.take_new()
            message: CellMessage = {"type": "cell", "cell_id": cell_id, "msg_id": msg_id,
                                    "badge": badge, "span": span.copy(), "lanes": lanes,
                                    "new_lanes": new, "devices": devices, "sources": infos}
            self._send(message)

    # -- the sampler -----------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="jupyter_gpumem-lab-sampler",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._busy.wait()
            last_sent = self._clock()
            while self._busy.is_set() and not self._stop.wait(self.interval_s):
                if not self._busy.is_set():
                    break
                self._sample()
                if self._clock() - last_sent >= self.send_every_s:
                    self._push()
                    last_sent = self._clock()

    def _push(self) -> None:
        """Send the samples not sent yet (from the sampler thread)."""
        with self._lock:
            if not self._busy.is_set():
                return  # the cell ended meanwhile: its message carries them
            lanes, new = self.series.take_new()
            if not lanes and not new:
                return
            message: SamplesMessage = {"type": "samples", "lanes": lanes}
            if new:
                message["new_lanes"] = new
            self._send(message)


# Note [Messages from a thread]: while a cell runs, the shell thread is inside the user's code, so
# the samples go out from the sampler thread. A comm's ``send`` publishes on the kernel's IOPub
# socket, which ipykernel (6 and 7) wraps in a thread-safe background socket: a message sent from
# any thread is queued to its IO thread and leaves at once, while the cell still runs. It carries
# the running request as parent (ipykernel 7 falls back to the shell's context for a thread
# started outside it), and JupyterLab routes a comm message by its comm id, not its parent. The
# browser's messages to us (a ``hello``) go on a subshell where the kernel has them (ipykernel 7,
# JupyterLab 4.4+), else wait for the cell to end: either way the browser never waits on a busy
# kernel for the samples. ``tests/notebook/test_lab_kernel.py`` checks it on a real kernel.
