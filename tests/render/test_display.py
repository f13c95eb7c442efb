from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from render_workload import MiB, recorded_snapshot

from jupyter_gpumem.data.files import load_snapshot
from jupyter_gpumem.render.display import MIME_SCHEMA_VERSION, MIME_TYPE, SnapshotView
from jupyter_gpumem.render.trace_result import analyze

PNG = b"\x89PNG\r\n\x1a\n"


def test_snapshot_view_bundle() -> None:
    view = SnapshotView(recorded_snapshot())
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "image/png", MIME_TYPE}
    assert bundle["image/png"][:8] == PNG
    assert bundle[MIME_TYPE]["schema"] == MIME_SCHEMA_VERSION
    assert bundle[MIME_TYPE]["snapshot"]["segments"]
    assert "4 segments" in bundle["text/plain"]
    json.dumps(bundle[MIME_TYPE])  # plain data
    assert len(repr(view)) < 200


def test_trace_result_fields() -> None:
    snap = recorded_snapshot()
    r = analyze(snap, title="cell 3")
    assert r.top_sites[0].bytes == 700 * MiB and r.top_sites[0].count == 1
    assert r.top_sites[0].site.endswith(tuple(f":{n}" for n in range(1, 100)))
    assert r.peak_allocated == max(r.timeline.allocated)
    assert {b.size for b in r.surviving} >= {300 * MiB, 100 * MiB}
    assert all(b.site and "render_workload.py" in b.site for b in r.surviving)
    r.surviving[0] = dataclasses.replace(r.surviving[0], holders=("weights",))
    data = r.to_json()
    assert data["surviving"][0]["holders"] == ["weights"]
    assert data["kind"] == "trace" and data["schema"] == MIME_SCHEMA_VERSION


def test_trace_result_bundle_and_repr_are_cheap() -> None:
    r = analyze(recorded_snapshot())
    bundle = r._repr_mimebundle_()
    assert bundle["image/png"][:8] == PNG
    assert bundle[MIME_TYPE]["snapshot"]["device_traces"][0]
    assert len(repr(r)) < 120 and "events" in repr(r)
    assert "\n" in bundle["text/plain"]


def test_trace_result_plots_and_files(tmp_path) -> None:
    r = analyze(recorded_snapshot())
    assert r.plot().get_gid() is None
    peak = r.segments_at("peak")
    assert sum(b["size"] for s in peak for b in s["blocks"]
               if b["state"] != "inactive") == r.peak_allocated
    assert r.plot_segments("end") is not None and r.plot_segments(0) is not None
    r.save(tmp_path / "r.json")
    assert load_snapshot(tmp_path / "r.json")["segments"]
    r.save_html(tmp_path / "r.html")
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_import_is_lazy() -> None:
    code = ("import sys, jupyter_gpumem; assert 'matplotlib' not in sys.modules; "
            "assert 'jupyter_gpumem.render.plots' not in sys.modules; "
            "f = jupyter_gpumem.save_html; assert 'matplotlib' not in sys.modules; "
            "jupyter_gpumem.plot_timeline")
    subprocess.run([sys.executable, "-c", code], check=True)
