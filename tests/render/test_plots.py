"""The matplotlib pictures, read back from the returned figures' artists (Agg backend).

Every expectation is computed from the input: the timeline's columns, the segments' blocks, the
cell rows.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_hex
from render_workload import BIG_SITE, MiB, many_segments, one_segment, recorded_snapshot

from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.ranking import top_sites
from jupyter_gpumem.data.sites import short_site
from jupyter_gpumem.data.timeline import build_timeline, cell_boundaries, oom_indices, peak_index
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.render.plots import (
    MAX_LABELLED_ROWS,
    POOL_COLORS,
    ROUNDING_COLOR,
    STATE_COLORS,
    TAIL_FRACTION,
    plot_cells,
    plot_segments,
    plot_timeline,
)

matplotlib.use("Agg")


def _by_gid(ax, gid):
    return [a for a in (*ax.lines, *ax.collections, *ax.texts, *ax.patches) if a.get_gid() == gid]


def _faces(coll):
    return [to_hex(c) for c in coll.get_facecolors()]


def _x_spans(coll):
    return [(p.vertices[:, 0].min(), p.vertices[:, 0].max()) for p in coll.get_paths()]


# -- timeline -----------------------------------------------------------------------------------


def test_timeline_lines_match_the_columns() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap)
    (alloc,) = _by_gid(ax, "allocated")
    (res,) = _by_gid(ax, "reserved")
    x, y = alloc.get_data()
    assert x.tolist() == list(range(len(tl)))  # fewer events than max_points: every one drawn
    assert y.tolist() == tl.allocated.tolist()
    assert res.get_xdata().tolist() == list(range(len(tl)))
    assert res.get_ydata().tolist() == tl.reserved.tolist()
    assert ax.get_xlim() == (0, len(tl) - 1)
    assert ax.get_ylim() == (0, tl.reserved.max() * 1.12)


def test_timeline_downsampled_keeps_the_peak() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap, max_points=10)
    (alloc,) = _by_gid(ax, "allocated")
    x, y = alloc.get_data()
    assert len(x) < len(tl)
    assert y.tolist() == tl.allocated[x.astype(int)].tolist()
    assert y.max() == tl.allocated.max()


def test_timeline_marks_cells_ooms_and_peak() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap)
    bounds = cell_boundaries(tl)
    assert [c for _, c in bounds] == [1, 2, 3]
    # a dotted line at each cell's first event, and the cell's number above it
    assert [line.get_xdata()[0] for line in _by_gid(ax, "cell-boundary")] == [i for i, _ in bounds]
    assert sorted(t.get_text() for t in ax.texts if t.get_gid() != "peak") == [
        " [1]", " [2]", " [3]"]
    (oom,) = _by_gid(ax, "oom")
    ooms = oom_indices(tl)
    assert len(ooms) == 1
    assert oom.get_offsets().tolist() == [[float(ooms[0]), float(tl.allocated[ooms[0]])]]
    (peak,) = _by_gid(ax, "peak")
    p = int(tl.allocated.argmax())
    assert peak.xy == (p, tl.allocated.max())
    assert peak.get_text() == f"peak 1.1 GiB · event {p}"  # 300 + 100 + 700 MiB and the leaks


def test_timeline_bands_by_site_stack_up_to_the_allocated_line() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap, top=3)
    bands = _by_gid(ax, "band")
    assert len(bands) == 4  # three sites and "other"
    # the legend: the three lines with the most bytes live at the peak, most first, then the rest
    top = top_sites(tl, live_intervals(tl), peak_index(tl))
    assert len(top) > 3  # so "other" holds something
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [*(short_site(u.site) for u in top[:3]), "other", "reserved", "allocated",
                      "OOM (1)"]
    assert labels[0] == BIG_SITE  # the 700 MiB block
    # stacked: the upper edge of the top band is the allocated bytes after every event
    vertices = bands[-1].get_paths()[0].vertices
    for k, allocated in enumerate(tl.allocated.tolist()):
        assert allocated in vertices[vertices[:, 0] == k, 1], k
    every = np.concatenate([b.get_paths()[0].vertices for b in bands])
    assert every[:, 1].max() == tl.allocated.max()
    assert every[:, 1].min() == 0


def test_timeline_by_cell_against_time() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    ax = plot_timeline(snap, color_by="cell", x="time")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # cells by their bytes live at the peak: cell 3's 700 MiB, cell 1's 400 MiB, then cell 2
    assert labels == ["cell [3]", "cell [1]", "cell [2]", "reserved", "allocated", "OOM (1)"]
    assert ax.get_xlabel() == "time since the first event (µs)"
    since = (tl.time_us - tl.time_us[0]).tolist()
    (alloc,) = _by_gid(ax, "allocated")
    assert alloc.get_xdata().tolist() == since
    assert alloc.get_ydata().tolist() == tl.allocated.tolist()
    assert [line.get_xdata()[0] for line in _by_gid(ax, "cell-boundary")] == [
        since[i] for i, _ in cell_boundaries(tl)]


def test_timeline_bad_arguments_and_empty() -> None:
    snap = recorded_snapshot()
    with pytest.raises(ValueError, match="x must be 'event' or 'time', got 'wall'"):
        plot_timeline(snap, x="wall")  # type: ignore[arg-type]
    with pytest.raises(ValueError,
                       match="color_by must be 'site', 'cell' or 'holder', got 'stream'"):
        plot_timeline(snap, color_by="stream")  # type: ignore[arg-type]
    ax = plot_timeline({"segments": [], "device_traces": [[]]})
    assert not ax.axison
    assert [t.get_text() for t in ax.texts] == ["no trace recorded (turn history on)"]
    assert len(ax.lines) == len(ax.collections) == 0


def test_timeline_of_segment_events_only_says_no_block_is_allocated() -> None:
    """Nothing to stack: matplotlib raised TypeError (an empty sequence of colours)."""
    events = [{"action": action, "addr": MiB, "size": 2 * MiB, "stream": 0, "time_us": t,
               "frames": []} for t, action in enumerate(("segment_alloc", "segment_free"))]
    ax = plot_timeline({"segments": [], "device_traces": [events]})  # type: ignore[typeddict-item]
    assert [t.get_text() for t in _by_gid(ax, "no-bands")] == [
        "no block is allocated in this trace"]
    assert not _by_gid(ax, "band")
    assert list(_by_gid(ax, "reserved")[0].get_ydata()) == [2 * MiB, 0]
    ax.figure.savefig(io.BytesIO(), format="png")


def test_timeline_title_shows_a_long_device_name_cut() -> None:
    snap = recorded_snapshot()
    snap["jupyter_gpumem"] = {"device_name": "GPU " * 300}
    title = plot_timeline(snap).get_title(loc="left")
    assert title.startswith("GPU GPU ") and title.index(" · ") == 60
    assert title[59] == "…"


# -- block layout -------------------------------------------------------------------------------


def test_one_segment_blocks_to_scale_and_coloured_by_state() -> None:
    ax = plot_segments(one_segment())
    (blocks,) = _by_gid(ax, "blocks")
    assert _faces(blocks) == [STATE_COLORS["active_allocated"], STATE_COLORS["inactive"],
                              STATE_COLORS["active_pending_free"],
                              STATE_COLORS["active_allocated"]]
    assert _x_spans(blocks) == [(0, 0.25), (0.25, 0.5), (0.5, 0.625), (0.625, 1.0)]
    (rounding,) = _by_gid(ax, "rounding")
    assert set(_faces(rounding)) == {ROUNDING_COLOR}
    # requested bytes end at 300, 1024 + 250 and 1280 + 700 KiB of the 2048 KiB segment
    assert np.ravel(sorted(_x_spans(rounding))) == pytest.approx(
        np.ravel([(300 / 2048, 0.25), (1274 / 2048, 0.625), (1980 / 2048, 1.0)]))
    (pools,) = _by_gid(ax, "pools")
    assert _faces(pools) == [POOL_COLORS["small"]]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["small · stream 0 · 2.0 MiB"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "allocated", "lost to rounding", "pending free", "cached free", "small pool",
        "large pool"]


def test_two_thousand_segments() -> None:
    segs = many_segments(2000)
    ax = plot_segments(segs)
    (blocks,) = _by_gid(ax, "blocks")
    assert len(blocks.get_paths()) == 4000
    ys = {round(float(p.vertices[:, 1].mean())) for p in blocks.get_paths()}
    assert ys == set(range(2000))
    assert ax.get_ylim() == (1999.5, -0.5)  # the first segment on top
    assert len(ax.get_yticks()) <= 11  # no per-row labels past the limit
    assert "2,000 segments" in ax.get_title(loc="left")
    assert ax.figure.get_figheight() <= 11
    (pools,) = _by_gid(ax, "pools")
    assert _faces(pools) == [POOL_COLORS["small" if k % 3 else "large"] for k in range(2000)]


def test_labels_stop_at_the_limit() -> None:
    ax = plot_segments(many_segments(MAX_LABELLED_ROWS))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{'small' if k % 3 else 'large'} · stream {k % 2} · 2.0 MiB"
                      for k in range(MAX_LABELLED_ROWS)]
    ax = plot_segments(many_segments(MAX_LABELLED_ROWS + 1))
    assert len(ax.get_yticks()) <= 11
    assert not any("stream" in t.get_text() for t in ax.get_yticklabels())


def test_segments_of_a_snapshot_match_it() -> None:
    snap = recorded_snapshot()
    ax = plot_segments(snap)
    (blocks,) = _by_gid(ax, "blocks")
    segments = snap["segments"]
    everything = [(row, seg, b) for row, seg in enumerate(segments) for b in seg["blocks"]]
    assert len(blocks.get_paths()) == len(everything)
    assert _faces(blocks) == [STATE_COLORS[b["state"]] for _, _, b in everything]
    expected = [((b["address"] - seg["address"]) / seg["total_size"],
                 (b["address"] + b["size"] - seg["address"]) / seg["total_size"])
                for _, seg, b in everything]
    assert np.ravel(_x_spans(blocks)) == pytest.approx(np.ravel(expected))
    rows = [round(float(p.vertices[:, 1].mean())) for p in blocks.get_paths()]
    assert rows == [row for row, _, _ in everything]


# -- per-cell bars ------------------------------------------------------------------------------


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
    series = ("allocated_delta", "reserved_delta", "peak_allocated")
    bars = {gid: [p for p in ax.patches if p.get_gid() == gid] for gid in series}
    assert {gid: [p.get_height() for p in bs] for gid, bs in bars.items()} == {
        gid: [r[gid] for r in rows] for gid in series}
    # three bars side by side per cell, in row order
    centres = [[p.get_x() + p.get_width() / 2 for p in bars[gid]] for gid in series]
    for k, xs in enumerate(centres):
        assert xs == pytest.approx([i + (k - 1) * 0.27 for i in range(len(rows))])
    (oom,) = _by_gid(ax, "oom")
    assert oom.get_offsets()[:, 0].tolist() == [1.0]  # the second cell ran out of memory
    assert oom.get_offsets()[0, 1] > 20 * MiB  # above the tallest bar
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert [label.split("\n")[0] for label in labels] == ["[1]", "[2]"]
    assert labels[1] == "[2]\ndel x"
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == [
        "OOM", "cell peak", "Δ allocated", "Δ reserved"]


def test_cells_empty() -> None:
    ax = plot_cells([])
    assert not ax.axison
    assert [t.get_text() for t in ax.texts] == ["no cells recorded"]


# -- no global state ----------------------------------------------------------------------------


def test_plots_use_no_pyplot_state() -> None:
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    axes = [plot_segments(one_segment()), plot_timeline(recorded_snapshot()),
            plot_cells([])]
    assert plt.get_fignums() == before  # no figure registered with pyplot
    for ax in axes:
        assert ax.figure.canvas.manager is None  # a bare Figure, which pyplot would manage
        assert type(ax.figure.canvas).__name__ == "FigureCanvasBase"


def test_plotting_never_imports_pyplot() -> None:
    code = ("import json, sys\n"
            "sys.path.insert(0, 'tests')\n"
            "from render_workload import one_segment, recorded_snapshot\n"
            "import jupyter_gpumem as gm\n"
            "gm.plot_segments(one_segment()).figure.savefig('/dev/null', format='png')\n"
            "gm.plot_timeline(recorded_snapshot())\n"
            "gm.plot_cells([])\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('matplotlib'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = json.loads(out)
    assert "matplotlib.figure" in loaded  # it did draw with matplotlib
    assert "matplotlib.pyplot" not in loaded


def test_an_expandable_segment_is_one_row_with_its_unmapped_ranges_hatched() -> None:
    from expandable_workload import make

    from jupyter_gpumem.data.mapped import virtual_range

    a = make()  # 4 GiB
    x = a.malloc(20 * MiB)
    p = a.malloc(40 * MiB)
    q = a.malloc(15 * MiB)
    a.free(p)
    a.empty_cache()  # [20, 60) MiB unmapped: two mapped ranges of one segment
    snap = a.snapshot()
    assert len(snap["segments"]) == 2
    ax = plot_segments(snap)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"expandable · large · stream 0 · {format_bytes(40 * MiB)} mapped of "
                      f"{format_bytes(virtual_range(4 << 30, small=False))}"]
    (unmapped,) = [c for c in ax.collections if c.get_gid() == "unmapped"]
    paths = [p.vertices for p in unmapped.get_paths()]
    assert len(paths) == 2  # the hole, and the mark for the rest of the range
    scale = (1 - TAIL_FRACTION) / (80 * MiB)  # to scale up to the highest mapped end
    hole, tail = sorted(paths, key=lambda v: v[:, 0].min())
    assert hole[:, 0].min() == pytest.approx(20 * MiB * scale)
    assert hole[:, 0].max() == pytest.approx(60 * MiB * scale)
    assert tail[:, 0].min() == pytest.approx(1 - TAIL_FRACTION) and tail[:, 0].max() == 1.0
    assert [t.get_text() for t in ax.texts if t.get_gid() == "tail"] == [
        f"… {format_bytes(virtual_range(4 << 30, small=False))} range"]
    assert "unmapped (expandable)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_title(loc="left").startswith("0 segments + 1 expandable")
    # the segments alone (replay_segments' list): no device size, no mark for the rest
    ax = plot_segments(snap["segments"])
    (unmapped,) = [c for c in ax.collections if c.get_gid() == "unmapped"]
    assert len(unmapped.get_paths()) == 1
    assert ax.get_yticklabels()[0].get_text().endswith("mapped")
    a.free(x)
    a.free(q)


def test_a_trace_results_layout_names_the_range_an_expandable_segment_reserves() -> None:
    from expandable_workload import make

    from jupyter_gpumem.data.mapped import virtual_range
    from jupyter_gpumem.render.trace_result import analyze

    a = make()  # 4 GiB
    a.record_history()
    p = a.malloc(30 * MiB)
    result = analyze(a.snapshot())
    label = result.plot_segments("end").get_yticklabels()[0].get_text()
    assert label.endswith(f"mapped of {format_bytes(virtual_range(4 << 30, small=False))}")
    assert len(result.figure().axes) == 3
    a.free(p)
