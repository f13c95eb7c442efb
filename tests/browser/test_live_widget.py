"""Real-browser tests of the live session: JupyterLab in headless Chromium runs a notebook whose
``%%gpumem_trace`` cell shows a live widget while it runs, then the static sampled curve and the
trace with the allocator's blocks (``widget-live.png``, ``widget-static.png``, ``widget.png``: the
trace at the peak), and hostile strings from a loaded snapshot
stay text in the widget and in the offline HTML page.

The widget uses the DOM hooks of every view (``div.gm-view``, ``rect.gm-block``, ``.gm-tip``,
``button.gm-peak``). Screenshots go to ``test-artifacts/``. Under ``CI=true`` a missing Chromium or
playwright fails the tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from saved_views import (
    ARTIFACTS,
    WIDGET,
    WORKLOAD,
    browser_page,
    live_view,
    need_browser,
    notebook_json,
    open_and_run,
    peak_label_hits,
    run_all,
    wait_for_kernel,
    workload_counts,
)

pytestmark = pytest.mark.browser



def test_jupyterlab_draws_the_widget_blocks(lab: tuple[str, Path]) -> None:
    """Run live: while the traced cell runs, its live widget draws the samples it receives; when
    the cell ends, that output becomes the static sampled curve (no widget), and the trace below
    it (our MIME renderer) draws the allocator's blocks, at the end and at the peak."""
    need_browser()

    url, notebooks = lab
    at_end, at_peak = workload_counts()
    name = f"gpumem-{uuid.uuid4().hex[:8]}.ipynb"
    go = f"go-{uuid.uuid4().hex[:8]}"  # the test makes it once it has looked at the live view
    (notebooks / name).write_text(json.dumps(notebook_json(
        "%load_ext jupyter_gpumem\n%gpumem device sim",
        WORKLOAD,
        # the cell keeps running after the workload, so the live view gets samples meanwhile:
        # enough to keep its curve (MIN_PLOTTED), and until the test has looked at it
        "%%gpumem_trace\nimport time, pathlib\nimport jupyter_gpumem as gm\n"
        "kept = run(gm.get_allocator())\n"
        "print('blocks:', gm.get_allocator().memory_stats()['allocation.all.current'])\n"
        f"time.sleep(3)\nfor _ in range(1200):\n    if pathlib.Path({go!r}).exists():\n"
        "        break\n    time.sleep(0.05)",
    )))

    with browser_page("widget-page.png") as page:
        open_and_run(page, url, name)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(2)

        # while the cell runs: the widget view (kind live) draws the samples it receives
        live = live_view(page, cell)
        assert live.locator(".gm-status").inner_text().startswith("live · ")
        assert cell.locator("div.gm-view[data-kind=trace]").count() == 0  # still running
        live.scroll_into_view_if_needed()
        live.screenshot(path=str(ARTIFACTS / "widget-live.png"))
        (notebooks / go).touch()  # the cell may end now

        # the allocator's live blocks, as the cell printed them, are the workload's
        printed = cell.locator(".jp-OutputArea-output:has-text('blocks:')")
        printed.wait_for(timeout=30_000)
        assert printed.inner_text().split() == ["blocks:", str(at_end)]

        # when the cell ends: the trace view below, drawn by our MIME renderer
        view = cell.locator("div.gm-view[data-kind=trace]")
        view.wait_for(timeout=60_000)
        assert view.count() == 1
        assert view.evaluate(f"v => v.closest(\"{WIDGET}\") === null")
        view.scroll_into_view_if_needed()
        page.wait_for_function(
            "n => document.querySelector('div.gm-view[data-kind=trace]').dataset.blocks"
            " === String(n)", arg=at_end, timeout=30_000)
        assert view.locator("svg.gm-layout rect.gm-block").count() == at_end

        # ... and the live output became the static sampled curve: no widget left
        page.wait_for_function(
            f"() => document.querySelectorAll(\"{WIDGET}\").length === 0", timeout=30_000)
        static = cell.locator("div.gm-view[data-kind=live]")
        assert static.count() == 1
        samples = int(static.get_attribute("data-samples") or 0)
        assert samples >= 3
        assert static.locator(".gm-status").inner_text().startswith(
            f"sampled · {samples} samples")

        # hovering a block shows its address and stack
        view.locator("svg.gm-layout rect.gm-block").first.hover()
        tip = page.locator(".gm-tip:visible").first
        tip.wait_for(state="visible", timeout=5_000)
        assert "0x" in tip.inner_text()
        assert "run" in tip.inner_text()  # the function that allocated it

        # the peak, in the browser
        view.locator("button.gm-peak").click()
        page.wait_for_function(
            "n => document.querySelector('div.gm-view[data-kind=trace]').dataset.blocks"
            " === String(n)", arg=at_peak, timeout=10_000)
        assert view.locator("svg.gm-layout rect.gm-block").count() == at_peak

        static.scroll_into_view_if_needed()
        static.screenshot(path=str(ARTIFACTS / "widget-static.png"))
        view.scroll_into_view_if_needed()
        assert peak_label_hits(view) == []
        view.screenshot(path=str(ARTIFACTS / "widget.png"))


# -- hostile data: strings from a loaded snapshot must never run as script ----------------------


def evil(what: str) -> str:
    """A string that runs ``alert`` wherever it is put into markup or a script unescaped."""
    return f"</script><!--<img src=x onerror=alert('{what}')>\"'&<script>alert('{what}')</script>"


