"""Pictures a person can read: no text drawn over text, round ticks, only the keys that apply,
and sites named after notebook cells (matplotlib here; the browser's tick and key choice are
the TS unit tests' in labextension/)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.path import Path
from matplotlib.text import Text
from render_workload import MiB, one_segment, recorded_snapshot

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.render.plots import plot_cells, plot_segments, plot_timeline
from jupyter_gpumem.render.trace_result import TraceResult, analyze
from jupyter_gpumem.render.view_payload import build_view

matplotlib.use("Agg")

#: IPython compiles every cell into a file with a made-up name like this one.
CELL_FILE = "ipykernel_4242/382194726.py"
OTHER_CELL_FILE = "ipykernel_4242/99123456.py"


def _run_cells(cells: list[tuple[str, str]], first: int = 5) -> tuple[Snapshot, dict[str, int]]:
    """Run each ``(file name, source)`` as a notebook cell would, numbered from ``first``."""
    a = CachingAllocator(SimulatedDevice(8 << 30, clock=ManualClock(tick_ns=1000),
                                         name="Simulated GPU"))
    a.record_history(True)
    namespace: dict[str, Any] = {"a": a, "MiB": MiB}
    files = {}
    for number, (filename, source) in enumerate(cells, start=first):
        a.current_cell = number
        files[filename] = number
        exec(compile(source, filename, "exec"), namespace)
    return a.snapshot(), files


def small_trace() -> tuple[Snapshot, dict[str, int]]:
    """Nine events in two cells, peak 410 MiB."""
    return _run_cells([(CELL_FILE, "x = a.malloc(100 * MiB)\ny = a.malloc(110 * MiB)\n"),
                       (OTHER_CELL_FILE, "z = a.malloc(200 * MiB)\na.free(y)\n")])


def tiny_trace() -> tuple[Snapshot, dict[str, int]]:
    """Three events: a segment, an allocation, a free."""
    return _run_cells([(CELL_FILE, "x = a.malloc(3 * MiB)\na.free(x)\n")])


def large_trace() -> tuple[Snapshot, dict[str, int]]:
    """Hundreds of events in a dozen cells, peak over 1 GiB."""
    cells = []
    for k in range(12):
        cells.append((f"ipykernel_4242/{1000 + k}.py",
                      f"keep{k} = []\nfor i in range(25):\n"
                      f"    p = a.malloc((i % 7 + 1) * 3 * MiB)\n"
                      f"    if i % 3: a.free(p)\n    else: keep{k}.append(p)\n"))
    return _run_cells(cells, first=1)


def spike_trace() -> tuple[Snapshot, dict[str, int]]:
    """Sixty small blocks, then one far larger: the reserved curve steps up (a new segment)
    one event before the peak, at the right edge."""
    return _run_cells([(CELL_FILE, "keep = [a.malloc(3 * MiB) for _ in range(60)]\n"
                                   "big = a.malloc(700 * MiB)\na.free(big)\n")])


TRACES = {"tiny": tiny_trace, "small": small_trace, "large": large_trace, "spike": spike_trace}


# -- no text over text -------------------------------------------------------------------------


def _texts(fig: Any) -> tuple[list[Text], Any]:
    """Every text a drawn figure shows, and the renderer that drew it: tick labels only of
    ticks in view on axes that are on (matplotlib keeps others that it does not draw)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    tick_labels = set()
    shown = []
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = sorted(lim)
            for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks()):
                tick_labels.update((tick.label1, tick.label2))
                if ax.axison and lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
                    shown += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    texts = [t for t in fig.findobj(Text) if t not in tick_labels and t.get_visible()]
    return [t for t in texts + shown if t.get_text().strip()], renderer


