"""The saved what-if example (``examples/whatif.ipynb``), opened in JupyterLab with no kernel:
what a reader of the saved file sees of the replay.

The notebook is opened as saved by ``examples/refresh.py`` (only its kernelspec is swapped for
one that starts no kernel). Checked in the page, against the saved outputs: the OOM panel's offer
of a config, the ``--suggest`` verdict, and the comparison of three configs: its table (one row
per ``--config``, in order) and its one picture, with alt text naming every config.

Screenshot: ``test-artifacts/whatif-compare.png``, clipped to the comparison's output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from saved_views import (
    ARTIFACTS,
    ROOT,
    browser_page,
    copy_without_kernel,
    need_browser,
    open_without_kernel,
    running_kernels,
)

pytestmark = pytest.mark.browser

EXAMPLE = ROOT / "examples" / "whatif.ipynb"


def _cell(nb: dict[str, Any], start: str) -> tuple[int, dict[str, Any]]:
    """The one code cell whose source starts with ``start``, and its index among all cells."""
    found = [(i, c) for i, c in enumerate(nb["cells"])
             if c["cell_type"] == "code" and "".join(c["source"]).startswith(start)]
    assert len(found) == 1, f"one cell starts with {start!r}"
    return found[0]


def _plain(cell: dict[str, Any]) -> str:
    return "\n".join("".join(o["data"]["text/plain"]) for o in cell["outputs"]
                     if "text/plain" in o.get("data", {}))


def _configs(cell: dict[str, Any]) -> list[str]:
    """The ``--config`` values of a ``%gpumem replay`` cell, in order."""
    return re.findall(r"--config\s+(\S+)", "".join(cell["source"]))


def test_jupyterlab_shows_the_saved_whatif_example(lab: tuple[str, Path]) -> None:
    need_browser()

    nb = json.loads(EXAMPLE.read_text())
    (oom_at, oom_cell), = [(i, c) for i, c in enumerate(nb["cells"])
                           if any(o["output_type"] == "error" for o in c.get("outputs", []))]
    offer = next(line.strip(" -") for line in _plain(oom_cell).splitlines()
                 if "replaying this trace" in line)
    suggest_at, suggest_cell = _cell(nb, "%gpumem replay last --suggest")
    verdict = _plain(suggest_cell).splitlines()[0]
    assert verdict.startswith("gpumem replay --suggest: ") and "would have fit" in verdict
    compare_at, compare_cell = _cell(nb, "%gpumem replay last --config")
    configs = _configs(compare_cell)
    assert len(configs) == 3
    url, root = lab
    name = copy_without_kernel(nb, root, "whatif")
    with browser_page("whatif-page.png") as page:
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        cells = page.locator(".jp-Notebook .jp-Cell")

        # the OOM panel under the traceback offers the config the replay found
        oom = cells.nth(oom_at)
        oom.scroll_into_view_if_needed()
        panel = oom.locator(".jupyter-gpumem-oom")
        panel.wait_for(timeout=30_000)
        shown_offer = panel.locator("li", has_text="replaying this trace")
        assert shown_offer.count() == 1
        assert " ".join(shown_offer.inner_text().split()) == offer.replace("`", "")
        # the commands in it read as code, as the text's backquotes mark them
        assert (shown_offer.locator("code").all_inner_texts()
                == re.findall(r"`([^`]+)`", offer))

        # --suggest: the verdict in words, then the recorded config and the best one
        suggest = cells.nth(suggest_at)
        suggest.scroll_into_view_if_needed()
        first = suggest.locator(".jp-OutputArea-output p").first
        first.wait_for(timeout=30_000)
        assert first.inner_text().strip() == verdict
        assert suggest.locator("table.jupyter-gpumem-replay tbody tr").count() == 2

        # the comparison: one row per --config, in order; one picture with alt text
        compare = cells.nth(compare_at)
        compare.scroll_into_view_if_needed()
        output = compare.locator(".jp-OutputArea-output",
                                 has=page.locator("table.jupyter-gpumem-replay"))
        output.wait_for(timeout=30_000)
        rows = output.locator("table.jupyter-gpumem-replay tbody tr")
        labels = [t.strip() for t in rows.locator("td:first-child").all_inner_texts()]
        assert len(labels) == len(configs)
        for label, config in zip(labels, configs, strict=True):
            assert label.split(" (")[0] == config  # "defaults (recorded)"
        fits = [t.strip() for t in rows.locator("td:last-child").all_inner_texts()]
        assert fits == ["no", "yes", "yes"]
        images = output.locator("img")
        assert images.count() == 1
        image = images.first
        image.wait_for(timeout=10_000)
        alt = image.get_attribute("alt") or ""
        assert alt.startswith("Reserved GPU memory over ")
        assert all(config in alt for config in configs)
        # the picture decoded and drew: a plot, not a broken-image icon
        size = image.evaluate("i => [i.complete, i.naturalWidth, i.naturalHeight]")
        assert size[0] and size[1] > 400 and size[2] > 200
        box = output.bounding_box()
        assert box is not None
        pad = 8  # a margin, so the table's first letters are not on the picture's edge
        page.screenshot(path=str(ARTIFACTS / "whatif-compare.png"),
                        clip={"x": box["x"] - pad, "y": box["y"] - pad,
                              "width": box["width"] + 2 * pad,
                              "height": box["height"] + 2 * pad})

        assert running_kernels(url) == []  # all of it from the saved file
