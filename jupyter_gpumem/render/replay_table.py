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


def replay_alt(rows: Sequence[ReplayRow], events: int, capacity: int | None) -> str:
    """The picture in words: what it plots, and each config's peak and outcome."""
    device = f" on a device of {format_bytes(capacity)}" if capacity is not None else ""
    parts = [f"Reserved GPU memory over {events} replayed trace events{device}, one line per "
             f"allocator config ({len(rows)}):"]
    for r in rows:
        outcome = ("fits" if r.fits else
                   f"{r.num_ooms} out-of-memory error{'s' if r.num_ooms != 1 else ''}, the first "
                   f"at event {r.first_oom}")
        parts.append(f"{r.label} peaks at {format_bytes(r.peak_reserved)} reserved ({outcome})")
    return parts[0] + " " + "; ".join(parts[1:]) + "."


def plot_replays(rows: Sequence[ReplayRow], capacity: int | None = None,
                 ax: Axes | None = None, *, max_points: int = 2000) -> Axes:
    """Reserved bytes after each event, one line per row; ``capacity`` (the device's bytes)
    dashed when given; a cross where each row's first request failed."""
    if ax is None:
        ax = _new_axes((10, 4))
    top = max([r.peak_reserved for r in rows] + [1])
    for r, color in zip(rows, _palette(len(rows)), strict=True):
        y = r.reserved
        if len(y) == 0:
            continue
        at = downsample(y, max_points)
        ax.plot(at, y[at], drawstyle="steps-post", color=color, linewidth=1.4,
                label=f"{r.label} (peak {format_bytes(r.peak_reserved)})")
        if r.first_oom is not None and 0 <= r.first_oom < len(y):
            ax.plot([r.first_oom], [y[r.first_oom]], marker="x", markersize=9, color=color,
                    linestyle="none")
    if capacity is not None:
        ax.axhline(capacity, color="#666666", linestyle="--", linewidth=1,
                   label=f"device {format_bytes(capacity)}")
        top = max(top, capacity)
    ax.set_ylim(0, top * 1.08)
    _byte_axis(ax.yaxis, top)
    _event_axis(ax.xaxis)
    ax.set_xlabel("trace event")
    ax.set_ylabel("reserved")
    ax.set_title("Reserved memory when the trace is replayed under each config "
                 "(× first out-of-memory)")
    # beside the plot, as the timeline's: inside, it covers whatever a curve does up there
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax
