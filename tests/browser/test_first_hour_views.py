"""What a new user saw in the first hour (issue 21), in headless Chromium: JupyterLab and
Notebook 7 on the simulated device.

- a bare ``%gpumem`` on an empty device, run live in JupyterLab: its status line shows (not
  only in the saved file), no frozen "0 segments" layout, a short live mini view whose y axis
  reads in sizes (no lone "1 B" tick) and whose legend does not claim NVML
  (``first-hour-status.png``);
- a saved notebook opened with no kernel: ``%gpumem``'s status line in Notebook 7 too; the block
  layout of ``%gpumem snapshot`` draws its 16 MiB and 92 MiB segments to scale and explains the
  pool mark at each row's start; a block's tip names its holder and says nothing of a trace
  the snapshot does not have (``first-hour-layout.png``, ``first-hour-tip.png``); the replay
  comparison under a 2 GiB cap, as its picture shows it (``first-hour-replay.png``);
- JupyterLab's dark theme: the segment labels, the axis labels and the allocated curve read
  light on dark (``first-hour-dark.png``);
- the offline page of a traced cell that raised: one title, and it says what raised
  (``first-hour-raised-page.png``).

Under ``CI=true`` a missing Chromium or playwright fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from saved_views import (
    ARTIFACTS,
    browser_page,
    copy_without_kernel,
    execute_saved_notebook,
    live_view,
    need,
    need_browser,
    notebook_json,
    open_and_run,
    open_without_kernel,
)

pytestmark = pytest.mark.browser

MiB = 1 << 20

#: The saved notebook: the status line with segments, a snapshot of two large segments of
#: 16 MiB and 92 MiB (and a small one), and a replay under a 2 GiB cap.
SAVED = [
    "%load_ext jupyter_gpumem\n%gpumem device sim",
    "import jupyter_gpumem as gm\na = gm.get_allocator()\nMiB = 1 << 20\n"
    "kept = [gm.caching_allocator_alloc(n) for n in (16 * MiB, 92 * MiB, 300 * 1024)]",
    "%gpumem",
    "%gpumem snapshot",
    "%gpumem history on\n%gpumem limit 2GiB",
    "xs = [a.malloc(n * MiB) for n in (300, 500, 700)]\nfor p in xs[::2]:\n    a.free(p)\n"
    "big = a.malloc(1200 * MiB)",
    "%gpumem replay last --config recorded --config expandable_segments:True",
    "%%gpumem_trace\nys = [a.malloc(40 * MiB) for _ in range(3)]",
]
STATUS, SNAPSHOT, REPLAY, TRACE = 2, 3, 6, 7


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return execute_saved_notebook(tmp_path_factory.mktemp("first-hour") / "first-hour.ipynb",
                                  SAVED)


def _lightness(css_colour: str) -> float:
    """0 (black) to 1 (white) of an ``rgb(...)``/``rgba(...)`` colour as the browser computes it."""
    parts = css_colour[css_colour.index("(") + 1:css_colour.index(")")].split(",")
    r, g, b = (float(p) for p in parts[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def test_status_on_an_empty_device_in_jupyterlab(lab: tuple[str, Path]) -> None:
    need_browser()
    url, notebooks = lab
    name = f"first-hour-{uuid.uuid4().hex[:8]}.ipynb"
    (notebooks / name).write_text(json.dumps(notebook_json(
        "%load_ext jupyter_gpumem\n%gpumem device sim", "%gpumem")))
    with browser_page("first-hour-status-page.png", height=1000) as page:
        open_and_run(page, url, name)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        live = live_view(page, cell)
        # the status line is shown, as its own output, above the live view
        status = cell.locator(".jp-OutputArea-output", has_text="gpumem · sim device 0")
        assert status.count() == 1
        assert status.inner_text().startswith(
            "gpumem · sim device 0 (Simulated GPU 0) · allocated 0 B (peak 0 B) · reserved 0 B")
        # no layout frozen at "0 segments" on an empty device
        assert cell.locator("div.gm-view[data-kind=snapshot]").count() == 0
        assert "0 segments" not in cell.inner_text()
        # a mini view: the timeline 150 px tall, an axis of sizes, a legend of what it reads
        timeline = live.locator("svg.gm-timeline")
        assert timeline.get_attribute("height") == "150"
        ticks = live.locator("text.gm-ytick").evaluate_all("ts => ts.map(t => t.textContent)")
        assert "1 B" not in ticks and ticks[-1] == "1 MiB" and len(ticks) >= 3
        legend = live.locator(".gm-legend").inner_text()
        assert "NVML" not in legend and "allocated" in legend and "reserved" in legend
        assert live.bounding_box()["height"] < 320
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(ARTIFACTS / "first-hour-status.png"))


def test_saved_layout_to_scale_with_holders_and_the_replay(
        saved: dict[str, Any], lab: tuple[str, Path]) -> None:
    need_browser()
    url, root = lab
    name = copy_without_kernel(saved, root, "first-hour saved")
    with browser_page("first-hour-saved-page.png", height=1400) as page:
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        cells = page.locator(".jp-Notebook .jp-Cell")
        status = cells.nth(STATUS)
        status.scroll_into_view_if_needed()
        status.locator("div.gm-view[data-kind=snapshot]").wait_for(timeout=30_000)
        assert status.locator(".jp-OutputArea-output",
                              has_text="gpumem · sim device 0").count() == 1
        assert "block layout when cell [" in status.inner_text()

        view = cells.nth(SNAPSHOT).locator("div.gm-view[data-kind=snapshot]")
        view.scroll_into_view_if_needed()
        rows = view.locator("svg.gm-layout rect.gm-segment")
        assert rows.count() == 3
        widths = sorted(float(w) for w in rows.evaluate_all(
            "rs => rs.map(r => r.getAttribute('width'))"))
        small, mid, large = widths
        assert mid / large == pytest.approx(16 / 92, rel=0.01)  # 16 MiB and 92 MiB, to scale
        assert small >= 48  # the 2 MiB small-pool segment: never narrower than its minimum
        head = view.locator(".gm-layout-head").inner_text()
        assert "large pool" in head and "small pool" in head and "rows to scale" in head
        view.screenshot(path=str(ARTIFACTS / "first-hour-layout.png"))

        # the 92 MiB block's tip: who holds it, and no "before the trace" without a trace
        blocks = view.locator("svg.gm-layout rect.gm-block")
        sizes = blocks.evaluate_all("bs => bs.map(b => Number(b.getAttribute('width')))")
        blocks.nth(sizes.index(max(sizes))).hover()
        tip = page.locator(".gm-tip:visible").first
        tip.wait_for(state="visible", timeout=5_000)
        text = tip.inner_text()
        assert text.startswith("92.0 MiB block at ")
        assert "held by kept[1]" in text and "before the trace" not in text
        cells.nth(SNAPSHOT).screenshot(path=str(ARTIFACTS / "first-hour-tip.png"))

        replay = cells.nth(REPLAY)
        replay.scroll_into_view_if_needed()
        picture = replay.locator("img").first
        picture.wait_for(timeout=10_000)
        alt = picture.get_attribute("alt") or ""
        assert "per_process_memory_fraction:0.025" in alt
        assert picture.evaluate("i => i.complete && i.naturalWidth") > 600
        replay.screenshot(path=str(ARTIFACTS / "first-hour-replay.png"))

        # JupyterLab's dark theme: labels and the allocated curve in light ink
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme',"
                      " {theme: 'JupyterLab Dark'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'",
                               timeout=30_000)
        trace = cells.nth(TRACE).locator("div.gm-view[data-kind=trace]")
        trace.scroll_into_view_if_needed()
        for el, prop in ((trace.locator("text.gm-seglabel").first, "fill"),
                         (trace.locator("text.gm-ytick").first, "fill"),
                         (trace.locator("path.gm-allocated").first, "stroke"),
                         (trace.locator(".gm-layout-head").first, "color")):
            colour = el.evaluate(f"e => getComputedStyle(e).{prop}")
            assert _lightness(colour) > 0.5, (prop, colour)
        trace.screenshot(path=str(ARTIFACTS / "first-hour-dark.png"))


def test_notebook7_shows_the_status_line(saved: dict[str, Any], lab: tuple[str, Path]) -> None:
    need_browser()
    import importlib.util

    need("Notebook 7", importlib.util.find_spec("notebook") is not None)
    url, root = lab
    name = copy_without_kernel(saved, root, "first-hour nb7")
    with browser_page("first-hour-nb7-page.png", height=1200) as page:
        open_without_kernel(page, f"{url}/notebooks/{name}")
        status = page.locator(".jp-Notebook .jp-Cell").nth(STATUS)
        status.scroll_into_view_if_needed()
        status.locator("div.gm-view[data-kind=snapshot]").wait_for(timeout=30_000)
        shown = status.locator(".jp-OutputArea-output", has_text="gpumem · sim device 0")
        assert shown.count() == 1
        status.screenshot(path=str(ARTIFACTS / "first-hour-nb7-status.png"))


def test_offline_page_of_a_raised_trace_says_so_once_titled(tmp_path: Path) -> None:
    need_browser()
    from jupyter_gpumem import CachingAllocator, SimulatedDevice
    from jupyter_gpumem.render.trace_result import analyze

    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True, stacks=True)
    kept = [a.malloc(40 * MiB) for _ in range(3)]
    result = analyze(a.snapshot(), title="cell [8]", error=ValueError("boom"))
    for p in kept:
        a.free(p)
    path = tmp_path / "raised.html"
    result.save(path)
    with browser_page("first-hour-raised-page.png", 1200, 900) as page:
        page.goto(path.as_uri())
        view = page.locator("#gm-root div.gm-view")
        view.wait_for(timeout=10_000)
        body = page.locator("body").inner_text()
        assert body.count("cell [8]") == 1  # the title once (the page's own title is the tab's)
        assert page.title() == "cell [8]"
        raised = view.locator(".gm-raised")
        assert raised.inner_text() == ("The traced code raised ValueError: boom — this is what it "
                                       "did until then.")
