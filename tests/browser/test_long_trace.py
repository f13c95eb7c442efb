"""Traces of any length in the browser (issue 22).

- A saved notebook holding a trace of ten million events (``long_trace``), opened in JupyterLab
  with no kernel: the view draws from the saved data alone, a drag-select zooms the timeline
  (where the saved columns run out it says so and names the file with every event), and the
  layout slider moves the layout (exact at the saved checkpoints, and it says so elsewhere).
  The page's time to first draw and its JS heap are printed and written to
  ``test-artifacts/long-trace.json`` (measured, never asserted).
- A live kernel: a traced cell of 300,000 events shows the linked widget; a zoom asks the kernel
  for the window and the view draws the answer (finer columns), and the slider at any event
  gets the layout there from the kernel, the blocks the kernel's replay counts.

Screenshots: ``long-open.png``, ``long-zoomed.png``, ``long-slider.png``, ``long-kernel.png``.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from long_trace import saved_notebook
from saved_views import (
    ARTIFACTS,
    WIDGET,
    blocks_after,
    browser_page,
    need_browser,
    notebook_json,
    open_and_run,
    open_without_kernel,
    running_kernels,
)

pytestmark = pytest.mark.browser

EVENTS = 10_000_000


def _drag(page: Any, svg: Any, a: float, b: float) -> None:
    """Drag over the plot of a timeline from ``a`` to ``b`` (fractions of its width)."""
    box = svg.bounding_box()
    left, width = box["x"] + 70, box["width"] - 84  # the plot's own box (timeline.ts PAD)
    y = box["y"] + box["height"] / 2
    page.mouse.move(left + a * width, y)
    page.mouse.down()
    page.mouse.move(left + b * width, y, steps=6)
    page.mouse.up()


def _slide(view: Any, k: int) -> None:
    view.locator("input.gm-slider").evaluate(
        "(s, k) => { s.value = String(k); s.dispatchEvent(new Event('input', {bubbles: true})); }",
        k)


def _when(view: Any, test: str, timeout_ms: int = 30_000) -> None:
    """Wait until ``test`` (JS of ``v``, the view's node) holds."""
    view.evaluate(
        "(v, [test, ms]) => new Promise((ok, no) => {"
        " const f = new Function('v', 'return ' + test); const t0 = Date.now();"
        " const poll = () => f(v) ? ok(true) : Date.now() - t0 > ms ?"
        " no(new Error('timed out: ' + test)) : setTimeout(poll, 20); poll(); })",
        [test, timeout_ms])


#: In the page from its start: when the notebook's cells are in the page, when the saved output
#: (the widget's) is, when our view's node is made, and when its timeline has curves (ms since
#: the page's start; marks in one task share a time).
_WATCH = """
window.__gm = {};
new MutationObserver(() => {
  const t = performance.now(), g = window.__gm;
  if (g.cells === undefined && document.querySelector('.jp-Notebook .jp-Cell')) { g.cells = t; }
  if (g.output === undefined && document.querySelector(
      "[data-mime-type='application/vnd.jupyter.widget-view+json']")) { g.output = t; }
  if (g.view === undefined && document.querySelector('div.gm-view')) { g.view = t; }
  if (g.drawn === undefined && document.querySelector('svg.gm-timeline path.gm-curve')) {
    g.drawn = t;
  }
}).observe(document, {childList: true, subtree: true, attributes: true});
"""


def _heap(page: Any) -> dict[str, float]:
    """The page's JS heap: Chromium's own metrics (CDP) and ``performance.memory``."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    memory = page.evaluate("() => performance.memory ? performance.memory.usedJSHeapSize : -1")
    return {"JSHeapUsedSize": metrics.get("JSHeapUsedSize", -1.0),
            "JSHeapTotalSize": metrics.get("JSHeapTotalSize", -1.0),
            "performance.memory.usedJSHeapSize": float(memory)}


def test_ten_million_events_open_zoom_and_slide_with_no_kernel(lab: tuple[str, Path]) -> None:
    need_browser()
    url, root = lab
    t0 = time.perf_counter()
    name, payload = saved_notebook(root, EVENTS)
    made_s = time.perf_counter() - t0
    notebook_mb = (root / name).stat().st_size / 1e6
    n = payload["n_events"]
    assert n == EVENTS and payload["full_trace"] == "run.gpumem"
    assert (root / "run.gpumem").stat().st_size > 0
    lives = payload["lives"]
    peak, end = payload["peak"]["index"], n - 1
    assert lives["checkpoints"] and peak in lives["checkpoints"]
    at_end, at_peak = blocks_after(payload, end), blocks_after(payload, peak)
    assert at_end != at_peak  # the spike is live at the peak only
    with browser_page("long-page.png", 1300, 1500) as page:
        page.add_init_script(_WATCH)
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        view = page.locator("div.gm-view[data-kind=trace]")
        view.wait_for(timeout=60_000)
        svg = view.locator("svg.gm-timeline")
        _when(view, "v.querySelectorAll('svg.gm-timeline path.gm-curve').length >= 2")
        marks = page.evaluate("() => window.__gm")
        heap = _heap(page)
        view.scroll_into_view_if_needed()
        assert int(view.get_attribute("data-at") or -2) == end
        assert int(view.get_attribute("data-blocks") or -1) == at_end
        assert svg.get_attribute("data-per-column") == str(payload["timeline"]["per_column"])
        view.screenshot(path=str(ARTIFACTS / "long-open.png"))

        # zoom: a drag over a twentieth of the plot shows that window, and says it is coarse
        _drag(page, svg, 0.40, 0.45)
        _when(view, "Number(v.querySelector('svg.gm-timeline').dataset.x1)"
                    " - Number(v.querySelector('svg.gm-timeline').dataset.x0) < 1e6")
        x0, x1 = float(svg.get_attribute("data-x0")), float(svg.get_attribute("data-x1"))
        assert 0.39 * n < x0 < x1 < 0.46 * n
        note = view.locator(".gm-note")
        assert note.is_visible() and "coarse" in note.inner_text()
        assert "run.gpumem" in note.inner_text()
        view.screenshot(path=str(ARTIFACTS / "long-zoomed.png"))

        # the slider: at the peak (a checkpoint) the layout is the saved one there, exactly
        _slide(view, peak)
        _when(view, f"v.dataset.at === '{peak}'")
        assert int(view.get_attribute("data-blocks") or -1) == at_peak
        # elsewhere: the nearest checkpoint, and the view says so
        wanted = n // 3 + 1
        _slide(view, wanted)
        _when(view, f"v.dataset.at !== '{peak}'")
        shown = int(view.get_attribute("data-at") or -2)
        assert shown in lives["checkpoints"] and shown != wanted
        assert int(view.get_attribute("data-blocks") or -1) == blocks_after(payload, shown)
        assert "exact at" in view.locator(".gm-layout-note").inner_text()
        view.screenshot(path=str(ARTIFACTS / "long-slider.png"))
        assert running_kernels(url) == []  # drawn from the saved data alone
    figures = {"events": n, "notebook_mb": round(notebook_mb, 3), "made_s": round(made_s, 1),
               # since the page's start (JupyterLab loads, the kernel dialog is answered)
               "first_draw_ms": round(marks["drawn"]),
               # since the notebook's cells are in the page: its outputs rendered, the widget
               # given up (no kernel), ours decoded and drawn
               "cells_to_draw_ms": round(marks["drawn"] - marks.get("cells", 0)),
               **{k: round(v) for k, v in heap.items()}}
    (ARTIFACTS / "long-trace.json").write_text(json.dumps(figures, indent=1))
    print(f"\n10 M-event saved notebook: {figures}")


LIVE_CELL = """%%gpumem_trace -o t
import jupyter_gpumem as gm
a = gm.get_allocator()
MiB = 1 << 20
kept = []
for i in range(100_000):
    kept.append(a.malloc((1 + i % 7) * MiB))
    if len(kept) > 40:
        a.free(kept.pop(0))"""


def test_a_zoom_asks_the_kernel_and_draws_its_answer(lab: tuple[str, Path]) -> None:
    need_browser()
    url, root = lab
    k = 150_001  # an event the slider will ask the kernel for
    name = f"gpumem-long-{uuid.uuid4().hex[:8]}.ipynb"
    (root / name).write_text(json.dumps(notebook_json(
        "%load_ext jupyter_gpumem\n%gpumem device sim", LIVE_CELL,
        f"print('blocks at', {k}, sum(b['state'] == 'active_allocated'"
        f" for s in t.segments_at({k}) for b in s['blocks']))")))
    with browser_page("long-kernel-page.png", 1300, 1400) as page:
        open_and_run(page, url, name)
        view = page.locator(f"{WIDGET} div.gm-view[data-kind=trace]")
        view.wait_for(timeout=120_000)
        _when(view, "v.dataset.detail === 'kernel'")
        printed = page.locator(".jp-OutputArea-output:has-text('blocks at')")
        printed.wait_for(timeout=60_000)
        expected = int(printed.inner_text().split()[-1])
        view.scroll_into_view_if_needed()
        svg = view.locator("svg.gm-timeline")
        saved_per_column = int(svg.get_attribute("data-per-column") or 0)
        assert saved_per_column > 1 and (svg.get_attribute("data-series") or "").startswith("0,")

        # zoom into a hundredth: the kernel answers with that window, a column an event or two
        _drag(page, svg, 0.50, 0.51)
        _when(view, "!v.querySelector('svg.gm-timeline').dataset.series.startsWith('0,')")
        lo, hi = map(int, (svg.get_attribute("data-series") or "").split(","))
        x0, x1 = float(svg.get_attribute("data-x0")), float(svg.get_attribute("data-x1"))
        assert lo <= x0 < x1 <= hi
        assert int(svg.get_attribute("data-per-column") or 0) < saved_per_column
        assert view.locator(".gm-note").is_hidden()  # not coarse: nothing to say

        # the slider at an event no checkpoint holds: the kernel's layout there
        _slide(view, k)
        _when(view, f"v.dataset.at === '{k}' && v.dataset.layout === 'kernel'")
        assert int(view.get_attribute("data-blocks") or -1) == expected
        view.screenshot(path=str(ARTIFACTS / "long-kernel.png"))