def hostile_snapshot(path: Path, *, valid: bool = False) -> None:
    """A real snapshot with history, whose every frame's filename, line and name (and the device
    name) are hostile strings; saved as JSON for the viewers. With ``valid``, lines stay integers
    so that the loader's schema check accepts the file (``%gpumem load``)."""
    from jupyter_gpumem import CachingAllocator, SimulatedDevice
    from jupyter_gpumem.data.columns import plain_snapshot

    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True, stacks=True)
    keep = [a.malloc(n << 20) for n in (3, 25, 1)]
    a.free(a.malloc(8 << 20))
    snap: Any = plain_snapshot(a.snapshot())  # as a JSON file holds it: its dicts are edited
    for p in keep:
        a.free(p)
    count = 0

    def walk(obj: Any) -> None:
        nonlocal count
        if isinstance(obj, dict):
            if {"filename", "line", "name"} <= obj.keys():
                count += 1
                obj.update(filename=evil(f"file{count}"), name=evil(f"name{count}"))
                if not valid:
                    obj["line"] = evil(f"line{count}")
            for value in obj.values():
                walk(value)
        elif isinstance(obj, list):
            for value in obj:
                walk(value)

    walk(snap)
    assert count > 0
    snap.setdefault("jupyter_gpumem", {})["device_name"] = evil("device")
    path.write_text(json.dumps(snap))


def _record_dialogs(page: Any) -> list[str]:
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return dialogs


def test_hostile_snapshot_runs_no_script_in_jupyterlab(lab: tuple[str, Path]) -> None:
    """The widget and the loaded result's rich output show hostile strings as text only."""
    need_browser()

    url, notebooks = lab
    hostile_snapshot(notebooks / "hostile raw.json")
    hostile_snapshot(notebooks / "hostile snap.json", valid=True)
    name = f"gpumem-hostile-{uuid.uuid4().hex[:8]}.ipynb"
    (notebooks / name).write_text(json.dumps(notebook_json(
        "%load_ext jupyter_gpumem\n%gpumem device sim",
        "import json\nfrom jupyter_gpumem import MemoryWidget\n"
        "snap = json.load(open('hostile raw.json'))  # unchecked: the widget escapes anyway\n"
        f"MemoryWidget.from_snapshot(snap, title={evil('title')!r})",
        "%gpumem load 'hostile snap.json'",
        "print('done')")))
    with browser_page("hostile-lab.png", 1300, 1100) as page:
        dialogs = _record_dialogs(page)
        page.goto(f"{url}/lab/tree/{name}?reset")
        wait_for_kernel(page)
        run_all(page)
        page.wait_for_selector(".jp-OutputArea-output:has-text('done')", timeout=90_000)
        view = page.locator(f"{WIDGET} div.gm-view").first
        view.wait_for(timeout=30_000)
        view.scroll_into_view_if_needed()
        assert "onerror=alert('title')" in view.inner_text()  # shown, as text

        # every drawn block's stack is built on hover and on click
        blocks = page.locator("svg.gm-layout rect.gm-block")
        assert blocks.count() >= 3
        shown = ""
        for i in range(blocks.count()):
            blocks.nth(i).hover()
            shown += page.locator(".gm-tip:visible").first.inner_text()
            blocks.nth(i).click()
        assert "onerror=alert('" in shown  # a hostile frame, as text
        page.wait_for_timeout(500)  # an image that fails to load reports asynchronously

        assert dialogs == []
        assert page.locator("img[src='x']").count() == 0
        assert page.locator(".jp-OutputArea-output script:has-text('alert')").count() == 0


def test_offline_html_runs_no_script_and_draws_under_its_csp(tmp_path: Path) -> None:
    """The self-contained page, opened from disk: hostile strings stay text, its own script and
    style run under its Content-Security-Policy with no violation, and other script is refused."""
    need_browser()

    from jupyter_gpumem.render.html import save_html

    hostile_snapshot(tmp_path / "hostile.json")
    page_path = tmp_path / "hostile.html"
    raw = json.loads((tmp_path / "hostile.json").read_text())  # unchecked: the page escapes anyway
    save_html(raw, page_path, title=evil("title"))
    with browser_page(None, 1200, 900) as page:
        dialogs = _record_dialogs(page)
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.add_init_script(
            "window.__violations = [];"
            "document.addEventListener('securitypolicyviolation',"
            " e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));")
        page.goto(page_path.as_uri())
        view = page.locator("#gm-root div.gm-view")
        view.wait_for(timeout=10_000)
        text = page.locator("body").inner_text()
        assert "onerror=alert('device')" in text  # shown, as text
        assert "onerror=alert('title')" in text
        # the viewer drew: the timeline's curves (SVG paths or canvas ink)
        timeline = view.locator(".gm-timeline").first
        if timeline.evaluate("e => e.tagName.toLowerCase()") == "canvas":
            drawn = timeline.evaluate(
                "c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height)"
                ".data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++;"
                " return n; }")
        else:
            drawn = timeline.locator("path").evaluate_all(
                "ps => ps.filter(p => (p.getAttribute('d') || '').length > 20).length")
        assert drawn > 0
        # hover the block layout: the tip shows stacks, as text
        blocks = view.locator("svg.gm-layout rect.gm-block")
        assert blocks.count() > 0
        shown = ""
        for i in range(blocks.count()):
            blocks.nth(i).hover()
            shown += page.locator(".gm-tip:visible").first.inner_text()
        view.locator("button.gm-peak").click()
        page.wait_for_timeout(300)
        assert "onerror=alert(" in shown
        assert dialogs == []
        assert page.evaluate("window.__violations") == []
        assert [m for m in console if m.startswith(("error", "pageerror"))] == []

        # and the policy is in force: a script injected into the page does not run
        page.evaluate("() => { const s = document.createElement('script');"
                      " s.textContent = 'window.__ran = true'; document.body.append(s); }")
        page.wait_for_timeout(200)
        assert page.evaluate("window.__ran === undefined")
        assert page.evaluate("window.__violations.length") >= 1