def _assert_readable(fig: Any) -> list[str]:
    texts, renderer = _texts(fig)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    whole = fig.bbox
    for text, box in boxes:
        assert (box.x0 >= whole.x0 - 1 and box.y0 >= whole.y0 - 1
                and box.x1 <= whole.x1 + 1 and box.y1 <= whole.y1 + 1), \
            f"{text!r} is drawn outside the figure"
    for (a, abox), (b, bbox) in itertools.combinations(boxes, 2):
        assert not abox.overlaps(bbox), f"{a!r} is drawn over {b!r}"
    return [text for text, _ in boxes]


@pytest.mark.parametrize("name", sorted(TRACES))
def test_trace_picture_has_no_text_over_text(name: str) -> None:
    snap, files = TRACES[name]()
    texts = _assert_readable(analyze(snap, cell_files=files).figure())
    joined = "\n".join(texts)
    assert "block layout at the peak" in joined and "block layout at the end" in joined
    assert "segment" in joined and "reserved" in joined  # the panels' own subtitles


@pytest.mark.parametrize("name", sorted(TRACES))
def test_timeline_and_layout_pictures_have_no_text_over_text(name: str) -> None:
    snap, files = TRACES[name]()
    _assert_readable(plot_timeline(snap, cell_files=files).figure)
    _assert_readable(plot_timeline(snap, color_by="cell", x="time").figure)
    _assert_readable(plot_segments(snap).figure)


def _step_path(line: Any) -> Path:
    """A steps-post line as drawn, in display pixels."""
    xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    verts = [(xs[0], ys[0])]
    for i in range(1, len(xs)):
        verts += [(xs[i], ys[i - 1]), (xs[i], ys[i])]
    return Path(line.axes.transData.transform(verts))


@pytest.mark.parametrize("name", sorted(TRACES))
def test_timeline_peak_label_is_clear_of_the_curves(name: str) -> None:
    snap, files = TRACES[name]()
    for ax in (plot_timeline(snap, cell_files=files), plot_timeline(snap, x="time")):
        canvas = FigureCanvasAgg(ax.figure)
        canvas.draw()
        (peak,) = [t for t in ax.texts if t.get_gid() == "peak"]
        patch = peak.get_bbox_patch()
        assert patch is not None
        box = patch.get_window_extent(canvas.get_renderer()).padded(2)
        assert box.x0 >= ax.bbox.x0 and box.x1 <= ax.bbox.x1 and box.y1 <= ax.bbox.y1
        for line in ax.lines:
            if line.get_gid() in ("reserved", "allocated"):
                assert not _step_path(line).intersects_bbox(box, filled=False), \
                    f"the peak label is drawn over the {line.get_gid()} curve"


# -- round ticks ---------------------------------------------------------------------------------

_BYTE_LABEL = re.compile(r"^(-?)(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)$")
_UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _byte_label_value(label: str) -> int:
    """The bytes a tick label names; only "0" or a number of at least 1 in a binary unit."""
    label = label.replace("\u2212", "-")
    if label == "0":
        return 0
    m = _BYTE_LABEL.match(label)
    assert m, f"tick label {label!r} is not a number of a binary unit"
    assert float(m.group(2)) >= 1, f"tick label {label!r}: use the smaller unit"
    value = float(m.group(2)) * _UNIT[m.group(3)]
    assert value == int(value)
    return -int(value) if m.group(1) else int(value)


def _assert_round_bytes(values: list[float], labels: list[str]) -> None:
    """Ticks at multiples of one power-of-two step, each labelled exactly."""
    assert len(values) >= 2, values
    step = values[1] - values[0]
    assert step >= 1 and step == 2 ** round(math.log2(step)), f"step {step} is not 2**k bytes"
    for v, label in zip(values, labels, strict=True):
        assert v % step == 0, f"{v} is not a multiple of {step}"
        assert _byte_label_value(label) == v, (label, v)
    assert all(b - a == step for a, b in itertools.pairwise(values))


