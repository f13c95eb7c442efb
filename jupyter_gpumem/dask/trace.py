"""``cluster_trace``: record a block of code on every worker of a cluster, then explain it per
worker (what ``%%gpumem_trace --cluster`` shows).

::

    with cluster_trace(client) as t:
        x = da.random.random((40_000, 40_000), chunks=4_000).sum().compute()
    t                      # per worker: timeline, top tasks and lines at its peak, survivors

History starts afresh on every worker (``start_trace``) and is gathered at the end
(``ClusterTrace.stop``); each worker is one device of the merged snapshot, analysed on its own
by ``render.trace_result.analyze``. A worker that died or left meanwhile has no result: the
result says so in one line per worker and holds the others.
"""

from __future__ import annotations

import html
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from jupyter_gpumem.dask.gather import DEFAULT_TIMEOUT, PartialResultWarning, start_trace
from jupyter_gpumem.dask.plugin import check_flag, check_max_entries
from jupyter_gpumem.dask.tasks import TaskUse, top_tasks
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.units import check_seconds, format_bytes
from jupyter_gpumem.render.display import png_data
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.render.trace_result import TraceResult, analyze

__all__ = ["ClusterTraceResult", "WorkerTrace", "cluster_trace", "worker_heading"]


@dataclass
class WorkerTrace:
    """One worker's part of a cluster trace."""

    worker: str  # its address
    gpu: dict[str, Any]  # gpu_info of the worker (name, index, host, ...)
    result: TraceResult  # its timeline, layouts, top lines and survivors
    top_tasks: list[TaskUse]  # tasks (by prefix) holding bytes at its peak


def worker_heading(worker: str, gpu: Mapping[str, Any]) -> str:
    """``worker tcp://...: NVIDIA H200 (GPU 0, CUDA_VISIBLE_DEVICES=0)``."""
    visible = gpu.get("cuda_visible_devices")
    where = f"GPU {gpu.get('index', '?')}" + (
        f", CUDA_VISIBLE_DEVICES={str(visible).split(',')[0]}" if visible else "")
    return f"worker {worker}: {gpu.get('name', 'unknown GPU')} ({where})"


