"""A saved notebook, opened with no kernel, shows the interactive views (JupyterLab 4, Notebook 7).

The notebook of ``saved_views.CELLS`` is executed once by nbclient and saved with its outputs; the
kernel is gone. JupyterLab and Notebook 7 open it fresh, with no kernel (the notebook names a
kernelspec that does not exist, the "select a kernel" dialog is answered "No Kernel", and the
server is checked to have started none), and the MIME renderer draws every saved view from the
saved data alone. Expected block counts come from the saved payload, checked against the same
workload run here. Screenshots go to ``test-artifacts/``:

- ``lab-trace.png``: the trace view in JupyterLab as opened, the layout at the end;
- ``lab-hover.png``: the largest block hovered, its tip with size, address and stack;
- ``lab-peak.png``: after "peak", the layout at the peak;
- ``nb7-trace.png``: the same trace view in Notebook 7.

Under ``CI=true`` a missing Chromium or playwright fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import importlib.util
import shutil
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from saved_views import (
    ALLOCATING_LINES,
    ARTIFACTS,
    STATUS_CELL,
    TRACE_CELL,
    block_life,
    blocks_after,
    browser_page,
    need,
    need_browser,
    open_without_kernel,
    payloads,
    peak_label_hits,
    running_kernels,
    workload_counts,
)

pytestmark = pytest.mark.browser


def _trace(nb: dict[str, Any]) -> dict[str, Any]:
    """The traced cell's one trace payload, with the facts the checks rely on."""
    found = [p for p in payloads(nb["cells"][TRACE_CELL]) if p["kind"] == "trace"]
    assert len(found) == 1, "the traced cell saves one trace view"
    trace = found[0]
    assert trace["schema"] == 2
    assert trace["lives"]["checkpoints"] is None  # a small trace: exact at every event
    return trace


def _expected(trace: dict[str, Any]) -> tuple[int, int, int, int]:
    """The last event, the peak event, and the allocated blocks after each, from the payload;
    the counts agree with the workload run here, and differ."""
    end_k = trace["n_events"] - 1
    peak_k = trace["peak"]["index"]
    at_end, at_peak = blocks_after(trace, end_k), blocks_after(trace, peak_k)
    assert (at_end, at_peak) == workload_counts()
    assert at_end != at_peak and 0 <= peak_k < end_k
    return end_k, peak_k, at_end, at_peak


def _copy(saved: tuple[Path, dict[str, Any]], root: Path) -> str:
    """The saved notebook under a unique name in the server's folder; its URL-quoted name."""
    name = f"gpumem saved {uuid.uuid4().hex[:8]}.ipynb"
    shutil.copy(saved[0], root / name)
    return quote(name)


def _state(view: Any) -> tuple[int, int]:
    return int(view.get_attribute("data-at")), int(view.get_attribute("data-blocks"))


def _wait_at(page: Any, k: int) -> None:
    page.wait_for_function(
        "k => document.querySelector('div.gm-view[data-kind=trace]').dataset.at === String(k)",
        arg=k, timeout=10_000)


def _timeline_drawn(view: Any) -> None:
    """The timeline has drawn curves: SVG paths with points, or ink on a canvas."""
    timeline = view.locator(".gm-timeline").first
    timeline.wait_for(timeout=10_000)
    if timeline.evaluate("e => e.tagName.toLowerCase()") == "canvas":
        ink = timeline.evaluate(
            "c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }")
        assert ink > 100
    else:
        lengths = timeline.locator("path").evaluate_all(
            "ps => ps.map(p => (p.getAttribute('d') || '').length)")
        assert sum(1 for n in lengths if n > 20) >= 2  # allocated and reserved, at least


def _drawn_blocks(view: Any) -> list[int]:
    """The block life index (data-i) of every block drawn in the layout."""
    found: list[int] = view.locator("svg.gm-layout rect.gm-block").evaluate_all(
        "rs => rs.map(r => Number(r.dataset.i))")
    return found


def _check_every_view_drawn(page: Any, nb: dict[str, Any]) -> None:
    """One drawn view per saved payload, of its kind; the bare %gpumem saved one too."""
    kinds = [p["kind"] for cell in nb["cells"] for p in payloads(cell)]
    assert payloads(nb["cells"][STATUS_CELL]), "%gpumem saves a view"
    page.wait_for_function("n => document.querySelectorAll('div.gm-view').length >= n",
                           arg=len(kinds), timeout=30_000)
    drawn = page.locator("div.gm-view").evaluate_all("vs => vs.map(v => v.dataset.kind)")
    assert sorted(drawn) == sorted(kinds)


