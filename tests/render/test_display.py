from __future__ import annotations

import base64
import dataclasses
import io
import json
import os

import numpy as np
import pytest
from bundle_checks import check_bundle, images
from matplotlib.colors import to_hex, to_rgb
from render_workload import BIG_SITE, MiB, recorded_snapshot
from view_assets import BUILT

from jupyter_gpumem.data.files import load_snapshot
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.render.display import MIME_SCHEMA_VERSION, MIME_TYPE, SnapshotView
from jupyter_gpumem.render.plots import STATE_COLORS
from jupyter_gpumem.render.trace_result import analyze

PNG = b"\x89PNG\r\n\x1a\n"


def png_image(data: bytes) -> np.ndarray:
    """The PNG decoded to an (height, width, RGBA) array; fails unless it is a real PNG."""
    import matplotlib.image

    assert data[:8] == PNG
    return matplotlib.image.imread(io.BytesIO(data), format="png")


def pixels_of(image: np.ndarray, color: str) -> int:
    """How many pixels have exactly this colour (to within rounding to 8 bits)."""
    return int((np.abs(image[..., :3] - to_rgb(color)) < 1.5 / 255).all(axis=-1).sum())


def blocks_drawn(ax) -> int:
    (blocks,) = [c for c in ax.collections if c.get_gid() == "blocks"]
    return len(blocks.get_paths())


def colours_drawn(ax) -> list[str]:
    """The fill colour of every block drawn, in order."""
    (blocks,) = [c for c in ax.collections if c.get_gid() == "blocks"]
    return [to_hex(c) for c in blocks.get_facecolors()]


def state_colours(segments) -> list[str]:
    return [STATE_COLORS[b["state"]] for s in segments for b in s["blocks"]]


def test_snapshot_view_bundle() -> None:
    snap = recorded_snapshot()
    view = SnapshotView(snap)
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", "image/png", MIME_TYPE}
    payload = check_bundle(bundle, kind="snapshot")
    ((png, alt),) = images(bundle["text/html"])
    assert alt == view.alt() and "4 segments" in alt and "allocated blocks" in alt
    assert view.png() == png and base64.b64decode(bundle["image/png"]) == png
    image = png_image(png)
    height, width, _ = image.shape
    assert 600 < width < 1200 and 150 < height < 400  # 11 in wide at 80 dpi, four short rows
    # the blocks are drawn: allocated blue and cached-free grey fill part of the picture
    assert pixels_of(image, STATE_COLORS["active_allocated"]) > 1000
    assert pixels_of(image, STATE_COLORS["inactive"]) > 1000
    assert payload["schema"] == MIME_SCHEMA_VERSION == 2
    assert payload["n_events"] == len(snap["device_traces"][0])
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert bundle["text/plain"] == (
        f"GPU memory snapshot: 4 segments, "
        f"{format_bytes(sum(s['total_size'] for s in snap['segments']))} reserved, "
        f"{format_bytes(sum(b['size'] for b in live))} allocated in {len(live)} blocks, "
        f"{len(snap['device_traces'][0])} trace events")
    json.dumps(bundle[MIME_TYPE])  # plain data
    assert repr(view) == f"<SnapshotView {bundle['text/plain']}>"


def test_snapshot_view_plots_its_segments() -> None:
    snap = recorded_snapshot()
    ax = SnapshotView(snap).plot()
    assert blocks_drawn(ax) == sum(len(s["blocks"]) for s in snap["segments"])
    ax = SnapshotView(snap).plot_timeline()
    (alloc,) = [line for line in ax.lines if line.get_gid() == "allocated"]
    assert len(alloc.get_xdata()) == len(snap["device_traces"][0])


def test_trace_result_fields() -> None:
    snap = recorded_snapshot()
    r = analyze(snap, title="cell 3")
    assert r.top_sites[0].bytes == 700 * MiB and r.top_sites[0].count == 1
    assert r.top_sites[0].site == BIG_SITE
    assert r.peak_allocated == max(r.timeline.allocated)
    # the two weights and the three leaked blocks (3 MiB + 100 B rounds up by 412 B)
    assert sorted(b.size for b in r.surviving) == [3 * MiB + 512] * 3 + [100 * MiB, 300 * MiB]
    assert all(b.site and "render_workload.py" in b.site for b in r.surviving)
    r.surviving[0] = dataclasses.replace(r.surviving[0], holders=("weights",))
    data = r.to_json()
    assert data["surviving"][0]["holders"] == ["weights"]
    assert data["kind"] == "trace" and data["schema"] == MIME_SCHEMA_VERSION


def test_trace_result_bundle_and_repr_are_cheap() -> None:
    r = analyze(recorded_snapshot())
    bundle = r._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", "image/png", MIME_TYPE}
    payload = check_bundle(bundle, kind="trace")
    ((png, alt),) = images(bundle["text/html"])
    assert png == r.png() and alt == r.alt()
    assert base64.b64decode(bundle["image/png"]) == png
    assert format_bytes(r.peak_allocated) in alt and "at the peak" in alt and "at the end" in alt
    image = png_image(png)
    height, width, _ = image.shape
    assert 600 < width < 1200 and 400 < height < 1000  # the timeline and two layouts
    assert pixels_of(image, STATE_COLORS["active_allocated"]) > 1000
    assert payload["n_events"] == r.events and len(payload["surviving"]) == 5
    assert payload["top_sites"][0] == {"site": BIG_SITE, "bytes": 700 * MiB, "count": 1}
    assert repr(r) == (f"<TraceResult {r.events} events, peak {format_bytes(r.peak_allocated)}, "
                       "5 surviving blocks>")
    assert bundle["text/plain"] == r.text()
    assert bundle["text/plain"].splitlines()[0] == r.headline()


