"""``jupyter_gpumem.trace()``: record one block of code, then explain what it did to memory.

``%%gpumem_trace`` is a thin shell over this context manager::

    with jupyter_gpumem.trace() as t:
        x = cupy.ones((1 << 28,), cupy.float32)
    t                      # timeline, layouts at the peak and at the end, sites, survivors

The result (``TraceResult``) is computed from plain data only: a snapshot holding the segments at
the end and the trace events of the block. Its parts:

- the allocated/reserved timeline of the block's events;
- the block layout at the peak (rebuilt with ``replay_segments``) and at the end;
- the top allocation sites by bytes live at the peak (``file:line`` or ``cell [N] line L``);
- the blocks that survive the block, with their allocating line and the variables holding them.

Holders: a variable holds a block when it is a CuPy array (anything with ``.data.ptr`` and
``.nbytes``) whose bytes fall in the block. On the simulated device addresses are plain ints, so
an int that equals a live block's address also counts as holding it. Lists, tuples and dicts are
looked into one level deep (``xs[3]``, ``d['w']``).
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import html
import importlib
import io
import json
import pickle
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from ._ledger import site_of
from ._replay import replay_segments
from ._units import format_bytes

if TYPE_CHECKING:
    from ._allocator import CachingAllocator
    from ._schema import SegmentInfo, Snapshot, TraceEntry

__all__ = ["SiteUse", "SurvivingBlock", "TraceResult", "analyze", "find_holders", "trace"]

#: Elements of one list/tuple/dict looked at when searching for holders.
MAX_CONTAINER_ITEMS = 1000


def optional_module(name: str) -> Any | None:
    """A sibling module that may not exist yet (another part of the product), or None."""
    try:
        return importlib.import_module(f"jupyter_gpumem.{name}")
    except ImportError:
        return None


# -- holders ---------------------------------------------------------------------------------------

def _pointer_range(obj: Any) -> tuple[int, int] | None:
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return (obj, 0) if obj > 0 else None
    data = getattr(type(obj), "data", None)  # avoid triggering properties on arbitrary objects
    if data is None or not hasattr(obj, "nbytes"):
        return None
    try:
        ptr = int(obj.data.ptr)
        nbytes = int(obj.nbytes)
    except Exception:
        return None
    return (ptr, nbytes) if ptr else None


def find_holders(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]]
                 ) -> dict[int, list[str]]:
    """Which names of ``namespace`` hold each block ``(address, size)``: address -> names.

    See the module docstring for what counts as holding a block."""
    if not blocks:
        return {}
    ordered = sorted(blocks)
    starts = [a for a, _ in ordered]
    exact = {a for a, _ in ordered}
    out: dict[int, list[str]] = {}

    def match(name: str, obj: Any) -> None:
        rng = _pointer_range(obj)
        if rng is None:
            return
        ptr, nbytes = rng
        if isinstance(obj, int):
            if ptr in exact:
                out.setdefault(ptr, []).append(name)
            return
        i = bisect.bisect_right(starts, ptr) - 1
        if i >= 0:
            addr, size = ordered[i]
            if addr <= ptr and ptr + max(nbytes, 1) <= addr + size:
                names = out.setdefault(addr, [])
                if name not in names:
                    names.append(name)

    for name, value in list(namespace.items()):
        if name.startswith("_") or isinstance(value, type):
            continue
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value[:MAX_CONTAINER_ITEMS]):
                match(f"{name}[{i}]", item)
        elif isinstance(value, dict):
            for k, item in list(value.items())[:MAX_CONTAINER_ITEMS]:
                match(f"{name}[{k!r}]", item)
        else:
            match(name, value)
    return out


# -- analysis --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SiteUse:
    """Bytes and blocks live at the peak that one line allocated."""

    site: str
    bytes: int
    count: int


@dataclass(frozen=True)
class SurvivingBlock:
    """A block allocated inside the traced code and still live at its end."""

    address: int
    size: int
    requested: int
    site: str | None
    holders: tuple[str, ...] = ()


def _curves(trace: Sequence[TraceEntry], end_allocated: int, end_reserved: int
            ) -> tuple[list[int], list[int], int, int]:
    has_requested = any(e["action"] == "free_requested" for e in trace)
    free_action = "free_requested" if has_requested else "free_completed"
    d_alloc: list[int] = []
    d_res: list[int] = []
    for e in trace:
        action = e["action"]
        size = e.get("block_size") or max(512, (e["size"] + 511) // 512 * 512)
        d_alloc.append(size if action == "alloc" else -size if action == free_action else 0)
        d_res.append(e["size"] if action == "segment_alloc"
                     else -e["size"] if action == "segment_free" else 0)
    start_a = end_allocated - sum(d_alloc)
    start_r = end_reserved - sum(d_res)
    allocated: list[int] = []
    reserved: list[int] = []
    a, r = start_a, start_r
    for da, dr in zip(d_alloc, d_res, strict=True):
        a += da
        r += dr
        allocated.append(a)
        reserved.append(r)
    return allocated, reserved, start_a, start_r


def _totals(segments: Sequence[SegmentInfo]) -> tuple[int, int]:
    allocated = sum(b["size"] for s in segments for b in s["blocks"]
                    if b["state"] == "active_allocated")
    return allocated, sum(s["total_size"] for s in segments)


def analyze(snapshot: Snapshot, *, device: int = 0, namespace: Mapping[str, Any] | None = None,
            cell_files: Mapping[str, int] | None = None, top: int = 10,
            wall_s: float = 0.0, error: BaseException | None = None,
            cell: int | None = None) -> TraceResult:
    """Everything ``TraceResult`` shows, from a snapshot whose trace is the traced code's."""
    traces = snapshot["device_traces"]
    trace = traces[device] if device < len(traces) else []
    end_segments = [s for s in snapshot["segments"] if s["device"] == device]
    end_allocated, end_reserved = _totals(end_segments)
    allocated, reserved, start_a, start_r = _curves(trace, end_allocated, end_reserved)
    peak_value = max([start_a, *allocated])
    peak_index = -1 if peak_value == start_a else allocated.index(peak_value)
    layout_peak = replay_segments(snapshot, peak_index + 1, device)

    groups: dict[str, list[int]] = {}
    for seg in layout_peak:
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            site = site_of(b["frames"], cell_files) or "(before the trace, or no stack)"
            g = groups.setdefault(site, [0, 0])
            g[0] += b["size"]
            g[1] += 1
    sites = sorted((SiteUse(s, n, k) for s, (n, k) in groups.items()),
                   key=lambda u: (-u.bytes, u.site))[:top]

    born: set[int] = set()
    for e in trace:
        if e["action"] == "alloc":
            born.add(e["addr"])
        elif e["action"] == "free_completed":
            born.discard(e["addr"])
    survivors = [b for s in end_segments for b in s["blocks"]
                 if b["state"] == "active_allocated" and b["address"] in born]
    holders = find_holders(namespace or {}, [(b["address"], b["size"]) for b in survivors])
    surviving = [SurvivingBlock(b["address"], b["size"], b["requested_size"],
                                site_of(b["frames"], cell_files),
                                tuple(holders.get(b["address"], ())))
                 for b in sorted(survivors, key=lambda b: (-b["size"], b["address"]))]
    return TraceResult(snapshot=snapshot, device=device, allocated=allocated, reserved=reserved,
                       start_allocated=start_a, start_reserved=start_r,
                       peak_allocated=peak_value, peak_index=peak_index,
                       layout_peak=layout_peak, layout_end=end_segments, top_sites=sites,
                       surviving=surviving, wall_s=wall_s, error=error, cell=cell)


