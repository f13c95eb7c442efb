from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from render_workload import MiB, recorded_allocator, recorded_snapshot, two_device_snapshot

from jupyter_gpumem.data.codes import FREE_REQUESTED
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.render.html import build_payload, render_html, save_html


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="gm-data">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1))


def _col(s: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)


def test_page_is_self_contained() -> None:
    page = render_html(recorded_snapshot(), title="t")
    lowered = page.lower()
    for bad in ("http://", "https://", "//cdn", "<link", " src="):
        assert bad not in lowered
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert 'id="gm-timeline"' in page and 'id="gm-layout"' in page


def test_data_round_trips() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    data = _data(render_html(snap))
    assert data == json.loads(json.dumps(build_payload(snap, title="GPU memory")))
    assert data["n"] == len(tl)
    idx = _col(data["timeline"]["index"], "<i4")
    assert np.array_equal(_col(data["timeline"]["allocated"], "<f8"), tl.allocated[idx])
    assert np.array_equal(_col(data["timeline"]["reserved"], "<f8"), tl.reserved[idx])
    assert data["peak"] == int(tl.allocated.argmax())


def _layout_from_payload(data: dict, k: int) -> tuple[set, set]:
    b, s = data["blocks"], data["segments"]
    live = (_col(b["start"], "<i4") <= k) & (k < _col(b["end"], "<i4"))
    blocks = set(zip(_col(b["addr"], "<f8")[live].astype(int).tolist(),
                     _col(b["size"], "<f8")[live].astype(int).tolist(), strict=True))
    live = (_col(s["start"], "<i4") <= k) & (k < _col(s["end"], "<i4"))
    segs = set(zip(_col(s["addr"], "<f8")[live].astype(int).tolist(),
                   _col(s["size"], "<f8")[live].astype(int).tolist(), strict=True))
    return blocks, segs


def _layout_from_replay(snap: dict, k: int) -> tuple[set, set]:
    segs = replay_segments(snap, k + 1)
    return ({(b["address"], b["size"]) for s in segs for b in s["blocks"]
             if b["state"] != "inactive"}, {(s["address"], s["total_size"]) for s in segs})


def test_embedded_lives_give_the_replayed_layout_at_every_event() -> None:
    a = recorded_allocator()
    a.record_history(True, max_entries=60)  # keep only the tail: blocks older than the trace
    a.free(a.malloc(5 << 20))
    snap = a.snapshot()
    tl = build_timeline(snap)
    data = build_payload(snap)
    for k in range(-1, len(tl)):
        if k >= 0 and tl.action[k] == FREE_REQUESTED:
            continue
        assert _layout_from_payload(data, k) == _layout_from_replay(snap, k), k


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
    assert any(evil in site for site in data["sites"])  # the text survives, only escaped


def test_save_html(tmp_path) -> None:
    path = tmp_path / "a<script>alert(1)&.html"
    out = save_html(recorded_snapshot(), path)
    text = path.read_text("utf-8")
    assert out == str(path) and text.count("<script") == 2
    assert "<script>alert" not in text and "a&lt;script&gt;alert(1)&amp;.html" in text


def test_empty_snapshot_renders() -> None:
    data = _data(render_html({"segments": [], "device_traces": []}))
    assert data["n"] == 0 and data["peak"] == -1


_NODE_STUB = r"""
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const data = page.match(/id="gm-data">([\s\S]*?)<\/script>/)[1];
const script = page.match(/<script>\n([\s\S]*?)<\/script>/)[1];
const ctx = new Proxy({}, { get: (t, k) => (k in t ? t[k] : () => {}),
                           set: (t, k, v) => { t[k] = v; return true; } });
const els = {};
function el(id) {
  if (!els[id]) els[id] = { id, style: {}, dataset: {}, textContent: id === "gm-data" ? data : "",
    clientWidth: 800, addEventListener() {}, getContext: () => ctx,
    getBoundingClientRect: () => ({ left: 0, top: 0, width: 800 }) };
  return els[id];
}
global.document = { getElementById: el };
global.window = { devicePixelRatio: 1, innerWidth: 1000, addEventListener() {} };
global.atob = (s) => Buffer.from(s, "base64").toString("binary");
eval(script);
const v = window.gpumemViewer, out = {};
for (const k of JSON.parse(process.argv[3])) {
  v.setAt(k);
  out[k] = { segments: +els["gm-layout"].dataset.segments, blocks: +els["gm-layout"].dataset.blocks,
             layout: v.layoutAt(k).map(s => [s.addr, s.size, s.blocks.length]) };
}
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_the_viewer_script_runs_and_lays_out_blocks(tmp_path) -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    page = tmp_path / "p.html"
    save_html(snap, page)
    stub = tmp_path / "stub.js"
    stub.write_text(_NODE_STUB)
    ks = [-1, 0, int(tl.allocated.argmax()), len(tl) - 1]
    run = subprocess.run(["node", str(stub), str(page), json.dumps(ks)], capture_output=True,
                         text=True, timeout=60, check=True)
    out = json.loads(run.stdout)
    for k in ks:
        blocks, segs = _layout_from_replay(snap, k)
        assert out[str(k)]["segments"] == len(segs)
        assert out[str(k)]["blocks"] == len(blocks)
        assert sorted(tuple(s[:2]) for s in out[str(k)]["layout"]) == sorted(segs)


def test_payload_shows_the_traced_device_with_its_older_blocks() -> None:
    # Two devices, history on device 1 only: the page shows device 1, with its segments and
    # the block older than the trace, and its blocks live at the start add to start_allocated.
    snap, old = two_device_snapshot()
    payload = build_payload(snap)
    blocks = {k: _col(v, "<f8" if k in ("addr", "size", "req") else "<i4")
              for k, v in payload["blocks"].items()}
    segs = {k: _col(v, "<f8" if k in ("addr", "size", "stream") else "<i4")
            for k, v in payload["segments"].items()}
    device1 = [s for s in snap["segments"] if s["device"] == 1]
    assert sorted(segs["addr"].astype(int).tolist()) == sorted(s["address"] for s in device1)
    at_start = blocks["start"] < 0
    assert old in blocks["addr"][at_start].astype(int).tolist()
    assert payload["start_allocated"] == 5 * MiB == int(blocks["size"][at_start].sum())
    assert any(s["address"] <= old < s["address"] + s["total_size"] for s in device1
               if s["address"] in segs["addr"][segs["start"] < 0].astype(int).tolist())


def test_page_has_a_content_security_policy_for_its_own_script_and_style() -> None:
    import hashlib
    import html as html_module

    page = render_html(recorded_snapshot(), title="t")
    m = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert m
    policy = dict(part.strip().split(" ", 1) for part in
                  html_module.unescape(m.group(1)).split(";"))
    assert policy["default-src"] == "'none'"

    def sha(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    script = re.search(r"<script>(.*?)</script>", page, re.S)
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert script and style
    assert policy["script-src"] == sha(script.group(1))
    assert policy["style-src"] == sha(style.group(1))
    assert ' style="' not in page  # inline style attributes would be refused
