"""Static pictures with matplotlib: the timeline, the block layout and the per-cell bars.

Pure functions of the plain data. matplotlib is imported inside the functions, and figures are
made with ``matplotlib.figure.Figure`` (never pyplot), so nothing here touches global state.
Every function takes an optional ``ax`` and returns the Axes it drew on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import NO_CELL, NO_SITE, NO_SITE_LABEL
from jupyter_gpumem.data.devices import device_segments, snapshot_device
from jupyter_gpumem.data.devices import device_total as snapshot_total
from jupyter_gpumem.data.holders import HOLDER_BANDS
from jupyter_gpumem.data.intervals import band_values, holder_band_groups, live_intervals
from jupyter_gpumem.data.lod import extreme_points
from jupyter_gpumem.data.mapped import LayoutRow, layout_rows
from jupyter_gpumem.data.ranking import band_groups, key_count
from jupyter_gpumem.data.schema import clean_text
from jupyter_gpumem.data.sites import short_site
from jupyter_gpumem.data.timeline import (
    Timeline,
    build_timeline,
    cell_boundaries,
    oom_indices,
    peak_allocated,
    peak_index,
)
from jupyter_gpumem.data.units import BINARY_UNITS, format_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord, SegmentInfo, Snapshot

Axes = Any  # matplotlib.axes.Axes; matplotlib is imported lazily

#: Colours of block states, and of the bytes lost to rounding inside an allocated block.
STATE_COLORS = {
    "active_allocated": "#1f77b4",
    "active_pending_free": "#ff7f0e",
    "inactive": "#d9d9d9",
}
ROUNDING_COLOR = "#9ecae1"
POOL_COLORS = {"small": "#9467bd", "large": "#2ca02c"}
ALLOCATED_COLOR = "#111111"
RESERVED_COLOR = "#d62728"
OTHER_COLOR = "#bbbbbb"
#: Past this many segments the layout drops per-row labels, block edges and hatching.
MAX_LABELLED_ROWS = 40
#: Edge of the hatching of unmapped ranges (expandable segments).
UNMAPPED_COLOR = "#b0b0b0"
#: Share of an expandable segment's row that marks the rest of its reserved range.
TAIL_FRACTION = 0.12
#: The most characters of a device's name a title shows.
_NAME_WIDTH = 60


def _new_axes(figsize: tuple[float, float]) -> Axes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig.add_subplot()


def _byte_step(span: float, ticks: int = 5) -> int:
    """The step of a byte axis over ``span`` bytes: the smallest power of two giving at most
    ``ticks`` steps, so every tick is a round number of a binary unit (128 MiB, 1.5 GiB)."""
    raw = max(abs(span), 1.0) / ticks
    return 1 << max(0, math.ceil(math.log2(raw)))


def _byte_tick_label(value: float) -> str:
    """``0`` → ``"0"``, 384 MiB → ``"384 MiB"``, 1.25 GiB → ``"1.25 GiB"``: exact, in the
    largest binary unit not above the value, so the number is at least 1."""
    if value == 0:
        return "0"
    name, unit = next(((n, u) for n, u in reversed(BINARY_UNITS) if abs(value) >= u),
                      BINARY_UNITS[0])
    return f"{value / unit:g} {name}"


def _byte_axis(axis: Any, vmax: float) -> None:
    """Ticks at multiples of a power of two bytes (0, 128 MiB, 256 MiB, ... rather than 2e8)."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    axis.set_major_locator(MultipleLocator(_byte_step(vmax)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: _byte_tick_label(v)))