def _assert_round_events(values: list[float]) -> None:
    assert values and all(v == int(v) for v in values), f"event ticks {values}"
    if len(values) > 1:
        step = values[1] - values[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert mantissa in (1, 2, 5), f"event tick step {step}"


def _ticks(ax: Any, axis: str) -> tuple[list[float], list[str]]:
    FigureCanvasAgg(ax.figure.figure).draw()  # the root figure of a subfigure too
    which = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    pairs = [(float(t.get_loc()), t.label1.get_text()) for t in which.get_major_ticks()
             if lo - 1e-9 <= t.get_loc() <= hi + 1e-9]
    return [v for v, _ in pairs], [label for _, label in pairs]


@pytest.mark.parametrize("name", sorted(TRACES))
def test_timeline_ticks_are_whole_events_and_round_bytes(name: str) -> None:
    snap, _ = TRACES[name]()
    ax = plot_timeline(snap)
    events, _ = _ticks(ax, "x")
    _assert_round_events(events)
    _assert_round_bytes(*_ticks(ax, "y"))
    res = analyze(snap)
    for panel in (res.plot(), res.figure().axes[0]):
        _assert_round_events(_ticks(panel, "x")[0])
        _assert_round_bytes(*_ticks(panel, "y"))


def test_small_trace_has_no_odd_mebibyte_ticks() -> None:
    snap, _ = small_trace()  # peak 410 MiB: ticks 0, 128 MiB, 256 MiB, 384 MiB
    values, labels = _ticks(plot_timeline(snap), "y")
    assert labels[:4] == ["0", "128 MiB", "256 MiB", "384 MiB"]
    assert values[1] == 128 * MiB


def test_cell_bars_ticks_are_round_bytes_below_zero_too() -> None:
    rows = [{"cell": 1, "source": "x = f()", "allocated_delta": 300 * MiB,
             "reserved_delta": 320 * MiB, "peak_allocated": 410 * MiB, "ooms": 0},
            {"cell": 2, "source": "del x", "allocated_delta": -300 * MiB,
             "reserved_delta": 0, "peak_allocated": 300 * MiB, "ooms": 0}]
    values, labels = _ticks(plot_cells(rows), "y")  # type: ignore[arg-type]
    assert min(values) < 0 < max(values)
    _assert_round_bytes(values, labels)


# -- "pending free" only where a block is pending -------------------------------------------------


def _legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_pending_free_key_only_with_pending_blocks() -> None:
    assert "pending free" in _legend(plot_segments(one_segment()))
    without = [dict(s, blocks=[dict(b, state="inactive" if b["state"] == "active_pending_free"
                                    else b["state"]) for b in s["blocks"]])
               for s in one_segment()]
    assert "pending free" not in _legend(plot_segments(without))  # type: ignore[arg-type]
    snap = recorded_snapshot()  # our allocator never leaves a free pending
    assert "pending free" not in _legend(plot_segments(snap))
    fig = analyze(snap).figure()
    assert all("pending free" not in _legend(ax) for ax in fig.axes[1:])


# -- cells by name, pictures included --------------------------------------------------------------


def test_pictures_name_sites_after_cells() -> None:
    snap, files = small_trace()
    expected = {"cell [5] line 1", "cell [5] line 2", "cell [6] line 1"}
    assert expected <= set(_legend(plot_timeline(snap, cell_files=files)))
    res = analyze(snap, cell_files=files)
    assert expected <= {u.site for u in res.top_sites}  # the tables already did
    labels = set(_legend(res.figure().axes[0]))
    assert expected <= labels
    assert not any(".py:" in label for label in labels)
    assert expected <= set(_legend(res.plot()))
    payload = build_view(snap, cell_files=files)
    assert expected <= set(payload["timeline"]["band_labels"])
    assert expected <= set(payload["sites"])
    # without the mapping, a site is its file
    assert any(label.startswith("382194726.py:") for label in _legend(plot_timeline(snap)))


def test_empty_trace_picture_is_readable() -> None:
    texts = _assert_readable(TraceResult.empty().figure())
    assert "no segments" in texts
