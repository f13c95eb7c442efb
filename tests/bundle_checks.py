"""What every bundle we display must be to survive saving: a text/plain line that says
something (never ``object at 0x``), every ``<img>`` with alt text, its picture also as
``image/png`` (the same bytes: one picture drawn once), and a view payload (schema 2) whose
columns all decode."""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping
from typing import Any

from jupyter_gpumem.render.display import MIME_TYPE
from jupyter_gpumem.render.view_payload import decode_column

_IMG = re.compile(r"<img\b([^>]*)>")
_ALT = re.compile(r'\balt="([^"]*)"')
_SRC = re.compile(r'\bsrc="data:image/png;base64,([^"]*)"')


def images(text_html: str) -> list[tuple[bytes, str]]:
    """The PNGs of ``<img>`` tags in ``text_html`` and their alt texts."""
    out = []
    for attrs in _IMG.findall(text_html):
        src, alt = _SRC.search(attrs), _ALT.search(attrs)
        assert src is not None, attrs[:80]
        out.append((base64.b64decode(src.group(1)), html.unescape(alt.group(1)) if alt else ""))
    return out


def _columns(value: Any) -> int:
    if isinstance(value, Mapping):
        if set(value) == {"dtype", "data"}:
            decode_column(value)
            return 1
        return sum(_columns(v) for v in value.values())
    if isinstance(value, list):
        return sum(_columns(v) for v in value)
    return 0


def check_bundle(bundle: Mapping[str, Any], *, pictures: int = 1,
                 kind: str | None = None) -> dict[str, Any]:
    """Assert the rules above; returns the payload under MIME_TYPE ({} if none)."""
    assert "object at 0x" not in bundle["text/plain"] and bundle["text/plain"].strip()
    found = images(bundle.get("text/html", ""))
    assert len(found) == pictures, len(found)
    for png, alt in found:
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(alt.strip()) > 20, alt
    if pictures:  # the html's picture (one of them: a cluster trace's, the highest worker's)
        assert base64.b64decode(bundle["image/png"]) in [png for png, _ in found]
    else:
        assert "image/png" not in bundle
    payload: dict[str, Any] = bundle.get(MIME_TYPE, {})
    if payload:
        assert payload["schema"] == 2 and _columns(payload) > 10
        assert json.loads(json.dumps(payload)) == payload  # base64 columns: plain JSON
        if kind is not None:
            assert payload["kind"] == kind
    return payload