def test_jupyterlab_draws_the_saved_trace_with_no_kernel(
        saved_notebook: tuple[Path, dict[str, Any]], lab: tuple[str, Path]) -> None:
    need_browser()

    url, root = lab
    nb = saved_notebook[1]
    trace = _trace(nb)
    end_k, peak_k, at_end, at_peak = _expected(trace)
    name = _copy(saved_notebook, root)
    with browser_page("lab-page.png") as page:
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        view = page.locator("div.gm-view[data-kind=trace]")
        view.first.wait_for(timeout=60_000)
        assert view.count() == 1
        view.scroll_into_view_if_needed()
        _check_every_view_drawn(page, nb)

        # as opened: the timeline, and the layout after the last event
        _timeline_drawn(view)
        assert _state(view) == (end_k, at_end)
        assert len(_drawn_blocks(view)) == at_end
        assert int(view.get_attribute("data-segments") or 0) > 0
        assert view.locator("table.gm-sites tr").count() > 1
        assert view.locator("table.gm-surviving tr").count() > 1
        # a long list of survivors shows the largest ten and sums up the rest in one line
        survivors = len(trace["surviving"])
        assert survivors > 10
        more = view.locator("table.gm-surviving tr.gm-more")
        assert f"and {survivors - 10} more blocks" in more.inner_text()
        assert view.locator("table.gm-surviving tbody tr").count() == 11
        # the peak label, near the right edge, sits clear of the reserved step and the mark
        assert peak_label_hits(view) == []
        view.screenshot(path=str(ARTIFACTS / "lab-trace.png"))

        # hovering the largest block shows its size, address and the line that allocated it
        drawn = _drawn_blocks(view)
        biggest = max(drawn, key=lambda i: block_life(trace, i)["size"])
        frames = block_life(trace, biggest)["frames"]
        assert frames, "the traced blocks carry stacks"
        # the workload's allocating line, in run (Python < 3.12 adds a <listcomp> frame
        # on the same line inside it)
        names = [f[2] for f in frames]
        assert "run" in names and set(names[:names.index("run")]) <= {"<listcomp>"}
        _filename, line, fn = frames[names.index("run")]
        assert line in ALLOCATING_LINES
        view.locator(f"svg.gm-layout rect.gm-block[data-i='{biggest}']").hover()
        tip = page.locator(".gm-tip:visible").first
        tip.wait_for(state="visible", timeout=5_000)
        text = tip.inner_text()
        # a cell's frame is named by its cell, not its temporary file: "cell [2] line 4"
        assert _filename.startswith("cell [")
        assert f"{_filename} line {line} in {fn}" in text
        assert "0x" in text
        page.screenshot(path=str(ARTIFACTS / "lab-hover.png"))

        # "peak" shows the layout after the peak event: one more block, the spike
        view.locator("button.gm-peak").click()
        _wait_at(page, peak_k)
        assert _state(view) == (peak_k, at_peak)
        assert len(_drawn_blocks(view)) == at_peak
        assert int(view.locator("input.gm-slider").input_value()) == peak_k
        assert str(peak_k) in view.locator("span.gm-at").inner_text()
        view.screenshot(path=str(ARTIFACTS / "lab-peak.png"))

        # "end" goes back; the slider moved to the peak shows the peak again
        view.locator("button.gm-end").click()
        _wait_at(page, end_k)
        assert _state(view) == (end_k, at_end)
        view.locator("input.gm-slider").evaluate(
            "(s, k) => { s.value = String(k);"
            " s.dispatchEvent(new Event('input', {bubbles: true}));"
            " s.dispatchEvent(new Event('change', {bubbles: true})); }", peak_k)
        _wait_at(page, peak_k)
        assert _state(view) == (peak_k, at_peak)

        assert running_kernels(url) == []  # drawn from the saved data alone


def test_notebook7_draws_the_saved_trace_with_no_kernel(
        saved_notebook: tuple[Path, dict[str, Any]], lab: tuple[str, Path]) -> None:
    need_browser()
    need("Notebook 7", importlib.util.find_spec("notebook") is not None)

    url, root = lab
    nb = saved_notebook[1]
    trace = _trace(nb)
    end_k, _, at_end, _ = _expected(trace)
    name = _copy(saved_notebook, root)
    with browser_page("nb7-page.png") as page:
        open_without_kernel(page, f"{url}/notebooks/{name}")
        view = page.locator("div.gm-view[data-kind=trace]")
        view.first.wait_for(timeout=60_000)
        view.scroll_into_view_if_needed()
        _check_every_view_drawn(page, nb)
        _timeline_drawn(view)
        assert _state(view) == (end_k, at_end)
        assert len(_drawn_blocks(view)) == at_end
        view.screenshot(path=str(ARTIFACTS / "nb7-trace.png"))
        assert running_kernels(url) == []
