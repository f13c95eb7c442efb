"""The HTML export of the saved notebook shows a picture, with alternative text, for every view.

``jupyter nbconvert --to html`` (``HTMLExporter.from_filename``) of the notebook that the browser
tests open: each output that carries our view payload shows exactly one PNG, as an ``<img>`` with
non-empty alternative text; nbconvert has no image to warn about; and no object's repr
(``object at 0x``) appears anywhere. No browser is needed.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from saved_views import MIME, payloads

PNG = "iVBORw0KGgo"  # the base64 of the PNG signature


def _pngs(output: dict[str, Any]) -> int:
    """PNG images an output's bundle carries, over all its MIME types."""
    return sum(str(value).count(PNG) for value in output.get("data", {}).values())


def test_html_export_has_one_picture_with_alt_text_per_view(
        saved_notebook: tuple[Path, dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    path, nb = saved_notebook
    ours = [o for cell in nb["cells"] for o in cell["outputs"]
            if MIME in o.get("data", {})]
    assert sum(len(payloads(cell)) for cell in nb["cells"]) == len(ours) >= 2
    for output in ours:
        assert _pngs(output) == 1, "one PNG per view, not two"

    exporter = HTMLExporter()
    with caplog.at_level(logging.WARNING):
        html, _ = exporter.from_filename(str(path))
    assert not [r for r in caplog.records if "Alternative text" in r.getMessage()]
    assert "object at 0x" not in html

    soup = BeautifulSoup(html, "html.parser")
    outputs = soup.select("div.jp-OutputArea-child")
    pictures = [out.select("img") for out in outputs if PNG in str(out)]
    assert len(pictures) == len(ours)  # every view shows its picture, and nothing else has one
    for imgs in pictures:
        assert len(imgs) == 1
        assert (imgs[0].get("alt") or "").strip()
        assert imgs[0].get("alt") != "No description has been provided for this image"
        assert re.match(r"data:image/png;base64,", imgs[0].get("src") or "")
