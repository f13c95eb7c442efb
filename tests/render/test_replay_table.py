"""The replay comparison's table, words and picture, from plain rows."""

from __future__ import annotations

import numpy as np

from jupyter_gpumem.render.replay_table import ReplayRow, plot_replays, replay_alt, replay_table

MiB = 1 << 20


def rows() -> list[ReplayRow]:
    return [
        ReplayRow("defaults (recorded)", 600 * MiB, 600 * MiB, 1, 1, 1, 1, 5,
                  np.array([0, 600, 600, 600, 600, 600, 600], np.int64) * MiB),
        ReplayRow("max_split_size_mb:64", 700 * MiB, 700 * MiB, 2, 2, 0, 0, None,
                  np.array([0, 600, 600, 600, 700, 700, 700], np.int64) * MiB),
    ]


def test_table_text_and_html() -> None:
    table = replay_table(rows())
    assert table.text() == (
        "config                peak reserved  peak allocated  segments  peak segments  retries"
        "  OOMs  first OOM event  fits?\n"
        "defaults (recorded)         600 MiB         600 MiB         1              1        1"
        "     1               #5  no\n"
        "max_split_size_mb:64        700 MiB         700 MiB         2              2        0"
        "     0                -  yes")
    assert table.html().startswith('<table class="jupyter-gpumem-replay"><thead><tr>'
                                   "<th style=\"text-align: left\">config</th>"
                                   "<th style=\"text-align: right\">peak reserved</th>")


def test_alt_says_each_config_in_words() -> None:
    assert replay_alt(rows(), 7, 1024 * MiB) == (
        "Reserved GPU memory over 7 replayed trace events on a device of 1.0 GiB, one line per "
        "allocator config (2): defaults (recorded) peaks at 600 MiB reserved (1 out-of-memory "
        "error, the first at event 5); max_split_size_mb:64 peaks at 700 MiB reserved (fits).")
    assert "on a device" not in replay_alt(rows(), 7, None)


def test_plot_one_line_per_config_and_the_device() -> None:
    ax = plot_replays(rows(), 1024 * MiB)
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["defaults (recorded) (peak 600 MiB)", "max_split_size_mb:64 (peak 700 MiB)",
                      "device 1.0 GiB"]
    recorded = ax.get_lines()[0]
    assert list(recorded.get_ydata()) == list(rows()[0].reserved)
    cross = ax.get_lines()[1]  # the first failed request of the recorded config
    assert cross.get_marker() == "x" and list(cross.get_xdata()) == [5]
    long = ReplayRow("x", 9, 9, 1, 1, 0, 0, None, np.arange(100_000, dtype=np.int64) % 10)
    drawn = plot_replays([long], max_points=500).get_lines()[0]
    assert len(drawn.get_xdata()) <= 502 and max(drawn.get_ydata()) == 9


def test_plot_legend_under_the_curves_leaves_the_axes_their_width() -> None:
    """The legend never covers a curve and long config names do not squeeze the plot: it sits
    under the plotting area, inside the figure."""
    from dataclasses import replace

    long_names = [replace(r, label="garbage_collection_threshold:0.6,max_split_size_mb:128,"
                          f"roundup_power2_divisions:{4 << i}") for i, r in enumerate(rows())]
    ax = plot_replays(long_names, 1024 * MiB)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out
    renderer = canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    area = ax.get_window_extent(renderer)
    xlabel = ax.xaxis.label.get_window_extent(renderer)
    assert legend.y1 <= xlabel.y0  # under the axis and its label
    assert legend.x0 >= fig.bbox.x0 and legend.x1 <= fig.bbox.x1 and legend.y0 >= fig.bbox.y0
    assert area.width >= 0.75 * fig.bbox.width


def test_plot_under_a_cap_scales_to_the_cap_not_the_device() -> None:
    """Under a memory cap far below the device, the curves keep the height (the device is named
    in the legend, not drawn), and each row's cap is drawn."""
    device = 80 << 30
    ax = plot_replays(rows(), device, caps=[800 * MiB, None])
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["defaults (recorded) (peak 600 MiB)", "max_split_size_mb:64 (peak 700 MiB)",
                      "cap of defaults (recorded): 800 MiB", "device 80.0 GiB, above this plot"]
    low, high = ax.get_ylim()
    assert low == 0 and 800 * MiB < high < 900 * MiB
    cap_line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("cap of"))
    assert list(cap_line.get_ydata()) == [800 * MiB, 800 * MiB]
    # a device near the curves is drawn, and the axis reaches it
    ax = plot_replays(rows(), 1024 * MiB, caps=[None, None])
    assert ax.get_legend_handles_labels()[1][-1] == "device 1.0 GiB"
    assert ax.get_ylim()[1] > 1024 * MiB
