"""``TraceResult``: what one traced block of code did to memory, from plain data only.

``trace()`` and ``%%gpumem_trace`` return one; ``analyze`` builds one from any snapshot whose
trace is the traced code's (``%gpumem load`` uses it on a saved file). Its parts:

- the allocated/reserved timeline of the traced events (``timeline``);
- the block layout at the peak (rebuilt with ``replay_segments``) and at the end;
- the top allocation sites by bytes live at the peak (``file:line`` or ``cell [N] line L``);
- the blocks born in the traced code that survive it, with their allocating line and the
  variables holding them (``holders``).

Its displays: ``text()``, ``html()`` (the tables and ONE PNG figure as ``<img alt>``, the alt
text saying what it shows), the same figure as ``image/png``, and ``to_json()`` (the view
payload, kind trace) under ``MIME_TYPE`` for our JupyterLab renderer (Note [Static fallbacks] in
``display``); ``repr()`` never serialises the trace.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from jupyter_gpumem.data.codes import ALLOC, FREE_COMPLETED
from jupyter_gpumem.data.columns import as_columns
from jupyter_gpumem.data.devices import device_segments, device_trace, snapshot_device
from jupyter_gpumem.data.holders import find_holders
from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.ranking import SiteUse, top_sites
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.sites import saved_cell_files, short_site, site_of, with_cell_files
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.data.units import format_bytes, format_signed_bytes
from jupyter_gpumem.render.display import MIME_TYPE, figure_png, img_tag, layout_alt, png_data
from jupyter_gpumem.render.kernel_views import KERNEL_VIEWS
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.render.view_detail import TraceDetail
from jupyter_gpumem.render.view_payload import (
    BANDS,
    MAX_LIVES,
    TIMELINE_COLUMNS,
    Bands,
    build_view,
    trace_detail,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, SegmentInfo, Snapshot, TraceEntry
    from jupyter_gpumem.data.timeline import Timeline

__all__ = ["SHOWN_SURVIVORS", "SiteUse", "SurvivingBlock", "TraceResult", "analyze",
           "surviving_blocks"]

#: Surviving blocks the text and HTML tables list; the rest are summed up in one line.
SHOWN_SURVIVORS = 20


@dataclass(frozen=True)
class SurvivingBlock:
    """A block allocated inside the traced code and still live at its end."""

    address: int
    size: int
    requested: int  # bytes the user asked for
    site: str | None  # the allocating line, if known
    holders: tuple[str, ...] = ()  # the user variables holding it
    frames: Sequence[Frame] = ()  # the allocating stack, innermost first


# -- analysis --------------------------------------------------------------------------------------

def surviving_blocks(trace: Sequence[TraceEntry], layout_end: Sequence[SegmentInfo],
                     namespace: Mapping[str, Any] | None = None,
                     cell_files: Mapping[str, int] | None = None, *,
                     holders: Mapping[int, Sequence[str]] | None = None
                     ) -> list[SurvivingBlock]:
    """The blocks of ``layout_end`` that ``trace`` allocated, largest first, with holders
    (``holders``: found already, address -> names; else looked up in ``namespace``)."""
    born = _born(trace)
    survivors = [b for s in layout_end for b in s["blocks"]
                 if b["state"] == "active_allocated" and b["address"] in born]
    if holders is None:
        holders = find_holders(namespace or {}, [(b["address"], b["size"]) for b in survivors],
                               cell_files=cell_files)
    return [SurvivingBlock(b["address"], b["size"], b["requested_size"],
                           site_of(b["frames"], cell_files), tuple(holders.get(b["address"], ())),
                           b["frames"])
            for b in sorted(survivors, key=lambda b: (-b["size"], b["address"]))]


def _born(trace: Sequence[TraceEntry]) -> set[int]:
    """The addresses whose last ``alloc`` or ``free_completed`` event in ``trace`` is an
    alloc: the blocks the trace allocated and did not give back (read from its columns)."""
    cols = as_columns(trace)
    codes = cols.column("action")
    picks = np.flatnonzero((codes == ALLOC) | (codes == FREE_COMPLETED))
    addrs = cols.column("addr")[picks][::-1]
    found, last = np.unique(addrs, return_index=True)  # the first of the reversed: the last
    return set(found[codes[picks[::-1][last]] == ALLOC].tolist())


def analyze(snapshot: Snapshot, *, device: int | None = None,
            namespace: Mapping[str, Any] | None = None,
            cell_files: Mapping[str, int] | None = None, top: int = 10,
            wall_s: float = 0.0, error: BaseException | None = None,
            cell: int | None = None, title: str | None = None,
            bands: Bands = "site") -> TraceResult:
    """Everything ``TraceResult`` shows, from a snapshot whose trace is the traced code's.

    ``device`` defaults to ``snapshot_device``; ``title`` to ``"cell [N]"`` for a cell;
    ``bands`` is what the timeline's bands are by (``view_payload.BANDS``)."""
    if bands not in BANDS:
        raise ValueError(f"bands must be one of {BANDS}, got {bands!r}")
    dev = snapshot_device(snapshot, device)
    cell_files = saved_cell_files(snapshot, cell_files)
    snapshot = with_cell_files(snapshot, cell_files)  # a saved copy names its cells too
    tl = build_timeline(snapshot, dev, cell_files=cell_files)
    peak = int(tl.allocated.max()) if len(tl) else tl.start_allocated
    peak_index = -1 if peak <= tl.start_allocated else int(tl.allocated.argmax())
    layout_peak = replay_segments(snapshot, peak_index + 1, dev)
    layout_end = device_segments(snapshot, dev)
    sites = [SiteUse(short_site(u.site), u.bytes, u.count)
             for u in top_sites(tl, live_intervals(tl), peak_index, top)]
    if title is None:
        title = f"cell [{cell}]" if cell is not None else ""
    # The holders of every block live at the end, older than the trace too (the bands by
    # holder name the parameters a training step found allocated); one walk of the namespace.
    live_end = [(b["address"], b["size"]) for s in layout_end for b in s["blocks"]
                if b["state"] == "active_allocated"]
    held = find_holders(namespace or {}, live_end, cell_files=cell_files)
    return TraceResult(snapshot=snapshot, device=dev, timeline=tl,
                       peak_allocated=max(peak, tl.start_allocated), peak_index=peak_index,
                       layout_peak=layout_peak, layout_end=layout_end,
                       top_sites=sites,
                       surviving=surviving_blocks(device_trace(snapshot, dev), layout_end,
                                                  cell_files=cell_files, holders=held),
                       title=title, wall_s=wall_s, error=error, cell=cell, cell_files=cell_files,
                       bands=bands, holders={a: tuple(h) for a, h in held.items()})


