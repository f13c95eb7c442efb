from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_hex
from render_workload import MiB, many_segments, one_segment, recorded_snapshot

from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.render.plots import (
    MAX_LABELLED_ROWS,
    POOL_COLORS,
    ROUNDING_COLOR,
    STATE_COLORS,
    plot_cells,
    plot_segments,
    plot_timeline,
)

matplotlib.use("Agg")


def _by_gid(ax, gid):
    return [a for a in (*ax.lines, *ax.collections, *ax.texts, *ax.patches) if a.get_gid() == gid]


def test_timeline_lines_match_the_columns() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap)
    (alloc,) = _by_gid(ax, "allocated")
    (res,) = _by_gid(ax, "reserved")
    x, y = alloc.get_data()
    assert np.array_equal(y, tl.allocated[x.astype(int)])
    assert y.max() == tl.allocated.max()
    assert np.array_equal(res.get_ydata(), tl.reserved[res.get_xdata().astype(int)])
    assert ax.get_xlim() == (0, len(tl) - 1)
    assert ax.get_ylim()[1] >= tl.reserved.max()


def test_timeline_marks_cells_ooms_and_peak() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap)
    assert len(_by_gid(ax, "cell-boundary")) == 3
    (oom,) = _by_gid(ax, "oom")
    assert len(oom.get_offsets()) == 1
    (peak,) = _by_gid(ax, "peak")
    assert peak.xy == (tl.allocated.argmax(), tl.allocated.max())
    assert "peak" in peak.get_text()


def test_timeline_bands_by_site_and_by_cell() -> None:
    snap = recorded_snapshot()
    ax = plot_timeline(snap, top=3)
    bands = _by_gid(ax, "band")
    assert len(bands) == 4  # three sites and "other"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:3][0].startswith("render_workload.py:") and "other" in labels
    ax = plot_timeline(snap, color_by="cell", x="time")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"cell [1]", "cell [2]", "cell [3]"} <= set(labels)
    assert "time" in ax.get_xlabel()


def test_timeline_bad_arguments_and_empty() -> None:
    snap = recorded_snapshot()
    with pytest.raises(ValueError):
        plot_timeline(snap, x="wall")  # type: ignore[arg-type]
    ax = plot_timeline({"segments": [], "device_traces": [[]]})
    assert not ax.axison


def _faces(coll):
    return [to_hex(c) for c in coll.get_facecolors()]


def test_one_segment_blocks_to_scale_and_coloured_by_state() -> None:
    ax = plot_segments(one_segment())
    (blocks,) = _by_gid(ax, "blocks")
    assert _faces(blocks) == [STATE_COLORS["active_allocated"], STATE_COLORS["inactive"],
                              STATE_COLORS["active_pending_free"],
                              STATE_COLORS["active_allocated"]]
    xs = [(p.vertices[:, 0].min(), p.vertices[:, 0].max()) for p in blocks.get_paths()]
    assert xs == [(0, 0.25), (0.25, 0.5), (0.5, 0.625), (0.625, 1.0)]
    (rounding,) = _by_gid(ax, "rounding")
    assert set(_faces(rounding)) == {ROUNDING_COLOR}
    spans = sorted((p.vertices[:, 0].min(), p.vertices[:, 0].max()) for p in rounding.get_paths())
    assert spans[0] == pytest.approx((300 / 2048, 0.25))
    assert len(spans) == 3  # both allocated blocks and the pending one lost bytes
    (pools,) = _by_gid(ax, "pools")
    assert _faces(pools) == [POOL_COLORS["small"]]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["small · stream 0 · 2.0 MiB"]


def test_two_thousand_segments() -> None:
    segs = many_segments(2000)
    ax = plot_segments(segs)
    (blocks,) = _by_gid(ax, "blocks")
    assert len(blocks.get_paths()) == 4000
    ys = {round(float(p.vertices[:, 1].mean())) for p in blocks.get_paths()}
    assert ys == set(range(2000))
    assert len(ax.get_yticks()) <= 11  # no per-row labels past the limit
    assert "2,000 segments" in ax.get_title(loc="left")
    assert ax.figure.get_figheight() <= 11
    (pools,) = _by_gid(ax, "pools")
    assert _faces(pools)[:3] == [POOL_COLORS["large"], POOL_COLORS["small"], POOL_COLORS["small"]]


def test_labels_stop_at_the_limit() -> None:
    ax = plot_segments(many_segments(MAX_LABELLED_ROWS))
    assert len(ax.get_yticklabels()) == MAX_LABELLED_ROWS
    assert "stream 1" in ax.get_yticklabels()[1].get_text()


def test_segments_of_a_snapshot_match_it() -> None:
    snap = recorded_snapshot()
    ax = plot_segments(snap)
    (blocks,) = _by_gid(ax, "blocks")
    assert len(blocks.get_paths()) == sum(len(s["blocks"]) for s in snap["segments"])


def test_cells_bars() -> None:
    rows = [
        {"cell": 1, "source": "x = cp.zeros(10)", "allocated_delta": 4 * MiB,
         "reserved_delta": 20 * MiB, "peak_allocated": 4 * MiB, "allocs": 1, "frees": 0,
         "segments_new": 1, "ooms": 0, "wall_s": 0.1, "start_event": 0, "end_event": 2},
        {"cell": 2, "source": "del x", "allocated_delta": -4 * MiB, "reserved_delta": 0,
         "peak_allocated": 4 * MiB, "allocs": 0, "frees": 1, "segments_new": 0, "ooms": 1,
         "wall_s": 0.1, "start_event": 2, "end_event": 4},
    ]
    ax = plot_cells(rows)  # type: ignore[arg-type]
    heights = {gid: [p.get_height() for p in ax.patches if p.get_gid() == gid]
               for gid in ("allocated_delta", "reserved_delta", "peak_allocated")}
    assert heights == {"allocated_delta": [4 * MiB, -4 * MiB], "reserved_delta": [20 * MiB, 0],
                       "peak_allocated": [4 * MiB, 4 * MiB]}
    assert len(_by_gid(ax, "oom")[0].get_offsets()) == 1
    assert ax.get_xticklabels()[0].get_text().startswith("[1]")


def test_plots_use_no_pyplot_state() -> None:
    import sys

    plot_segments(one_segment())
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        assert plt.get_fignums() == []