@dataclass(eq=False, repr=False)
class ClusterTraceResult:
    """What a block of code did to the memory of every worker. Plain data plus displays."""

    snapshot: Snapshot  # the merged snapshot: a device per worker
    workers: list[WorkerTrace]
    errors: dict[str, str] = field(default_factory=dict)  # missing workers, and why
    title: str = ""
    wall_s: float = 0.0
    error: BaseException | None = None

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, errors: Mapping[str, str] | None = None,
                      title: str = "", wall_s: float = 0.0, error: BaseException | None = None,
                      cell_files: Mapping[str, int] | None = None,
                      plot: bool = True) -> ClusterTraceResult:
        """Analyse each worker (device) of a merged cluster snapshot on its own."""
        info = snapshot.get("jupyter_gpumem") or {}
        workers: Mapping[str, int] = info.get("workers") or {}  # type: ignore[assignment]
        devices: Mapping[str, Any] = info.get("devices") or {}  # type: ignore[assignment]
        recorded: Any = info.get("missing_workers") or {}
        missing = dict(errors if errors is not None else recorded)
        out = []
        for addr, k in sorted(workers.items(), key=lambda item: item[1]):
            gpu = dict((devices.get(str(k)) or {}).get("gpu") or {})
            result = analyze(snapshot, device=k, cell_files=cell_files, wall_s=wall_s,
                             error=error, title=worker_heading(addr, gpu))
            result.picture = plot
            result.history_on = True
            tasks = (top_tasks(snapshot, k, index=result.peak_index)
                     if result.peak_index >= 0 else [])
            out.append(WorkerTrace(addr, gpu, result, tasks))
        return cls(snapshot, out, missing, title, wall_s, error)

    # -- text --------------------------------------------------------------------------------

    def missing_lines(self) -> list[str]:
        """One line per worker with no result."""
        return [f"worker {addr}: no result (it died or left during the trace: {why})"
                for addr, why in self.errors.items()]

    def headline(self) -> str:
        what = self.title or "trace"
        missing = f", {len(self.errors)} missing" if self.errors else ""
        failed = f" · raised {type(self.error).__name__}" if self.error is not None else ""
        return (f"gpumem cluster {what}: {len(self.workers)} worker(s){missing} in "
                f"{self.wall_s:.3f} s{failed}")

    def _tasks_table(self, one: WorkerTrace) -> Table:
        return Table(("bytes", "blocks", "task"),
                     [(format_bytes(u.bytes), f"{u.count}×", u.task) for u in one.top_tasks],
                     ">>")

    def text(self) -> str:
        lines = [self.headline(), *self.missing_lines()]
        for one in self.workers:
            lines.append("")
            lines.append(f"== {one.result.title} ==")
            lines.append(one.result.text())
            if one.top_tasks:
                lines.append("Top tasks at the peak:")
                lines.append(self._tasks_table(one).text(indent="  ", header=False))
        return "\n".join(lines)

    summary = text

    def __repr__(self) -> str:
        return (f"<ClusterTraceResult {len(self.workers)} workers, "
                f"{len(self.errors)} missing>")

    def html(self) -> str:
        parts = [f"<p><b>{html.escape(self.headline())}</b></p>"]
        parts += [f"<p>{html.escape(line)}</p>" for line in self.missing_lines()]
        for one in self.workers:
            parts.append(f"<h4>{html.escape(one.result.title)}</h4>")
            parts.append(one.result.html())
            if one.top_tasks:
                parts.append("<p>Top tasks at the peak</p>" + self._tasks_table(one).html())
        return "\n".join(parts)

    def png(self) -> bytes | None:
        """The picture of the worker whose allocated bytes peaked highest: the html shows each
        worker's, and a bundle has one ``image/png`` (Note [Static fallbacks] in
        ``render.display``). None where no worker has one."""
        drawn = [(w.result.peak_allocated, -i, w.result) for i, w in enumerate(self.workers)
                 if w.result.shown_png() is not None]
        return max(drawn, key=lambda d: d[:2])[2].shown_png() if drawn else None

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.text(), "text/html": self.html(), **png_data(self.png())}

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the merged snapshot: ``.gpumem`` (ours), ``.html`` (a page), ``.pickle``/
        ``.json`` (``.gz``)."""
        from jupyter_gpumem.data.files import SAVE_FORMATS, save_format, save_snapshot

        p = os.fspath(path)
        kind = save_format(p)
        if kind == "html":
            from jupyter_gpumem.render.html import save_html

            return save_html(self.snapshot, p, title=self.title or "cluster trace")
        if kind is not None:
            return save_snapshot(self.snapshot, p)
        raise ValueError(f"cannot tell the format of {p!r}: use {SAVE_FORMATS}")


class cluster_trace:  # used like a function: ``with cluster_trace(client) as t``
    """Record history on every worker of ``client`` for a ``with`` block; ``result`` (and the
    ``as`` target, filled in at the end) is a ``ClusterTraceResult``. An exception in the block
    still fills the result, then propagates. Entering and leaving each wait for the workers at
    most ``2 * timeout`` and ``4 * timeout`` seconds (Note [The gather bound])."""

    def __init__(self, client: Any, *, stacks: bool = True, max_entries: int = 1_000_000,
                 timeout: float = DEFAULT_TIMEOUT, plot: bool = True, title: str = "",
                 cell_files: Mapping[str, int] | None = None, save: str | None = None) -> None:
        self.client = client
        self.stacks = check_flag("stacks", stacks)
        self.max_entries = check_max_entries("max_entries", max_entries)
        self.timeout = check_seconds("timeout", timeout)
        self.plot = plot
        self.title = title
        self.cell_files = cell_files
        self.save = save
        self.result: ClusterTraceResult | None = None
        self._placeholder = ClusterTraceResult({"segments": [], "device_traces": []}, [])

    def __enter__(self) -> ClusterTraceResult:
        self._trace = start_trace(self.client, max_entries=self.max_entries, stacks=self.stacks,
                                  timeout=self.timeout)
        self._t0 = time.perf_counter()
        return self._placeholder

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        wall = time.perf_counter() - self._t0
        with warnings.catch_warnings():  # the result names the missing workers itself
            warnings.simplefilter("ignore", PartialResultWarning)
            snap = self._trace.stop()
        result = ClusterTraceResult.from_snapshot(
            snap, errors=self._trace.errors, title=self.title, wall_s=wall, error=exc,
            cell_files=self.cell_files, plot=self.plot)
        self._placeholder.__dict__.update(vars(result))
        self.result = self._placeholder
        if self.save:
            result.save(self.save)