def _event_axis(axis: Any) -> None:
    """Whole events at 1, 2 or 5 times a power of ten: never event 2.5."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 5, 10], integer=True))


def _palette(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# -- timeline -----------------------------------------------------------------------------------

#: Cell boundaries a timeline picture draws at most (evenly picked where there are more).
MAX_CELL_LINES = 200


def plot_timeline(snapshot: Snapshot, ax: Axes | None = None, *,
                  x: Literal["event", "time"] = "event",
                  color_by: Literal["site", "cell", "holder"] = "site", top: int = 8,
                  device: int | None = None, max_points: int = 2000,
                  cell_files: Mapping[str, int] | None = None,
                  timeline: Timeline | None = None,
                  holders: Mapping[int, Sequence[str]] | None = None) -> Axes:
    """Allocated and reserved bytes over the trace, live allocations stacked as bands.

    Bands are coloured by allocating line (``color_by="site"``) or by cell; the ``top`` groups
    with the most bytes live at the peak get their own colour, the rest are "other". With
    ``color_by="holder"`` the bands are ``holders.HOLDER_BANDS`` (``holders``: the names
    holding each block live at the end, address -> names), empty ones left out. Cell
    boundaries are dotted lines, OOMs red crosses, and the peak is annotated. ``cell_files``
    (a cell's source file name -> its number) names sites ``cell [N] line L`` as the tables
    do; ``timeline`` reuses one already built from the same snapshot and device.
    """
    if x not in ("event", "time"):
        raise ValueError(f"x must be 'event' or 'time', got {x!r}")
    if color_by not in ("site", "cell", "holder"):
        raise ValueError(f"color_by must be 'site', 'cell' or 'holder', got {color_by!r}")
    tl = (timeline if timeline is not None
          else build_timeline(snapshot, device, cell_files=cell_files))
    if ax is None:
        ax = _new_axes((11, 4.5))
    n = len(tl)
    if n == 0:
        ax.text(0.5, 0.5, "no trace recorded (turn history on)", ha="center", va="center",
                transform=ax.transAxes, color="#666666")
        ax.set_axis_off()
        return ax

    xs = _XAxis(tl, x)
    ax.set_xlabel(xs.label)
    if x == "event":
        _event_axis(ax.xaxis)
    at = extreme_points(tl, max_points)
    peak = peak_index(tl)
    values, labels, colors = _bands(tl, at, color_by, peak, top, holders)
    keep: list[bool] = np.asarray(values.any(axis=1)).tolist()
    if any(keep):
        polys = ax.stackplot(xs(at), values[keep],
                             labels=[lb for lb, k in zip(labels, keep, strict=True) if k],
                             colors=[c for c, k in zip(colors, keep, strict=True) if k],
                             alpha=0.55, step="post", linewidth=0)
        for poly in polys:
            poly.set_gid("band")
    else:  # segment events only, say: nothing to stack
        ax.text(0.5, 0.5, "no block is allocated in this trace", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, color="#555555", gid="no-bands")

    ax.plot(xs(at), tl.reserved_after(at), drawstyle="steps-post", color=RESERVED_COLOR, lw=1.2,
            ls="--", label="reserved", gid="reserved")
    ax.plot(xs(at), tl.allocated[at], drawstyle="steps-post", color=ALLOCATED_COLOR, lw=1.2,
            label="allocated", gid="allocated")

    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory, offset_copy

    top_tf = blended_transform_factory(ax.transData, ax.transAxes)
    bounds = cell_boundaries(tl)
    if len(bounds) > MAX_CELL_LINES:  # a line a cell is a wall of ink past that, and slow
        picks = np.linspace(0, len(bounds) - 1, MAX_CELL_LINES).round().astype(int)
        bounds = [bounds[i] for i in sorted(set(picks.tolist()))]
    span_x = float(xs(n - 1) - xs(0)) or 1.0
    last_label = -np.inf
    for x_cell, (_, cell) in zip(xs(np.array([i for i, _ in bounds], np.int64)).tolist(), bounds,
                                 strict=True):
        # what axvline draws, without its checks and limits (a trace has hundreds of cells)
        ax.add_artist(Line2D([x_cell, x_cell], [0, 1], transform=top_tf, color="#555555",
                             lw=0.8, ls=":", gid="cell-boundary"))
        if x_cell - last_label >= 0.025 * span_x:  # labels never overlap
            last_label = x_cell
            ax.text(x_cell, 1.0, f" [{cell}]", transform=top_tf, va="bottom", ha="left",
                    fontsize=8, color="#555555", clip_on=False)
    ooms = oom_indices(tl)
    if len(ooms):
        ax.scatter(xs(ooms), tl.allocated[ooms], marker="X", s=60, color=RESERVED_COLOR,
                   zorder=5, label=f"OOM ({len(ooms)})", gid="oom")
    ymax = float(max(tl.reserved_max, peak_allocated(tl), 1))
    x_peak = float(xs(peak))
    right = bool(x_peak > xs(0) + 0.6 * span_x)  # keep the label off the legend
    # One line in the headroom over the highest curve, beside the peak's x: clear of every curve
    # (a reserved step just before a peak used to run under it) and of the cell labels above
    # the axes.
    over_curves = offset_copy(ax.transData, ax.figure, x=-8 if right else 8, y=4, units="points")
    ax.annotate(f"peak {format_bytes(int(tl.allocated[peak]))} · event {peak}",
                xy=(x_peak, tl.allocated[peak]), xytext=(x_peak, ymax),
                ha="right" if right else "left",
                textcoords=over_curves, fontsize=8, va="bottom",
                arrowprops={"arrowstyle": "-", "color": "#333333", "lw": 0.8},
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#999999", "lw": 0.5},
                gid="peak")
    ax.plot([x_peak], [tl.allocated[peak]], "o", color=ALLOCATED_COLOR, ms=4)
    ax.set_xlim(xs(0), xs(n - 1) if n > 1 else xs(0) + 1)
    ax.set_ylim(0, ymax * 1.12)
    _byte_axis(ax.yaxis, ymax)
    ax.set_ylabel("GPU memory")
    ax.grid(axis="y", color="#eeeeee", lw=0.6)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    name = (snapshot.get("jupyter_gpumem") or {}).get("device_name")
    name = clean_text(str(name), _NAME_WIDTH) if name else None
    ax.set_title(f"{name + ' · ' if name else ''}{n:,} events · peak "
                 f"{format_bytes(int(tl.allocated[peak]))} allocated, "
                 f"{format_bytes(tl.reserved_max)} reserved", fontsize=10, loc="left",
                 pad=14 if bounds else 6)
    return ax


class _XAxis:
    """The x of events on a timeline picture: the event itself, or its time since the first
    (``xs(events)``; worked out for the events drawn only, never for the whole trace)."""

    def __init__(self, tl: Timeline, x: str) -> None:
        self._time = tl.time_us if x == "time" else None
        self.scale, self.label = 1.0, "event"
        if self._time is not None:
            span = int(self._time[-1] - self._time[0])
            unit, self.scale = (("s", 1e6) if span >= 10**6 else ("ms", 1e3) if span >= 10**3
                                else ("µs", 1.0))
            self.label = f"time since the first event ({unit})"

    def __call__(self, events: Any) -> Any:
        if self._time is None:
            return np.asarray(events, np.float64)
        return (self._time[events] - self._time[0]) / self.scale


def _bands(tl: Timeline, at: npt.NDArray[np.int64], color_by: str, peak: int, top: int,
           holders: Mapping[int, Sequence[str]] | None
           ) -> tuple[npt.NDArray[np.int64], list[str], list[Any]]:
    """The bytes of each band after the events ``at``, the bands' labels and colours."""
    n = len(tl)
    iv = live_intervals(tl)
    if color_by == "holder":
        labels = list(HOLDER_BANDS)
        values = band_values(iv, holder_band_groups(iv, n, holders or {}), len(labels), n, at)
        return values, labels, [*_palette(len(labels) - 1), OTHER_COLOR]  # the freed in grey
    keys = None if color_by == "site" else iv.cell  # (None: the sites)
    missing = NO_SITE if color_by == "site" else NO_CELL
    chosen, groups = band_groups(iv, peak, top, keys, missing)
    values = band_values(iv, groups, len(chosen) + 1, n, at)
    if color_by == "site":
        labels = [short_site(tl.sites[s]) for s in chosen]
    else:
        labels = [f"cell [{c}]" for c in chosen]
    every = key_count(iv, peak, keys)
    labels.append("other" if every > len(chosen) else NO_SITE_LABEL)
    return values, labels, [*_palette(len(chosen)), OTHER_COLOR]


# -- block layout -------------------------------------------------------------------------------


def plot_samples(samples: Any, ax: Axes | None = None) -> Axes:
    """A live view's sampled series (rows ``t_s, allocated, reserved, device_used``, an array
    or row tuples) on matplotlib axes: allocated and reserved bytes over seconds."""
    from jupyter_gpumem.render.view_payload import samples_array

    data = samples_array(samples)
    if ax is None:
        ax = _new_axes((9, 3.2))
    if not len(data):
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes,
                color="#666666")
        return ax
    t, allocated, reserved = data[:, 0], data[:, 1], data[:, 2]
    ax.fill_between(t, allocated, step="post", color=ROUNDING_COLOR, alpha=0.6, lw=0)
    ax.step(t, allocated, where="post", color=ALLOCATED_COLOR, lw=1.2, label="allocated")
    ax.step(t, reserved, where="post", color=RESERVED_COLOR, lw=1.2, label="reserved")
    top = float(max(reserved.max(), allocated.max(), 1.0))
    ax.set_ylim(0, top * 1.08)
    _byte_axis(ax.yaxis, top)
    ax.set_xlabel("seconds")
    ax.set_ylabel("bytes")
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    return ax


