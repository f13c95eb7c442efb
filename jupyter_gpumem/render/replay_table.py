"""A comparison of replays (``whatif``): one table row and one line of the picture per config.

Pure functions of plain values: a ``ReplayRow`` per config (numbers and the reserved bytes after
each event), never the allocator or the replay result. ``replay_table`` is the side-by-side
table, ``plot_replays`` the reserved bytes over the trace (one line per config, the device's
size dashed, each config's first failed request a cross), ``replay_alt`` the same in words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jupyter_gpumem.data.timeline import downsample
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.render.plots import Axes, _byte_axis, _event_axis, _new_axes, _palette
from jupyter_gpumem.render.table import Table

__all__ = ["HEADER", "ReplayRow", "plot_replays", "replay_alt", "replay_table", "row_cells"]

#: The columns of the table.
HEADER = ("config", "peak reserved", "peak allocated", "segments", "peak segments", "retries",
          "OOMs", "first OOM event", "fits?")


@dataclass(frozen=True)
class ReplayRow:
    """What one replay did, as plain values."""

    label: str  # the config, as ``key:value,...`` ("defaults" for none)
    peak_reserved: int
    peak_allocated: int
    num_segments: int  # at the end
    peak_segments: int
    num_alloc_retries: int
    num_ooms: int
    first_oom: int | None  # the event whose request failed first
    reserved: np.ndarray[Any, np.dtype[np.int64]]  # after each event

    @property
    def fits(self) -> bool:
        return self.num_ooms == 0


def row_cells(row: ReplayRow) -> tuple[str, ...]:
    """The table cells of ``row``, in the order of ``HEADER``."""
    return (row.label, format_bytes(row.peak_reserved), format_bytes(row.peak_allocated),
            str(row.num_segments), str(row.peak_segments), str(row.num_alloc_retries),
            str(row.num_ooms), "-" if row.first_oom is None else f"#{row.first_oom}",
            "yes" if row.fits else "no")


def replay_table(rows: Sequence[ReplayRow]) -> Table:
    """The rows side by side, numbers right-aligned."""
    return Table(HEADER, [row_cells(r) for r in rows], "<>>>>>>><",
                 css_class="jupyter-gpumem-replay")


def device_words(capacity: int | None, outside: int = 0) -> str:
    """`` on a device of 4.0 GiB`` (with what is held outside the allocator), or ""."""
    if capacity is None:
        return ""
    held = (f" ({format_bytes(outside)} of it in use outside the allocator)" if outside
            else "")
    return f" on a device of {format_bytes(capacity)}{held}"


def replay_alt(rows: Sequence[ReplayRow], events: int, capacity: int | None,
               outside: int = 0) -> str:
    """The picture in words: what it plots, and each config's peak and outcome."""
    device = device_words(capacity, outside)
    parts = [f"Reserved GPU memory over {events} replayed trace events{device}, one line per "
             f"allocator config ({len(rows)}):"]
    for r in rows:
        outcome = ("fits" if r.fits else
                   f"{r.num_ooms} out-of-memory error{'s' if r.num_ooms != 1 else ''}, the first "
                   f"at event {r.first_oom}")
        parts.append(f"{r.label} peaks at {format_bytes(r.peak_reserved)} reserved ({outcome})")
    return parts[0] + " " + "; ".join(parts[1:]) + "."


#: The device's line is drawn (and the axis reaches it) while it is at most this many times
#: the highest curve or cap; above, the legend names it and the curves keep the height.
DEVICE_IN_VIEW = 3.0


def plot_replays(rows: Sequence[ReplayRow], capacity: int | None = None,
                 ax: Axes | None = None, *, max_points: int = 2000, outside: int = 0,
                 caps: Sequence[int | None] = ()) -> Axes:
    """Reserved bytes after each event, one line per row; ``caps`` (a row's cap on reserved
    bytes, its ``per_process_memory_fraction`` of the device; None: no cap) dotted in the
    row's colour; ``capacity`` (the device's bytes, less the ``outside`` bytes held by others)
    dashed when given and near enough to the curves (``DEVICE_IN_VIEW``), else named in the
    legend; a cross where each row's first request failed. The legend goes under the plot."""
    if ax is None:
        ax = _new_axes((10, 4))
    top = max([r.peak_reserved for r in rows] + [c for c in caps if c is not None] + [1])
    # Configs often agree for most of a trace: each later line is thinner and dashed, so the
    # ones under it still show where they run together.
    styles = [("-", 3.0), ("--", 1.8), ("-.", 1.4), (":", 1.4)]
    for k, (r, color) in enumerate(zip(rows, _palette(len(rows)), strict=True)):
        y = r.reserved
        if len(y) == 0:
            continue
        at = downsample(y, max_points)
        style, width = styles[min(k, len(styles) - 1)]
        ax.plot(at, y[at], drawstyle="steps-post", color=color, linewidth=width,
                linestyle=style, label=f"{r.label} (peak {format_bytes(r.peak_reserved)})")
        if r.first_oom is not None and 0 <= r.first_oom < len(y):
            ax.plot([r.first_oom], [y[r.first_oom]], marker="x", markersize=9, color=color,
                    linestyle="none")
    drawn_caps: set[int] = set()
    for r, cap, color in zip(rows, caps, _palette(len(rows)), strict=False):
        if cap is not None and cap not in drawn_caps:
            drawn_caps.add(cap)
            ax.axhline(cap, color=color, linestyle=":", linewidth=1.2,
                       label=f"cap of {r.label}: {format_bytes(cap)}")
    if capacity is not None:
        room = capacity - outside
        words = (f"device {format_bytes(capacity)}" if not outside else
                 f"room for the allocator {format_bytes(room)} (device "
                 f"{format_bytes(capacity)})")
        if room <= DEVICE_IN_VIEW * top:
            ax.axhline(room, color="#666666", linestyle="--", linewidth=1, label=words)
            top = max(top, room)
        else:  # far above the curves: drawn to scale, they would lie flat along the bottom
            ax.plot([], [], " ", label=f"{words}, above this plot")
    ax.set_ylim(0, top * 1.08)
    _byte_axis(ax.yaxis, top)
    _event_axis(ax.xaxis)
    ax.set_xlabel("trace event")
    ax.set_ylabel("reserved")
    ax.set_title("Reserved memory when the trace is replayed under each config "
                 "(× first out-of-memory)")
    # under the plot: beside it, long config names would squeeze the axes; inside, it would
    # hide the curves or the room line
    labels = ax.get_legend_handles_labels()[1]
    widest = max((len(label) for label in labels), default=0)
    columns = 1 if widest > 48 else 2 if widest > 30 else 3  # long config names: fewer columns
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False,
              ncol=max(1, min(columns, len(labels))))
    return ax