def test_trace_with_no_events_shows_the_layout_at_its_end() -> None:
    """A snapshot with segments and no recorded event (history off, a library that records
    none): the picture is the block layout at the end, not an empty timeline, and says why."""
    snap = {**recorded_snapshot(), "device_traces": [[]]}
    r = analyze(snap)
    assert r.events == 0 and r.layout_end
    bundle = r._repr_mimebundle_()
    check_bundle(bundle, kind="trace")
    ((png, alt),) = images(bundle["text/html"])
    assert alt == (f"{r.nothing_recorded()} "
                   f"Block layout at the end: 4 segments of GPU memory ("
                   f"{format_bytes(sum(s['total_size'] for s in snap['segments']))} reserved), "
                   "one row each, with 5 allocated blocks "
                   f"({format_bytes(r.end_allocated)}) and "
                   f"{format_bytes(r.end_reserved - r.end_allocated)} cached free.")
    image = png_image(png)
    assert image.shape[0] < 400  # the layout alone, no timeline above it
    assert pixels_of(image, STATE_COLORS["active_allocated"]) > 1000
    quiet = analyze(snap)
    quiet.picture = False  # --no-plot: no picture, as asked
    check_bundle(quiet._repr_mimebundle_(), pictures=0, kind="trace")


def test_trace_result_plots_and_files(tmp_path) -> None:
    snap = recorded_snapshot()
    r = analyze(snap)
    (alloc,) = [line for line in r.plot().lines if line.get_gid() == "allocated"]
    assert alloc.get_ydata().tolist() == r.allocated.tolist()
    peak = r.segments_at("peak")
    assert sum(b["size"] for s in peak for b in s["blocks"]
               if b["state"] != "inactive") == r.peak_allocated
    # one drawn block per block of the layout asked for: at the end, at the peak, after event 0
    assert colours_drawn(r.plot_segments("end")) == state_colours(snap["segments"])
    assert colours_drawn(r.plot_segments("peak")) == state_colours(peak)
    after_first = replay_segments(snap, 1)
    assert len(after_first) == 1  # the first event made one segment
    ax = r.plot_segments(0)
    assert blocks_drawn(ax) == len(after_first[0]["blocks"])
    assert len(ax.get_yticklabels()) == 1
    # the picture of the bundle: the timeline, then the layouts at the peak and at the end
    timeline, at_peak, at_end = r.figure().axes
    assert [line.get_gid() for line in timeline.lines][:2] == ["reserved", "allocated"]
    assert colours_drawn(at_peak) == state_colours(peak)  # the 700 MiB block allocated
    assert colours_drawn(at_end) == state_colours(snap["segments"])  # and freed
    assert state_colours(peak) != state_colours(snap["segments"])
    with pytest.raises(ValueError, match="at must be 'peak', 'end' or an event index"):
        r.plot_segments("start")  # type: ignore[arg-type]
    r.save(tmp_path / "r.json")
    assert load_snapshot(tmp_path / "r.json")["segments"] == json.loads(
        json.dumps(snap["segments"]))  # tuples come back as lists
    if BUILT or os.environ.get("CI") == "true":
        r.save_html(tmp_path / "r.html")
        page = (tmp_path / "r.html").read_text("utf-8")
        assert '"surviving":[{' in page  # the trace's tables travel with the page


def test_palette_png_keeps_the_flat_colours_exact() -> None:
    """A picture stored with a palette of its most used colours: the flat areas keep their
    exact colour, the anti-aliased edges take the nearest one kept, and the file shrinks."""
    from matplotlib.figure import Figure

    from jupyter_gpumem.render.display import PALETTE_COLOURS, palette_png

    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    for i in range(40):  # anti-aliased diagonals: far more than 256 colours at their edges
        ax.plot([0, 1], [i / 40, 1 - i / 40], color=f"C{i % 10}", linewidth=1.3)
    ax.barh([0.5], [0.5], height=0.2, color=STATE_COLORS["active_allocated"])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    full = buf.getvalue()
    small = palette_png(full)
    before, after = png_image(full), png_image(small)
    assert before.shape == after.shape
    assert len(np.unique(before.reshape(-1, 4), axis=0)) > 256
    assert len(np.unique(after.reshape(-1, 4), axis=0)) <= PALETTE_COLOURS == 64
    for colour in (STATE_COLORS["active_allocated"], "#ffffff"):
        def exact(image: np.ndarray, c: str = colour) -> np.ndarray:
            return (np.abs(image[..., :3] - to_rgb(c)) < 1.5 / 255).all(axis=-1)

        assert exact(before).sum() > 1000
        assert (exact(after) | ~exact(before)).all()  # every pixel of it keeps it exactly
    assert len(small) < len(full)