def _segments_of(data: Snapshot | Sequence[SegmentInfo],
                 device: int | None) -> list[SegmentInfo]:
    if isinstance(data, Mapping):
        return device_segments(data, snapshot_device(data, device))
    segments = list(data)
    if device is not None:
        segments = [s for s in segments if s.get("device", device) == device]
    return segments


def _rects(x0: np.ndarray, x1: np.ndarray, y: np.ndarray, h: float) -> Any:
    verts = np.empty((len(x0), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = x0
    verts[:, 2, 0] = verts[:, 3, 0] = x1
    verts[:, 0, 1] = verts[:, 3, 1] = y - h / 2
    verts[:, 1, 1] = verts[:, 2, 1] = y + h / 2
    return verts


def plot_segments(data: Snapshot | Sequence[SegmentInfo], ax: Axes | None = None, *,
                  device: int | None = None, max_labels: int = MAX_LABELLED_ROWS,
                  device_total: int | None = None) -> Axes:
    """One row per segment, its blocks drawn to scale across the row, coloured by state.

    The hatched lighter part of an allocated block is the bytes lost to rounding (block size
    minus requested size). A strip on the left of each row gives the pool (small/large); labels
    name pool, stream and size while there are at most ``max_labels`` rows.

    An expandable segment is one row (``data.mapped.layout_rows``): its mapped ranges with
    their blocks, the unmapped stretches between them hatched, to scale from its lowest mapped
    address to its highest mapped end; the rest of the range it reserves (known from a
    snapshot of ours: the device's size, or ``device_total``) is a hatched mark at the row's
    end, not to scale.
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    segments = _segments_of(data, device)
    total_bytes = device_total or (
        snapshot_total(data, snapshot_device(data, device)) if isinstance(data, Mapping) else 0)
    layout = layout_rows(segments, total_bytes)
    rows = len(layout)
    if ax is None:
        ax = _new_axes((11, min(1.6 + 0.32 * rows, 11.0)))
    if rows == 0:
        ax.text(0.5, 0.5, "no segments", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax

    x0s, x1s, ys, states, w0s, w1s, wys = [], [], [], [], [], [], []
    u0s, u1s, uys = [], [], []  # unmapped stretches
    tails: list[int] = []  # rows with a mark for the rest of their reserved range
    for row, r in enumerate(layout):
        rest = r.range - r.span if r.expandable and r.range > r.span else 0
        width = 1.0 - TAIL_FRACTION if rest else 1.0
        total = (r.span or 1) / width
        for seg in r.parts:
            cursor = seg["address"]
            for b in seg["blocks"]:
                addr = b.get("address", cursor)
                start = (addr - r.address) / total
                end = (addr + b["size"] - r.address) / total
                cursor = addr + b["size"]
                x0s.append(start)
                x1s.append(end)
                ys.append(row)
                states.append(b["state"])
                if b["state"] != "inactive" and b["size"] > b["requested_size"] > 0:
                    w0s.append((addr + b["requested_size"] - r.address) / total)
                    w1s.append(end)
                    wys.append(row)
        for addr, size in r.unmapped():
            u0s.append((addr - r.address) / total)
            u1s.append((addr + size - r.address) / total)
            uys.append(row)
        if rest:
            tails.append(row)
            u0s.append(width)
            u1s.append(1.0)
            uys.append(row)
    labelled = rows <= max_labels
    # Thin rows touch each other: a gap under a pixel high would only draw moiré.
    height = 0.7 if labelled else 1.0
    edge: dict[str, Any] = ({"edgecolors": "white", "linewidths": 0.6} if labelled
                            else {"linewidths": 0, "antialiaseds": False})
    blocks = PolyCollection(_rects(np.array(x0s), np.array(x1s), np.array(ys, float), height),
                            facecolors=[STATE_COLORS.get(s, "#000000") for s in states],
                            gid="blocks", **edge)
    ax.add_collection(blocks)
    if w0s:
        rounding = PolyCollection(
            _rects(np.array(w0s), np.array(w1s), np.array(wys, float), height),
            facecolors=ROUNDING_COLOR, hatch="////" if labelled else None,
            edgecolors="white" if labelled else "none", linewidths=0, gid="rounding")
        ax.add_collection(rounding)
    if u0s:
        unmapped = PolyCollection(
            _rects(np.array(u0s), np.array(u1s), np.array(uys, float), height),
            facecolors="white", hatch="xx" if labelled else None, edgecolors=UNMAPPED_COLOR,
            linewidths=0.4, gid="unmapped")
        ax.add_collection(unmapped)
        for row in tails if labelled else []:
            ax.text(0.995, row, f"… {format_bytes(layout[row].range)} range", ha="right",
                    va="center", fontsize=7, color="#555555", gid="tail",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    pools = [r.segment_type for r in layout]
    strip = PolyCollection(_rects(np.full(rows, -0.035), np.full(rows, -0.01),
                                  np.arange(rows, dtype=float), height),
                           facecolors=[POOL_COLORS.get(p, "#000000") for p in pools],
                           linewidths=0, gid="pools")
    ax.add_collection(strip)

    ax.set_xlim(-0.04, 1.0)
    ax.set_ylim(rows - 0.5, -0.5)  # the first segment on top
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", "¼", "½", "¾", "segment end"])
    streams = sorted({r.stream for r in layout})
    if labelled:
        ax.set_yticks(range(rows), [_row_label(r) for r in layout], fontsize=8)
        ax.tick_params(axis="y", length=0)
    else:
        step = max(1, rows // 10)
        ax.set_yticks(range(0, rows, step))
        ax.set_ylabel(f"segment (of {rows:,}, in address order)")
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(b["size"] for s in segments for b in s["blocks"]
                    if b["state"] == "active_allocated")
    pending = sum(b["size"] for s in segments for b in s["blocks"]
                  if b["state"] == "active_pending_free")
    lost = sum(b["size"] - b["requested_size"] for s in segments for b in s["blocks"]
               if b["state"] != "inactive" and b["requested_size"] > 0)
    cached = reserved - allocated - pending
    n_expandable = sum(r.expandable for r in layout)
    n_classic = rows - n_expandable
    ax.set_title(
        f"{n_classic:,} segment{'s' * (n_classic != 1)}"
        + (f" + {n_expandable} expandable" if n_expandable else "")
        + f" · {format_bytes(reserved)} reserved · "
        f"{format_bytes(allocated)} allocated (rounding {format_bytes(lost)}) · "
        f"{format_bytes(cached)} cached free"
        + (f" · {format_bytes(pending)} pending free" if pending else "")
        + (f" · streams {', '.join(map(str, streams))}" if len(streams) > 1 else ""),
        fontsize=9, loc="left")
    # Only PyTorch's allocator leaves frees pending (on other streams): no key for it unless a
    # block here is pending.
    any_pending = any(b["state"] == "active_pending_free" for s in segments for b in s["blocks"])
    handles = [Patch(color=STATE_COLORS["active_allocated"], label="allocated"),
               Patch(facecolor=ROUNDING_COLOR, hatch="////", edgecolor="white",
                     label="lost to rounding"),
               *([Patch(color=STATE_COLORS["active_pending_free"], label="pending free")]
                 if any_pending else []),
               Patch(color=STATE_COLORS["inactive"], label="cached free"),
               *([Patch(facecolor="white", hatch="xx", edgecolor=UNMAPPED_COLOR,
                        label="unmapped (expandable)")] if u0s else []),
               Patch(color=POOL_COLORS["small"], label="small pool"),
               Patch(color=POOL_COLORS["large"], label="large pool")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return ax


def _row_label(r: LayoutRow) -> str:
    """``large · stream 0 · 20 MiB``, or ``expandable · large · stream 0 · 60 MiB mapped of
    4.5 GiB`` (the range it reserves, when known)."""
    if not r.expandable:
        return f"{r.segment_type} · stream {r.stream} · {format_bytes(r.span)}"
    of = f" of {format_bytes(r.range)}" if r.range else ""
    return (f"expandable · {r.segment_type} · stream {r.stream} · "
            f"{format_bytes(r.mapped)} mapped{of}")


# -- per-cell bars ------------------------------------------------------------------------------


def plot_cells(rows: Sequence[CellRecord], ax: Axes | None = None) -> Axes:
    """Per cell: change in allocated, change in reserved, and the cell's own peak."""
    if ax is None:
        ax = _new_axes((max(6.0, 1.0 + 0.6 * len(rows)), 4.0))
    if not rows:
        ax.text(0.5, 0.5, "no cells recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    pos = np.arange(len(rows), dtype=float)
    width = 0.27
    series = (("allocated_delta", "Δ allocated", "#1f77b4"),
              ("reserved_delta", "Δ reserved", RESERVED_COLOR),
              ("peak_allocated", "cell peak", "#7f7f7f"))
    for k, (key, label, color) in enumerate(series):
        ax.bar(pos + (k - 1) * width, [float(r[key]) for r in rows],  # type: ignore[literal-required]
               width, label=label, color=color, gid=key)
    ooms = [i for i, r in enumerate(rows) if r["ooms"]]
    vmax = max(max(abs(r["allocated_delta"]), abs(r["reserved_delta"]), r["peak_allocated"])
               for r in rows)
    if ooms:
        ax.scatter(pos[ooms], [vmax * 1.05] * len(ooms), marker="X", color=RESERVED_COLOR,
                   s=50, label="OOM", gid="oom")
    ax.axhline(0, color="#333333", lw=0.6)
    labels = []
    for r in rows:
        src = r["source"].strip()
        labels.append(f"[{r['cell']}]\n{src[:14] + '…' if len(src) > 15 else src}")
    ax.set_xticks(pos, labels, fontsize=7)
    _byte_axis(ax.yaxis, vmax)
    ax.set_ylabel("GPU memory")
    ax.grid(axis="y", color="#eeeeee", lw=0.6)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title("per-cell memory", fontsize=10, loc="left")
    return ax
