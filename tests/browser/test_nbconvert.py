"""The HTML export of a saved notebook shows a picture, with alternative text, for every view.

``jupyter nbconvert --to html`` (``HTMLExporter``) is what GitHub's and nbviewer's notebook views
are made with, and what a reader without our extension gets. Of the notebook that the browser
tests open, and of the notebook of every output (``every_output``, run by nbclient): each output
that is a picture or a view shows its picture as an ``<img>`` with alternative text saying what
it shows; nbconvert has no image to warn about; and no object's repr (``object at 0x``) appears
anywhere. The export of every output is looked at in headless Chromium too (no network), and a
screenshot kept (``test-artifacts/nbconvert-every-output.png``).
"""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from notebook_checks import OUR_MIME, WIDGET_VIEW, html_images
from saved_views import MIME, browser_page, need_browser, payloads

PNG = "iVBORw0KGgo"  # the base64 of the PNG signature


def _pngs(output: dict[str, Any]) -> int:
    """PNG images an output's bundle carries, over all its MIME types."""
    return sum(str(value).count(PNG) for value in output.get("data", {}).values())


def _export(nb: dict[str, Any], caplog: pytest.LogCaptureFixture) -> str:
    """The notebook's HTML export, checking that nbconvert found no image without alt text."""
    import nbformat
    from nbconvert import HTMLExporter

    with caplog.at_level(logging.WARNING):
        html, _ = HTMLExporter().from_notebook_node(nbformat.reads(json.dumps(nb), as_version=4))
    assert not [r for r in caplog.records if "Alternative text" in r.getMessage()]
    assert "object at 0x" not in html
    return html


def _shown(html: str, nb: dict[str, Any]) -> list[tuple[int, dict[str, Any], Any]]:
    """``(cell, output, its element in the export)`` of every output, in order."""
    from bs4 import BeautifulSoup

    cells = BeautifulSoup(html, "html.parser").select("div.jp-Cell")
    assert len(cells) == len(nb["cells"])
    found = []
    for i, (cell, element) in enumerate(zip(nb["cells"], cells, strict=True)):
        areas = element.select("div.jp-OutputArea-child")
        assert len(areas) == len(cell.get("outputs", []))
        found += [(i, out, area) for out, area in zip(cell.get("outputs", []), areas, strict=True)]
    return found


def _check_pictures(area: Any, output: dict[str, Any]) -> None:
    """The output shows its pictures as inline PNGs with words, its image/png among them."""
    imgs = area.select("img")
    assert imgs, "a view shows its picture"
    for img in imgs:
        assert len((img.get("alt") or "").strip()) > 20
        assert img.get("alt") != "No description has been provided for this image"
        assert re.match(r"data:image/png;base64,", img.get("src") or "")
    png = "".join(output["data"]["image/png"]).strip()
    assert png in [img["src"].split(",", 1)[1] for img in imgs]


def test_html_export_has_one_picture_with_alt_text_per_view(
        saved_notebook: tuple[Path, dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    _, nb = saved_notebook
    ours = [o for cell in nb["cells"] for o in cell["outputs"]
            if MIME in o.get("data", {})]
    assert sum(len(payloads(cell)) for cell in nb["cells"]) == len(ours) >= 2
    for output in ours:  # one picture a view: in its html, and as image/png
        assert _pngs(output) == 2
        ((src, _),) = html_images("".join(output["data"]["text/html"]))
        assert src == "".join(output["data"]["image/png"]).strip()

    html = _export(nb, caplog)
    shown = _shown(html, nb)
    pictures = [area.select("img") for _, _, area in shown if area.select("img")]
    assert len(pictures) == len(ours)  # every view shows its picture, and nothing else has one
    for _, out, area in shown:
        if MIME in out.get("data", {}):
            assert len(area.select("img")) == 1
            _check_pictures(area, out)


def test_html_export_of_every_output_as_jupyterlab_saves_it(
        every_output_notebook: dict[str, Any], caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    """Saved without widget state (JupyterLab's default), every output of every kind shows its
    text, and its picture where it has one: the live views still running when it was saved
    (the bare %gpumem's, the last %gpumem cluster's) show their last fallback."""
    import every_output as every

    nb = copy.deepcopy(every_output_notebook)
    nb["metadata"].pop("widgets")
    html = _export(nb, caplog)
    shown = _shown(html, nb)
    pictured = set()
    for i, out, area in shown:
        data = out.get("data", {})
        text = "".join(data.get("text/plain", ""))
        if text:  # its first line reads in the page, as its text or as its html
            first = " ".join(text.splitlines()[0].split())[:80]
            assert first in " ".join(area.get_text(" ").split()), first
        if "image/png" in data or OUR_MIME in data or WIDGET_VIEW in data:
            _check_pictures(area, out)
            pictured.add(i)
        else:
            assert not area.select("img")
    assert pictured >= {every.STATUS, every.TRACE, every.LONG_TRACE, every.RAISING_TRACE,
                        every.PLOT, every.SUGGEST, every.COMPARE, every.LOAD,
                        every.CLUSTER_STOPPED, every.CLUSTER_TRACE, every.CLUSTER_RUNNING}
    page = tmp_path / "every-output.html"
    page.write_text(html, "utf-8")
    need_browser()
    with browser_page("nbconvert-every-output.png", width=1100, height=2400) as view:
        view.route("**/*", lambda route: route.abort()
                   if not route.request.url.startswith("file:") else route.continue_())
        view.goto(page.as_uri())
        images = view.locator("div.jp-OutputArea-output img")
        assert images.count() == sum(len(a.select("img")) for _, _, a in shown)
        drawn = images.evaluate_all("is => is.map(i => i.complete && i.naturalWidth > 100)")
        assert all(drawn)  # every picture decodes and draws, with no network
        view.locator("div.jp-Cell").nth(every.TRACE).scroll_into_view_if_needed()


def test_html_export_with_nbclients_widget_state(
        every_output_notebook: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Saved with the widget state nbclient stores by default, nbconvert draws a widget view
    whose model is in that state as the widget (GitHub cannot run it; nbviewer fetches the
    widget manager from a CDN): the two live views still running at the end show no picture
    there. Every other output shows its own, as above (README: Without our extension)."""
    import every_output as every

    nb = every_output_notebook
    html = _export(nb, caplog)
    missing = []
    for i, out, area in _shown(html, nb):
        data = out.get("data", {})
        if WIDGET_VIEW in data:
            assert area.select(f'script[type="{WIDGET_VIEW}"]') and not area.select("img")
            missing.append(i)
        elif "image/png" in data:
            _check_pictures(area, out)
    assert missing == [every.STATUS, every.CLUSTER_RUNNING]