# -- the result ------------------------------------------------------------------------------------

@dataclass(eq=False)
class TraceResult:
    """What one traced block of code did to memory. Plain data plus its displays."""

    snapshot: Snapshot  # segments at the end; the trace holds only the traced code's events
    device: int
    allocated: list[int]  # allocated bytes after each event
    reserved: list[int]  # reserved bytes after each event
    start_allocated: int
    start_reserved: int
    peak_allocated: int  # the highest allocated bytes during the traced code
    peak_index: int  # the event after which the peak was reached; -1: at the start
    layout_peak: list[SegmentInfo]
    layout_end: list[SegmentInfo]
    top_sites: list[SiteUse]
    surviving: list[SurvivingBlock]
    wall_s: float = 0.0
    error: BaseException | None = None
    cell: int | None = None
    plot: bool = True  # whether the display includes the PNG picture
    _png: bytes | None = field(default=None, repr=False)

    @classmethod
    def empty(cls) -> TraceResult:
        """A result with nothing in it: what ``with trace() as t`` binds until the block ends."""
        return cls(snapshot={"segments": [], "device_traces": []}, device=0, allocated=[],
                   reserved=[], start_allocated=0, start_reserved=0, peak_allocated=0,
                   peak_index=-1, layout_peak=[], layout_end=[], top_sites=[], surviving=[])

    @property
    def events(self) -> int:
        return len(self.allocated)

    @property
    def end_allocated(self) -> int:
        return self.allocated[-1] if self.allocated else self.start_allocated

    @property
    def end_reserved(self) -> int:
        return self.reserved[-1] if self.reserved else self.start_reserved

    # -- text --------------------------------------------------------------------------------

    def headline(self) -> str:
        where = f"cell [{self.cell}]" if self.cell is not None else "trace"
        failed = f" · raised {type(self.error).__name__}" if self.error is not None else ""
        return (
            f"gpumem {where}: {self.events} events in {self.wall_s:.3f} s · "
            f"peak {format_bytes(self.peak_allocated)} "
            f"({_signed(self.peak_allocated - self.start_allocated)} over the start) · "
            f"Δallocated {_signed(self.end_allocated - self.start_allocated)} · "
            f"reserved {format_bytes(self.end_reserved)} "
            f"({_signed(self.end_reserved - self.start_reserved)}){failed}"
        )

    def text(self) -> str:
        lines = [self.headline()]
        if self.top_sites:
            lines.append("Top allocation sites at the peak:")
            lines += [f"  {format_bytes(u.bytes):>10}  {u.count:>4}×  {u.site}"
                      for u in self.top_sites]
        if self.surviving:
            lines.append("Blocks surviving the traced code:")
            for b in self.surviving:
                held = f"  ← {', '.join(b.holders)}" if b.holders else ""
                lines.append(f"  {b.address:#x}  {format_bytes(b.size):>10}  "
                             f"{b.site or '(no stack)'}{held}")
        else:
            lines.append("No block allocated by the traced code survives it.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<TraceResult {self.headline()}>"

    def html(self) -> str:
        parts = [f"<p><b>{html.escape(self.headline())}</b></p>"]
        if self.top_sites:
            rows = "".join(f"<tr><td>{html.escape(u.site)}</td><td>{format_bytes(u.bytes)}</td>"
                           f"<td>{u.count}</td></tr>" for u in self.top_sites)
            parts.append("<p>Top allocation sites at the peak</p><table><thead><tr><th>line</th>"
                         f"<th>bytes</th><th>blocks</th></tr></thead><tbody>{rows}</tbody></table>")
        if self.surviving:
            rows = "".join(
                f"<tr><td>{b.address:#x}</td><td>{format_bytes(b.size)}</td>"
                f"<td>{html.escape(b.site or '(no stack)')}</td>"
                f"<td>{html.escape(', '.join(b.holders))}</td></tr>" for b in self.surviving)
            parts.append("<p>Blocks surviving the traced code</p><table><thead><tr>"
                         "<th>address</th><th>size</th><th>allocated at</th><th>held by</th>"
                         f"</tr></thead><tbody>{rows}</tbody></table>")
        png = self.png() if self.plot else None
        if png is not None:
            parts.append(f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"/>')
        return "\n".join(parts)

    # -- pictures ----------------------------------------------------------------------------

    def figure(self) -> Any:
        """A matplotlib Figure: the timeline, the layout at the peak and at the end."""
        plots = optional_module("_plots")
        if plots is None:
            raise ImportError("jupyter_gpumem's plots are not available")
        from matplotlib.figure import Figure

        rows = max(len(self.layout_peak), len(self.layout_end), 1)
        layout_h = min(1.2 + 0.3 * rows, 6.0)
        fig = Figure(figsize=(11, 4.0 + 2 * layout_h), layout="constrained")
        axes = fig.subplots(3, 1, height_ratios=[4.0, layout_h, layout_h])
        plots.plot_timeline(self.snapshot, ax=axes[0], color_by="site", device=self.device)
        plots.plot_segments(self.layout_peak, ax=axes[1])
        axes[1].set_title("block layout at the peak")
        plots.plot_segments(self.layout_end, ax=axes[2])
        axes[2].set_title("block layout at the end")
        return fig

    def png(self) -> bytes | None:
        """The figure as PNG bytes; None when matplotlib or the plots are unavailable."""
        if self._png is None:
            try:
                fig = self.figure()
            except ImportError:
                return None
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=80)
            self._png = buf.getvalue()
        return self._png

    def view(self) -> Any | None:
        """The shared display object (``_display.TraceResult``) for this trace, holders filled
        in: it carries the data for the JupyterLab renderer. None where it is unavailable."""
        display = optional_module("_display")
        if display is None or not hasattr(display, "TraceResult") or not self.snapshot["segments"]:
            return None
        holders = {b.address: list(b.holders) for b in self.surviving if b.holders}
        title = f"cell [{self.cell}]" if self.cell is not None else ""
        try:
            return display.TraceResult(self.snapshot, title=title, device=self.device,
                                       holders=holders)
        except TypeError:  # a different signature: do without it
            return None

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self.text(), "text/html": self.html()}
        png = self.png() if self.plot else None
        if png is not None:
            bundle["image/png"] = png
        view = self.view()
        mime = getattr(optional_module("_display"), "MIME_TYPE", None)
        if view is not None and isinstance(mime, str) and hasattr(view, "to_json"):
            bundle[mime] = view.to_json()
        return bundle

    # -- saving ------------------------------------------------------------------------------

    def save(self, path: str) -> str:
        """Write the trace: ``.html`` (self-contained), ``.pickle``/``.pkl`` (PyTorch's memory
        viewer reads it) or ``.json``. Returns the path."""
        lower = path.lower()
        io_module = optional_module("_io")
        if lower.endswith((".html", ".htm")):
            exporter = optional_module("_html")
            if exporter is not None and hasattr(exporter, "save_html"):
                exporter.save_html(self.snapshot, path)
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write("<!doctype html><meta charset='utf-8'><title>gpumem trace</title>"
                            f"<body>{self.html()}<pre>{html.escape(self.text())}</pre></body>")
        elif io_module is not None and hasattr(io_module, "save_snapshot") and lower.endswith(
                (".pickle", ".pkl", ".json")):
            io_module.save_snapshot(self.snapshot, path)
        elif lower.endswith((".pickle", ".pkl")):
            with open(path, "wb") as f:
                pickle.dump(self.snapshot, f, protocol=4)
        elif lower.endswith(".json"):
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.snapshot, f)
        else:
            raise ValueError(f"cannot tell the format of {path!r}: use .html, .pickle or .json")
        return path


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + format_bytes(n)


