"""The saved PyTorch example (``examples/pytorch.ipynb``, recorded on an H200), opened in
JupyterLab with no kernel: what a reader of the file sees of a traced training step and of the
out-of-memory error.

Checked in the page, against the saved payload: the traced step's interactive view draws its
timeline with the bands by holder in its legend (parameters, gradients, optimizer state), the
block layout at the end holds the payload's number of blocks, the peak label is clear of the
curves; the OOM panel offers the config the replay found, set through
``PYTORCH_CUDA_ALLOC_CONF``; no kernel ran.

Screenshot: ``test-artifacts/pytorch-trace.png``, clipped to the traced step's view.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from saved_views import (
    ARTIFACTS,
    ROOT,
    blocks_after,
    browser_page,
    copy_without_kernel,
    need_browser,
    open_without_kernel,
    payloads,
    peak_label_hits,
    running_kernels,
)

pytestmark = pytest.mark.browser

EXAMPLE = ROOT / "examples" / "pytorch.ipynb"
HOLDER_BANDS = ("parameters & buffers", "gradients", "optimizer state")


def _traced(nb: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The index of the ``%%gpumem_trace`` cell and its trace payload."""
    (at, cell), = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
                   and "".join(c["source"]).startswith("%%gpumem_trace")]
    trace, = [p for p in payloads(cell) if p["kind"] == "trace"]
    return at, trace


def test_jupyterlab_shows_the_saved_pytorch_example(lab: tuple[str, Path]) -> None:
    need_browser()

    nb = json.loads(EXAMPLE.read_text())
    assert nb["metadata"]["jupyter_gpumem"]["needs"] == "gpu"  # recorded on a GPU, not here
    trace_at, trace = _traced(nb)
    assert trace["timeline"]["bands_by"] == "holder"
    assert set(HOLDER_BANDS) <= set(trace["timeline"]["band_labels"])
    end_blocks = blocks_after(trace, trace["n_events"] - 1)
    (oom_at, _), = [(i, c) for i, c in enumerate(nb["cells"])
                    if any(o["output_type"] == "error" for o in c.get("outputs", []))]
    url, root = lab
    name = copy_without_kernel(nb, root, "pytorch")
    with browser_page("pytorch-page.png") as page:
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        cells = page.locator(".jp-Notebook .jp-Cell")

        traced = cells.nth(trace_at)
        traced.scroll_into_view_if_needed()
        view = traced.locator("div.gm-view[data-kind=trace]")
        view.wait_for(timeout=30_000)
        legend = view.locator(".gm-legend").first.inner_text()
        for band in HOLDER_BANDS:
            assert band in legend
        assert int(view.get_attribute("data-blocks") or -1) == end_blocks
        assert peak_label_hits(view) == []
        box = view.bounding_box()
        assert box is not None
        page.screenshot(path=str(ARTIFACTS / "pytorch-trace.png"),
                        clip={"x": box["x"], "y": box["y"], "width": box["width"],
                              "height": min(box["height"], 900)})

        oom = cells.nth(oom_at)
        oom.scroll_into_view_if_needed()
        panel = oom.locator(".jupyter-gpumem-oom")
        panel.wait_for(timeout=30_000)
        offer = panel.locator("li", has_text="replaying this trace")
        assert offer.count() == 1
        assert "PYTORCH_CUDA_ALLOC_CONF=" in offer.inner_text()
        assert "caching_allocator" not in panel.inner_text()

        assert running_kernels(url) == []  # all of it from the saved file
