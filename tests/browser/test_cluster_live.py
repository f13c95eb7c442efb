"""Real-browser test of the live cluster view: JupyterLab in headless Chromium shows the heat
strip of 64 (synthetic) workers, one row each, with a hover tip naming the worker, the time, its
bytes and task; screenshot ``test-artifacts/cluster-live-64.png``. When the view stops, its
output becomes the static picture (no widget left)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from saved_views import (
    ARTIFACTS,
    WIDGET,
    browser_page,
    need_browser,
    notebook_json,
    open_and_run,
)

pytestmark = pytest.mark.browser

VIEW = f"{WIDGET} div.gm-view[data-kind=cluster]"


def test_jupyterlab_draws_64_workers_live(lab: tuple[str, Path]) -> None:
    need_browser()

    url, notebooks = lab
    name = f"gpumem-cluster-{uuid.uuid4().hex[:8]}.ipynb"
    (notebooks / name).write_text(json.dumps(notebook_json(
        "from tests.browser.synthetic_cluster import prefilled_view\n"
        "live = prefilled_view(240)\n_ = live.start()",
        "import time\ntime.sleep(8)\nlive.stop()\nprint('stopped')")))
    with browser_page("cluster-live-page.png", 1300, 1100) as page:
        open_and_run(page, url, name)
        view = page.locator(VIEW)
        view.wait_for(timeout=90_000)
        page.wait_for_function(
            "sel => { const v = document.querySelector(sel);"
            " return v && v.dataset.rows === '64' && Number(v.dataset.rounds) >= 242; }",
            arg=VIEW, timeout=30_000)
        assert view.locator(".gm-clabels .gm-crow").count() == 64
        assert view.locator(".gm-cnums .gm-cnum").count() == 64
        labels = [t for t in view.locator(".gm-clabels .gm-crow").all_inner_texts() if t]
        assert labels[:3] == ["0 · GPU 0", "2 · GPU 2", "4 · GPU 4"]  # every other row
        summary = view.locator(".gm-csummary").inner_text()
        assert summary.startswith("63 workers, 1 gone · allocated ")
        assert "busiest: " in summary and "OOMs: 2 on 1 worker" in summary
        assert view.locator(".gm-status").inner_text().startswith("live · ")

        # hover the row of worker 5 (sixth row) at the newest column
        canvas = view.locator("canvas.gm-cheat")
        box = canvas.bounding_box()
        assert box is not None and box["height"] >= 64 * 5
        row_h = box["height"] / 64
        canvas.hover(position={"x": box["width"] - 2, "y": row_h * 5.5})
        tip = view.locator(".gm-tip")
        tip.wait_for(state="visible", timeout=5_000)
        text = tip.inner_text()
        assert text.startswith("worker 5 · GPU 5\ntcp://10.0.0.10:40005\nt = ")
        assert "allocated " in text and "of 80.0 GiB" in text and "task: " in text
        view.scroll_into_view_if_needed()
        view.screenshot(path=str(ARTIFACTS / "cluster-live-64.png"))

        # stopped: the output becomes the static bundle (text and the picture)
        page.wait_for_selector(".jp-OutputArea-output:has-text('stopped')", timeout=60_000)
        page.wait_for_function(
            f"() => document.querySelectorAll(\"{WIDGET}\").length === 0", timeout=30_000)
        img = page.locator(".jp-OutputArea-output img[alt^='Heat strip of 64 Dask workers']")
        assert img.count() == 1
        assert page.locator(".jp-OutputArea-output:has-text('gpumem cluster live view: 64 "
                            "workers (1 gone)')").count() == 1