# -- the context manager ---------------------------------------------------------------------------

class trace:  # used like a function: ``with trace() as t``
    """Record the allocations of a ``with`` block; the ``as`` target is filled in at its end.

    History is switched on (with ``stacks``) for the block and put back as it was afterwards.
    ``namespace`` is where to look for the variables holding surviving blocks (default: the
    caller's globals and locals). ``live`` shows the live widget while the block runs, where
    it is available. An exception in the block still fills the result, then propagates.
    """

    def __init__(self, *, stacks: bool = True, max_entries: int = 1_000_000, device: Any = None,
                 namespace: Mapping[str, Any] | None = None, save: str | None = None,
                 plot: bool = True, live: bool = False, cell: int | None = None,
                 cell_files: Mapping[str, int] | None = None) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.stacks = stacks
        self.max_entries = max_entries
        self.device = device
        self.namespace = namespace
        self.save = save
        self.plot = plot
        self.live = live
        self.cell = cell
        self.cell_files = cell_files
        self.result: TraceResult | None = None
        self._frame: FrameType | None = sys._getframe(1) if namespace is None else None
        self._placeholder = TraceResult.empty()

    def __enter__(self) -> TraceResult:
        from . import _runtime

        self._allocator: CachingAllocator = _runtime.get_allocator(self.device)
        a = self._allocator
        h = a.history
        self._previous = None if h is None else (h.stacks, h.max_entries)
        a.record_history(True, stacks=self.stacks, max_entries=self.max_entries)
        history = a.history
        assert history is not None
        self._start = history.recorded
        self._watermark = a.start_watermark("trace")
        self._session = self._start_live(a) if self.live else None
        self._t0 = time.perf_counter()
        return self._placeholder

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        wall = time.perf_counter() - self._t0
        a = self._allocator
        a.stop_watermark(self._watermark)
        history = a.history
        assert history is not None
        dropped = history.dropped
        snap = a.snapshot()
        if self._previous is None:
            a.record_history(False)
        else:
            stacks, entries = self._previous
            a.record_history(True, stacks=stacks, max_entries=entries)
        index = a.device.index
        full = snap["device_traces"][index]
        first = max(0, self._start - dropped)
        window = [e for e in full[first:] if e["action"] != "snapshot"]
        traces: list[list[TraceEntry]] = [[] for _ in range(index + 1)]
        traces[index] = window
        info = dict(snap.get("jupyter_gpumem", {}))
        info["history_dropped"] = max(0, dropped - self._start)
        trace_snapshot: Snapshot = {"segments": snap["segments"], "device_traces": traces,
                                    "schema": snap.get("schema", 1), "jupyter_gpumem": info}
        result = analyze(trace_snapshot, device=index, namespace=self._namespace(),
                         cell_files=self.cell_files, wall_s=wall, error=exc, cell=self.cell)
        # The watermark sees every allocation, even ones pushed out of a full history ring.
        result.peak_allocated = max(result.peak_allocated, self._watermark.peak_allocated)
        result.plot = self.plot
        # ``with trace() as t`` bound the placeholder: fill it in place.
        self._placeholder.__dict__.update(vars(result))
        self.result = self._placeholder
        if self._session is not None:
            # The live view is a nicety: never fail the user's code for it.
            with contextlib.suppress(Exception):
                self._session.stop(snapshot=trace_snapshot)
        if self.save:
            result.save(self.save)

    def _namespace(self) -> Mapping[str, Any]:
        if self.namespace is not None:
            return self.namespace
        frame, self._frame = self._frame, None
        if frame is None:
            return {}
        return {**frame.f_globals, **frame.f_locals}

    @staticmethod
    def _start_live(allocator: CachingAllocator) -> Any:
        widget = optional_module("_widget")
        if widget is None or not hasattr(widget, "LiveSession"):
            return None

        def sample() -> tuple[int, int, int | None]:
            free, total = allocator.device.mem_get_info()
            return allocator.memory_allocated(), allocator.memory_reserved(), total - free

        try:
            session = widget.LiveSession(sample, interval_s=0.2)
            session.start()
        except Exception:  # anywidget/ipywidgets missing, or no frontend: no live view
            return None
        return session