def raised_words(error: BaseException) -> str:
    """``ValueError: boom`` on one line, at most 200 characters: what a view of a trace whose
    code raised says about it."""
    text = " ".join(f"{type(error).__name__}: {error}".split()).removesuffix(":")
    return text if len(text) <= 200 else text[:197] + "..."


# -- the result ------------------------------------------------------------------------------------

@dataclass(eq=False, repr=False)
class TraceResult:
    """What one traced block of code did to memory. Plain data plus its displays."""

    snapshot: Snapshot  # segments at the end; the trace holds only the traced code's events
    device: int
    timeline: Timeline  # allocated/reserved after every traced event
    peak_allocated: int  # the highest allocated bytes during the traced code
    peak_index: int  # the event after which the peak was reached; -1: at the start
    layout_peak: list[SegmentInfo]
    layout_end: list[SegmentInfo]
    top_sites: list[SiteUse]
    surviving: list[SurvivingBlock]
    title: str = ""  # "cell [N]" for a traced cell
    wall_s: float = 0.0
    error: BaseException | None = None
    cell: int | None = None
    picture: bool = True  # whether the display includes the PNG picture
    history_on: bool = False  # history recorded every event of the traced code (trace() sets it)
    cell_files: Mapping[str, int] | None = None  # names a cell's frames "cell [N]"
    bands: Bands = "site"  # what the timeline's bands are by: allocating "site" or "holder"
    holders: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # of blocks live at end
    full_trace: str | None = None  # the file ``save`` wrote every event to, that views name
    _png: bytes | None = field(default=None, repr=False)
    _detail: TraceDetail | None = field(default=None, repr=False)

    @classmethod
    def empty(cls) -> TraceResult:
        """A result with nothing in it: what ``with trace() as t`` binds until the block ends."""
        return analyze({"segments": [], "device_traces": []}, device=0)

    @property
    def events(self) -> int:
        return len(self.timeline)

    @property
    def allocated(self) -> Any:
        """Allocated bytes after each event (a numpy array)."""
        return self.timeline.allocated

    @property
    def reserved(self) -> Any:
        """Reserved bytes after each event (a numpy array)."""
        return self.timeline.reserved

    @property
    def start_allocated(self) -> int:
        return self.timeline.start_allocated

    @property
    def start_reserved(self) -> int:
        return self.timeline.start_reserved

    @property
    def end_allocated(self) -> int:
        return int(self.allocated[-1]) if self.events else self.start_allocated

    @property
    def end_reserved(self) -> int:
        return int(self.reserved[-1]) if self.events else self.start_reserved

    def segments_at(self, at: Literal["peak", "end"] | int = "end") -> list[SegmentInfo]:
        """The block layout at the peak, at the end, or after event ``at``."""
        if at == "end":
            return self.layout_end
        if at == "peak":
            return self.layout_peak
        if not isinstance(at, int) or isinstance(at, bool):
            raise ValueError(f"at must be 'peak', 'end' or an event index, got {at!r}")
        return replay_segments(self.snapshot, min(max(at + 1, 0), self.events), self.device)

    # -- text --------------------------------------------------------------------------------

    def headline(self) -> str:
        failed = f" · raised {type(self.error).__name__}" if self.error is not None else ""
        return (
            f"gpumem {self.title or 'trace'}: {self.events} events in {self.wall_s:.3f} s · "
            f"peak {format_bytes(self.peak_allocated)} "
            f"({format_signed_bytes(self.peak_allocated - self.start_allocated)} over the start) · "
            f"Δallocated {format_signed_bytes(self.end_allocated - self.start_allocated)} · "
            f"reserved {format_bytes(self.end_reserved)} "
            f"({format_signed_bytes(self.end_reserved - self.start_reserved)}){failed}"
        )

    def text(self) -> str:
        lines = [self.headline()]
        if self.top_sites:
            lines.append("Top allocation sites at the peak:")
            lines.append(self._sites_table().text(indent="  ", header=False))
        if self.surviving:
            lines.append("Blocks surviving the traced code:")
            lines.append(self._surviving_table(arrows=True).text(indent="  ", header=False))
            if self._more_survivors():
                lines.append(f"  {self._more_survivors()}")
        elif self.events:
            lines.append("No block allocated by the traced code survives it.")
        else:
            lines.append(self.nothing_recorded())
        return "\n".join(lines)

    def nothing_recorded(self) -> str:
        """Why the trace has no event: what happened, not a guess."""
        if self.error is not None:
            return (f"Nothing was recorded: the traced code raised {type(self.error).__name__} "
                    "before allocating anything through jupyter_gpumem.")
        if self.history_on:
            return ("Nothing was recorded: the traced code allocated nothing through "
                    f"jupyter_gpumem on device {self.device}.")
        return "No trace events: history was off when this was recorded."

    summary = text

    def __repr__(self) -> str:
        return (f"<TraceResult {self.events} events, peak {format_bytes(self.peak_allocated)}, "
                f"{len(self.surviving)} surviving blocks>")

    def _sites_table(self) -> Table:
        return Table(("bytes", "blocks", "line"),
                     [(format_bytes(u.bytes), f"{u.count}×", u.site) for u in self.top_sites],
                     ">>")

    def _surviving_table(self, *, arrows: bool) -> Table:
        rows = [(f"{b.address:#x}", format_bytes(b.size), b.site or "(no stack)",
                 ", ".join(b.holders)) for b in self.surviving[:SHOWN_SURVIVORS]]
        if arrows:  # text: the holders after the line, as "← x, y"
            return Table(("address", "size", "allocated at"),
                         [(a, n, f"{s}  ← {h}" if h else s) for a, n, s, h in rows], "<>")
        return Table(("address", "size", "allocated at", "held by"), rows, "<>")

    def _more_survivors(self) -> str:
        """The line that sums up the survivors past the listed ones ("" when none are)."""
        rest = self.surviving[SHOWN_SURVIVORS:]
        if not rest:
            return ""
        return (f"… and {len(rest):,} more blocks, "
                f"{format_bytes(sum(b.size for b in rest))}")

    def html(self) -> str:
        parts = [f"<p><b>{html.escape(self.headline())}</b></p>"]
        if self.top_sites:
            parts.append("<p>Top allocation sites at the peak</p>" + self._sites_table().html())
        if self.surviving:
            parts.append("<p>Blocks surviving the traced code</p>"
                         + self._surviving_table(arrows=False).html())
            if self._more_survivors():
                parts.append(f"<p>{html.escape(self._more_survivors())}</p>")
        if not self.events:
            parts.append(f"<p>{html.escape(self.nothing_recorded())}</p>")
        png = self.shown_png()
        if png is not None:
            parts.append(img_tag(png, self.alt()))
        return "\n".join(parts)

    def shown_png(self) -> bytes | None:
        """The picture the display shows: none with ``picture`` off (``--no-plot``) or nothing
        to draw; else ``png()``."""
        return self.png() if self.picture and (self.events or self.layout_end) else None

    def alt(self) -> str:
        """What the figure shows, in words with its key numbers (the picture's alt text)."""
        if not self.events:
            return f"{self.nothing_recorded()} " + layout_alt(self.layout_end, "at the end")
        what = self.title or "the traced code"
        when = f"after event {self.peak_index}" if self.peak_index >= 0 else "at the start"
        top = (f"; the top site at the peak is {self.top_sites[0].site} with "
               f"{format_bytes(self.top_sites[0].bytes)}" if self.top_sites else "")
        return (f"Memory timeline of {what}: {self.events} allocator events; allocated bytes "
                f"rise from {format_bytes(self.start_allocated)} to a peak of "
                f"{format_bytes(self.peak_allocated)} {when} and end at "
                f"{format_bytes(self.end_allocated)}, reserved ends at "
                f"{format_bytes(self.end_reserved)}{top}. Below it: "
                + layout_alt(self.layout_peak, "at the peak") + " "
                + layout_alt(self.layout_end, "at the end"))

    # -- pictures ----------------------------------------------------------------------------

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """The allocated/reserved timeline on matplotlib axes, sites named as the tables do;
        ``color_by="holder"`` colours the bands by this trace's holders."""
        from jupyter_gpumem.render.plots import plot_timeline

        if "cell_files" not in kwargs:
            kwargs.setdefault("timeline", self.timeline)
        if kwargs.get("color_by") == "holder":
            kwargs.setdefault("holders", self.holders)
        ax = plot_timeline(self.snapshot, ax, device=self.device, **kwargs)
        if not self.events:  # say what happened rather than the generic "no trace" words
            for t in list(ax.texts):
                t.remove()
            ax.text(0.5, 0.5, self.nothing_recorded(), ha="center", va="center",
                    transform=ax.transAxes, color="#666666", wrap=True)
        return ax

    def plot_segments(self, at: Literal["peak", "end"] | int = "end", ax: Any = None) -> Any:
        """The block layout (see ``segments_at``) on matplotlib axes."""
        from jupyter_gpumem.render.plots import plot_segments

        return plot_segments(self.segments_at(at), ax, device_total=self._device_total())

    def figure(self) -> Any:
        """A matplotlib Figure: the timeline, the layout at the peak and at the end.

        Each layout is a subfigure with its own heading above the layout's summary line, so
        constrained layout gives each text its own room."""
        from matplotlib.figure import Figure

        from jupyter_gpumem.render.plots import plot_segments

        rows = max(len(self.layout_peak), len(self.layout_end), 1)
        layout_h = min(1.5 + 0.3 * rows, 6.3)
        fig = Figure(figsize=(11, 4.0 + 2 * layout_h), layout="constrained")
        panels: Any = fig.subfigures(3, 1, height_ratios=[4.0, layout_h, layout_h])
        top, at_peak, at_end = panels
        self.plot(ax=top.subplots(), color_by=self.bands)
        when = f"after event {self.peak_index}" if self.peak_index >= 0 else "the start"
        for sub, layout, heading in (
                (at_peak, self.layout_peak, f"block layout at the peak ({when})"),
                (at_end, self.layout_end, "block layout at the end")):
            sub.suptitle(heading, x=0.005, ha="left", fontsize=10, fontweight="bold")
            plot_segments(layout, ax=sub.subplots(), device_total=self._device_total())
        return fig

    def _device_total(self) -> int:
        """The device's bytes as the snapshot says them (0: unknown)."""
        from jupyter_gpumem.data.devices import device_total

        return device_total(self.snapshot, self.device)

    def png(self) -> bytes | None:
        """The figure as PNG bytes, drawn once; where no event was recorded, the block layout
        at the end alone (a timeline of nothing says nothing). None without matplotlib."""
        if self._png is None:
            try:
                fig = self.figure() if self.events else self.plot_segments("end").figure
            except ImportError:
                return None
            self._png = figure_png(fig)
        return self._png

    # -- data and files ----------------------------------------------------------------------

    def detail(self) -> TraceDetail:
        """What the views of this trace are drawn from at any zoom (worked out once)."""
        if self._detail is None:
            self._detail = trace_detail(self.snapshot, device=self.device,
                                        timeline=self.timeline, cell_files=self.cell_files,
                                        bands=self.bands, surviving=self.surviving,
                                        holders=self.holders)
        return self._detail

    @property
    def coarse(self) -> bool:
        """Whether the saved view leaves events out: more events than its timeline's columns,
        or more lives than it keeps (then a kernel, or the file, has the rest)."""
        return self.events > TIMELINE_COLUMNS or len(self.detail().lives["start"]) > MAX_LIVES

    def to_json(self, *, binary: bool = False) -> dict[str, Any]:
        """The view payload (kind trace) with the tables' data: what the MIME bundle carries
        (base64 columns) and the widget shows (``binary``: bytes columns)."""
        payload = build_view(self.snapshot, kind="trace", device=self.device,
                             title=self.title, sites=self.top_sites,
                             surviving=self.surviving, cell_files=self.cell_files,
                             detail=self.detail(), full_trace=self.full_trace, binary=binary)
        if self.error is not None:  # every view of it says so: the page saved, the renderer
            payload["raised"] = raised_words(self.error)
        return payload

    def _ipython_display_(self) -> None:
        """Shown in IPython: by the first of ``kernel_views.KERNEL_VIEWS`` that takes it (a
        long trace's view that asks the kernel for detail), else as its bundle."""
        for view in list(KERNEL_VIEWS):
            if view(self):
                return
        from IPython import display

        show: Any = display.display
        show(self._repr_mimebundle_(), raw=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self.text(), "text/html": self.html(),
                                  **png_data(self.shown_png())}
        if self.events or self.snapshot["segments"]:
            bundle[MIME_TYPE] = self.to_json()
        return bundle

    def save_html(self, path: str | os.PathLike[str], title: str | None = None) -> str:
        """A self-contained HTML page of the trace. Returns the path."""
        from jupyter_gpumem.render.html import save_html

        title = title or self.title or None
        payload = self.to_json()
        if title is not None:
            payload["title"] = title
        return save_html(self.snapshot, path, title=title, device=self.device,
                         timeline=self.timeline, payload=payload)

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the trace: ``.gpumem`` (ours: columns, compressed), ``.html`` (self-contained),
        ``.pickle``/``.pkl`` (PyTorch's memory viewer reads it) or ``.json``; ``.gz`` on the
        last two compresses. Returns the path."""
        from jupyter_gpumem.data.files import SAVE_FORMATS, save_format, save_snapshot

        p = os.fspath(path)
        kind = save_format(p)
        if kind == "html":
            return self.save_html(p)
        if kind is not None:
            save_snapshot(self.snapshot, p)
            self.full_trace = p  # every event is there: the views name it
            return p
        raise ValueError(f"cannot tell the format of {p!r}: use {SAVE_FORMATS}")
