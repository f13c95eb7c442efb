"""A saved notebook traced under ``expandable_segments:True``, opened in JupyterLab with no
kernel: the block layout draws the growing segment as one row, its unmapped range hatched.

Screenshot: ``test-artifacts/expandable-layout.png`` (the trace view as opened, the tip of the
unmapped range shown).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from saved_views import (
    ARTIFACTS,
    browser_page,
    column,
    execute_saved_notebook,
    need_browser,
    open_without_kernel,
    payloads,
    running_kernels,
)

pytestmark = pytest.mark.browser

#: Three blocks grow one large-pool segment page by page; freeing the middle one and emptying
#: the cache unmaps its pages: one segment, two mapped ranges, a hole between them. A last
#: block after it fits in the mapped free tail (the reserved curve shows the drop before it).
CELLS = [
    "%load_ext jupyter_gpumem\n%gpumem device sim\n%gpumem config expandable_segments:True",
    "%%gpumem_trace\nimport jupyter_gpumem as gm\nMiB = 1 << 20\na = gm.get_allocator()\n"
    "first = a.malloc(20 * MiB)\nmiddle = a.malloc(40 * MiB)\nlast = a.malloc(15 * MiB)\n"
    "small = a.malloc(3000)\na.free(middle)\na.empty_cache()\nafter = a.malloc(4 * MiB)",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("expandable") / "gpumem-expandable.ipynb"
    return path, execute_saved_notebook(path, CELLS)


def test_jupyterlab_draws_an_expandable_segment_as_one_row(
        saved: tuple[Path, dict[str, Any]], lab: tuple[str, Path]) -> None:
    need_browser()

    path, nb = saved
    (trace,) = [p for p in payloads(nb["cells"][1]) if p["kind"] == "trace"]
    assert "expandable" in trace["lives"]["segments"]
    url, root = lab
    name = f"gpumem expandable {uuid.uuid4().hex[:8]}.ipynb"
    shutil.copy(path, root / name)
    with browser_page(None, 1300, 1000) as page:
        open_without_kernel(page, f"{url}/lab/tree/{quote(name)}?reset")
        view = page.locator("div.gm-view[data-kind=trace]")
        view.first.wait_for(timeout=60_000)
        view.scroll_into_view_if_needed()
        layout = view.locator("svg.gm-layout")
        layout.wait_for(timeout=10_000)
        # two rows: the large-pool segment (two mapped ranges) and the small-pool one
        assert layout.get_attribute("data-rows") == "2"
        assert layout.get_attribute("data-expandable") == "2"
        assert layout.get_attribute("data-segments") == "3"
        labels = layout.locator("text.gm-seglabel").evaluate_all(
            "ts => ts.map(t => t.childNodes[0].textContent)")
        assert any(t.startswith("expandable large s0 · 40.0 MiB mapped") for t in labels)
        assert any("GiB range" in t for t in labels)  # the rest of the reserved range
        hole = layout.locator("rect.gm-unmapped:not(.gm-tail)")
        assert hole.count() == 1
        assert view.locator(".gm-swatch-unmapped").count() == 1  # in the legend
        assert len(layout.locator("rect.gm-block").all()) == 4  # first, last, after, small
        # the reserved curve follows the maps and the unmap: 82 MiB at the peak, 42 after
        reserved = [v / (1 << 20) for v in column(trace["timeline"]["reserved"])]
        assert max(reserved) == 82 and reserved[-1] == 42
        hole.hover()
        tip = page.locator(".gm-tip:visible").first
        tip.wait_for(state="visible", timeout=5_000)
        text = tip.inner_text()
        assert "unmapped" in text and "40.0 MiB" in text and "stream 0" in text
        view.screenshot(path=str(ARTIFACTS / "expandable-layout.png"))
        page.mouse.move(5, 5)
        assert running_kernels(url) == []
