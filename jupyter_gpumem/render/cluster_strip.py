"""The heat strip of a cluster's workers (matplotlib): one row per worker, time to the right,
colour = a worker's bytes as a fraction of its device. The static picture of the live cluster
view (``jupyter_gpumem.notebook.cluster_live``), from plain arrays only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from jupyter_gpumem.data.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["CMAP", "plot_cluster_strip", "strip_alt"]

#: The colour map of the strip, the same as the browser's (``labextension/src/cluster.ts``).
CMAP = "viridis"
#: Where a worker gave no answer, and where it had left.
STALE_COLOR = "#d9d9d9"
GONE_COLOR = "#6b6b6b"


def plot_cluster_strip(times: np.ndarray, fractions: np.ndarray, labels: Sequence[str], *,
                       states: np.ndarray | None = None, value: str = "allocated",
                       title: str = "") -> Axes:
    """``fractions`` (workers × rounds, NaN where nothing is known) at ``times`` (seconds) as a
    heat strip with a row per worker (``labels``, top to bottom) and a colour bar. ``states``
    (the same shape; 1 stale, 2 gone) paints rows where the worker was stale or gone."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    n = len(labels)
    rows = max(n, 1)
    height = min(9.0, 1.2 + 0.14 * rows + (0.25 if title else 0))
    fig = Figure(figsize=(10, max(2.2, height)), layout="constrained")
    ax = fig.add_subplot()
    if title:
        ax.set_title(title, fontsize=9, loc="left")
    t = np.asarray(times, dtype=np.float64)
    if n == 0 or len(t) == 0:
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes,
                color="#666666")
        ax.set_axis_off()
        return ax
    data = np.asarray(fractions, dtype=np.float64).reshape(n, len(t))
    step = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    edges = np.concatenate([t, [t[-1] + step]])
    if states is not None:
        st = np.asarray(states).reshape(n, len(t))
        back = np.where(st == 2, 2.0, np.where(st == 1, 1.0, np.nan))
        ax.pcolormesh(edges, np.arange(n + 1), back,
                      cmap=ListedColormap([STALE_COLOR, GONE_COLOR]), vmin=0.5, vmax=2.5)
    mesh = ax.pcolormesh(edges, np.arange(n + 1), np.clip(data, 0, 1), cmap=CMAP, vmin=0,
                         vmax=1)
    ax.set_ylim(n, 0)
    every = max(1, int(np.ceil(n / 32)))
    ticks = np.arange(0, n, every)
    ax.set_yticks(ticks + 0.5)
    ax.set_yticklabels([labels[int(i)] for i in ticks], fontsize=7 if n > 16 else 8)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("seconds")
    bar = fig.colorbar(mesh, ax=ax, fraction=0.04, pad=0.01)
    bar.set_label(f"{value} / device total", fontsize=8)
    bar.set_ticks([0, 0.25, 0.5, 0.75, 1.0])
    bar.set_ticklabels(["0", "25%", "50%", "75%", "100%"])
    bar.ax.tick_params(labelsize=7)
    return ax


def strip_alt(n_workers: int, n_rounds: int, span_s: float, value: str, peak: int,
              peak_worker: str) -> str:
    """What the strip shows, in words with its numbers."""
    if not n_workers or not n_rounds:
        return "Heat strip of the cluster's workers: no samples yet."
    return (f"Heat strip of {n_workers} Dask worker{'s' if n_workers != 1 else ''}' GPU memory,"
            f" one row per worker, {n_rounds} samples over {span_s:.0f} s; colour is {value} "
            f"bytes as a fraction of each worker's device; the most allocated was "
            f"{format_bytes(peak)} on worker {peak_worker}.")

