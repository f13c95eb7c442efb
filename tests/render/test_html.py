from __future__ import annotations

import json
import re

import numpy as np
import pytest
from render_workload import recorded_allocator, recorded_snapshot
from view_assets import needs_dist

from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.render.html import dist_asset, render_html, save_html
from jupyter_gpumem.render.view_payload import build_view, decode_column


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="gm-data">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1))


@needs_dist
def test_page_is_self_contained() -> None:
    page = render_html(recorded_snapshot(), title="t")
    # the SVG namespace names the element kind in createElementNS: an identifier, never fetched
    lowered = page.lower().replace('"http://www.w3.org/2000/svg"', '"svg-namespace"')
    for bad in ("http://", "https://", "//cdn", "<link", " src="):
        assert bad not in lowered
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert '<div id="gm-root"></div>' in page
    assert dist_asset("viewer.js") in page and dist_asset("view.css") in page


@needs_dist
def test_data_round_trips() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    data = _data(render_html(snap))
    assert data == json.loads(json.dumps(build_view(snap, title="GPU memory")))
    assert data["schema"] == 2 and data["n_events"] == len(tl)
    idx = decode_column(data["timeline"]["index"])
    assert np.array_equal(decode_column(data["timeline"]["allocated"]), tl.allocated[idx])
    assert np.array_equal(decode_column(data["timeline"]["reserved"]), tl.reserved[idx])
    assert data["peak"]["index"] == int(tl.allocated.argmax())


@needs_dist
def test_embedded_lives_give_the_replayed_layout_at_every_event() -> None:
    a = recorded_allocator()
    a.record_history(True, max_entries=60)  # keep only the tail: blocks older than the trace
    a.free(a.malloc(5 << 20))
    snap = a.snapshot()
    data = _data(render_html(snap))
    b = data["lives"]["blocks"]
    start, end = decode_column(b["start"]), decode_column(b["end"])
    addr = decode_column(b["addr"]).astype(int)
    for k in range(-1, data["n_events"]):
        live = set(addr[(start <= k) & (k < end)].tolist())
        replayed = {blk["address"] for s in replay_segments(snap, k + 1) for blk in s["blocks"]
                    if blk["state"] != "inactive"}
        assert live == replayed, k


@needs_dist
def test_escaping_of_title_and_filenames() -> None:
    snap = recorded_snapshot()
    evil = "</script><script>alert(1)</script>"
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            for f in b["frames"]:
                f["filename"] = evil + "https://x"
    for e in snap["device_traces"][0]:
        for f in e["frames"]:
            f["filename"] = evil
    page = render_html(snap, title=evil)
    assert page.count("</script>") == 2
    assert "<script>alert" not in page
    assert "&lt;/script&gt;" in page  # the title, escaped
    assert "https://" not in page
    data = _data(page)
    assert any(evil in f[0] for st in data["stacks"] for f in st)  # it survives, escaped


@needs_dist
def test_save_html(tmp_path) -> None:
    path = tmp_path / "a<script>alert(1)&.html"
    out = save_html(recorded_snapshot(), path)
    text = path.read_text("utf-8")
    assert out == str(path) and text.count("<script") == 2
    assert "<script>alert" not in text and "a&lt;script&gt;alert(1)&amp;.html" in text


@needs_dist
def test_empty_snapshot_renders() -> None:
    data = _data(render_html({"segments": [], "device_traces": []}))
    assert data["n_events"] == 0 and data["peak"]["index"] == -1


def test_a_missing_asset_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="jlpm build"):
        dist_asset("no-such-asset.js")
