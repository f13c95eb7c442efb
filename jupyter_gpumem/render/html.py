"""One self-contained HTML file that draws a snapshot's timeline and block layout, offline.

No network: the page is inline HTML, CSS and a small vanilla-JS viewer (``static/viewer.js`` beside
this module), with the data embedded as JSON whose large columns are base64 little-endian typed
arrays. The layout at any event is rebuilt in the browser from the lives of blocks and segments
(``start <= k < end``), so the slider is exact at every event, not only at a few checkpoints.

``build_payload`` is the same data the widget can send.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from jupyter_gpumem.data.codes import SHOWN_FRAMES, SHOWN_OOMS
from jupyter_gpumem.data.devices import device_segments, snapshot_device
from jupyter_gpumem.data.timeline import (
    Timeline,
    build_timeline,
    cell_boundaries,
    downsample,
    live_intervals,
    oom_indices,
    peak_index,
    segment_lives,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, Snapshot

#: Version of the payload layout that the viewer reads.
PAYLOAD_SCHEMA = 1


def _b64(a: np.ndarray[Any, Any], dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


def _frame_text(f: Frame) -> str:
    return f"{f['name']} ({f['filename']}:{f['line']})"


def build_payload(snapshot: Snapshot, *, device: int | None = None, max_points: int = 4000,
                  timeline: Timeline | None = None, title: str = "",
                  cell_files: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The viewer's data: a downsampled timeline, and the lives of every block and segment.

    Columns are base64 strings of little-endian arrays: ``f8`` for bytes, addresses and times
    (exact below 2**53), ``i4`` for event indices and ids. Pass ``timeline`` to reuse one;
    ``cell_files`` (a cell's source file name -> its number) names sites ``cell [N] line L``.
    """
    device = snapshot_device(snapshot, device)
    tl = (timeline if timeline is not None
          else build_timeline(snapshot, device, cell_files=cell_files))
    n = len(tl)
    info = snapshot.get("jupyter_gpumem") or {}
    segments = device_segments(snapshot, device)

    at = np.union1d(downsample(tl.allocated, max_points), downsample(tl.reserved, max_points))
    iv = live_intervals(tl)
    # Blocks older than the trace are the snapshot's own (``tl.old``), with addresses and
    # stacks; bytes older than the trace with no block to show (address 0) are left out.
    keep = iv.seen | (iv.addr != 0)
    stacks = [[_frame_text(f) for f in s[:SHOWN_FRAMES]] for s in tl.stacks]
    blocks = {
        "start": _b64(np.where(iv.seen, iv.start, -1)[keep], "<i4"),
        "end": _b64(iv.end[keep], "<i4"),
        "addr": _b64(iv.addr[keep], "<f8"),
        "size": _b64(iv.size[keep], "<f8"),
        "req": _b64(iv.requested[keep], "<f8"),
        "stack": _b64(iv.stack[keep], "<i4"),
        "site": _b64(iv.site[keep], "<i4"),
        "cell": _b64(iv.cell[keep], "<i4"),
    }
    sl = segment_lives(tl, segments)
    segs = {
        "start": _b64(sl.start, "<i4"), "end": _b64(sl.end, "<i4"),
        "addr": _b64(sl.addr, "<f8"), "size": _b64(sl.size, "<f8"),
        "stream": _b64(sl.stream, "<f8"), "small": _b64(sl.small, "<i4"),
    }
    return {
        "schema": PAYLOAD_SCHEMA,
        "title": title,
        "device_name": str(info.get("device_name", "")),
        "n": n,
        "timeline": {
            "index": _b64(at, "<i4"),
            "time_us": _b64(tl.time_us[at] if n else at, "<f8"),
            "allocated": _b64(tl.allocated[at] if n else at, "<f8"),
            "reserved": _b64(tl.reserved[at] if n else at, "<f8"),
        },
        "start_allocated": tl.start_allocated,
        "start_reserved": tl.start_reserved,
        "peak": peak_index(tl),
        "peak_allocated": int(tl.allocated[peak_index(tl)]) if n else 0,
        "cells": cell_boundaries(tl),
        "ooms": oom_indices(tl)[:SHOWN_OOMS].tolist(),
        "blocks": blocks,
        "segments": segs,
        "stacks": stacks,
        "sites": list(tl.sites),
    }


def _script_json(data: object) -> str:
    """JSON that is safe inside ``<script>``: no ``</script>``, no ``<!--``, no ``//``."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("/", "\\/"))


def render_html(snapshot: Snapshot, *, title: str = "GPU memory", device: int | None = None,
                timeline: Timeline | None = None,
                cell_files: Mapping[str, int] | None = None) -> str:
    """The whole page as a string."""
    payload = build_payload(snapshot, device=device, timeline=timeline, title=title,
                            cell_files=cell_files)
    viewer = resources.files(__package__).joinpath("static", "viewer.js").read_text("utf-8")
    script = "\n" + viewer + "\n"
    # The page may run its own script and style and nothing else: no network, no inline event
    # handlers, no other script even if some data did break out of its element.
    csp = (f"default-src 'none'; script-src {_hash(script)}; style-src {_hash(_STYLE)}; "
           "base-uri 'none'; form-action 'none'")
    return _PAGE.format(title=html.escape(title), data=_script_json(payload), script=script,
                        style=_STYLE, csp=html.escape(csp))


def _hash(text: str) -> str:
    """A Content-Security-Policy source for an inline element holding exactly ``text``."""
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def save_html(snapshot: Snapshot, path: str | os.PathLike[str], *, title: str | None = None,
              device: int | None = None, timeline: Timeline | None = None,
              cell_files: Mapping[str, int] | None = None) -> str:
    """Write the page to ``path`` (UTF-8); returns the path written."""
    if title is None:
        title = f"GPU memory · {os.path.basename(os.fspath(path))}"
    text = render_html(snapshot, title=title, device=device, timeline=timeline,
                       cell_files=cell_files)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)


_STYLE = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 16px; margin: 0 0 4px; }
#gm-info { color: #555; margin-bottom: 8px; }
canvas { display: block; width: 100%; }
#gm-controls { display: flex; gap: 8px; align-items: center; margin: 6px 0; }
#gm-slider { flex: 1; }
#gm-tip { position: fixed; pointer-events: none; background: #fff; border: 1px solid #999;
  padding: 6px 8px; font: 12px ui-monospace, monospace; white-space: pre; display: none;
  max-width: 70vw; overflow: hidden; box-shadow: 0 2px 6px rgba(0,0,0,.2); }
.gm-key span { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; }
.gm-key .allocated { background: #1f77b4; }
.gm-key .rounding { background: #9ecae1; }
.gm-key .cached { background: #d9d9d9; }
.gm-key .small { background: #9467bd; }
.gm-key .large { background: #2ca02c; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
<div id="gm-info"></div>
<canvas id="gm-timeline" height="220"></canvas>
<div id="gm-controls">
<button id="gm-peak">peak</button><button id="gm-end">end</button>
<input id="gm-slider" type="range" min="-1" value="0" step="1">
<span id="gm-at"></span>
</div>
<div class="gm-key"><span class="allocated"></span>allocated
<span class="rounding"></span>lost to rounding
<span class="cached"></span>cached free
<span class="small"></span>small pool
<span class="large"></span>large pool</div>
<canvas id="gm-layout" height="100"></canvas>
<div id="gm-tip"></div>
<script type="application/json" id="gm-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
