"""What a saved notebook must be for a reader without our extension (GitHub's and nbviewer's
views, VS Code, nbconvert), checked on the notebook's JSON alone: nothing here imports
jupyter_gpumem, so the rules are the file's, not our code's.

- Every display output (``display_data``, ``execute_result``, and their updates) has a
  ``text/plain`` that says something (never an object's default repr).
- An output that is a picture (its ``text/html`` has an ``<img>``) or a rich view (our MIME type,
  a widget view) also carries ``image/png``, and its html carries that same picture; every
  ``<img>`` has non-empty alt text.
- ``metadata.widgets`` is absent, or holds the widget state (``state``) of every model an output
  refers to and every model those refer to (GitHub refuses a notebook whose widget metadata lacks
  ``state``; a missing model draws nothing).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterator, Mapping
from typing import Any

OUR_MIME = "application/vnd.jupyter-gpumem.trace+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: MIME types only a frontend with the right extension draws.
RICH = (OUR_MIME, WIDGET_VIEW)

_IMG = re.compile(r"<img\b([^>]*)>", re.IGNORECASE)
_ALT = re.compile(r'\balt="([^"]*)"')
_SRC = re.compile(r'\bsrc="data:image/png;base64,([^"]*)"')
_MODEL = re.compile(r"IPY_MODEL_([0-9a-f]+)")


def _text(value: Any) -> str:
    """A MIME value as saved (a string, or a list of lines)."""
    return "".join(value) if isinstance(value, list) else str(value)


def outputs(nb: Mapping[str, Any]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(cell index, output index, output)`` of every output with data."""
    for i, cell in enumerate(nb.get("cells", [])):
        for j, out in enumerate(cell.get("outputs", [])):
            if isinstance(out.get("data"), dict):
                yield i, j, out


def html_images(text_html: str) -> list[tuple[str, str]]:
    """``(base64 src, alt)`` of every ``<img>`` in ``text_html`` ("" where one is missing)."""
    found = []
    for attrs in _IMG.findall(text_html):
        src, alt = _SRC.search(attrs), _ALT.search(attrs)
        found.append((src.group(1) if src else "", html.unescape(alt.group(1)) if alt else ""))
    return found


def output_problems(nb: Mapping[str, Any]) -> list[str]:
    """What breaks the output rules above, one line each ([] when none)."""
    problems = []
    for i, j, out in outputs(nb):
        data = out["data"]
        where = f"cell {i} output {j} ({', '.join(sorted(data))})"
        plain = _text(data.get("text/plain", ""))
        if not plain.strip():
            problems.append(f"{where}: no text/plain")
        elif "object at 0x" in plain:
            problems.append(f"{where}: text/plain is an object's repr: {plain[:80]!r}")
        imgs = html_images(_text(data.get("text/html", "")))
        for src, alt in imgs:
            if not alt.strip():
                problems.append(f"{where}: an <img> without alt text")
            if not src:
                problems.append(f"{where}: an <img> that is not an inline PNG")
        rich = [m for m in RICH if m in data]
        png = "".join(_text(data.get("image/png", "")).split())
        if (imgs or rich) and not png:
            problems.append(f"{where}: a {'picture' if imgs else 'rich view'} without image/png")
        if png:
            try:
                raw = base64.b64decode(png, validate=True)
            except ValueError:
                raw = b""
            if raw[:8] != b"\x89PNG\r\n\x1a\n":
                problems.append(f"{where}: image/png is not a PNG")
            if "text/html" in data and png not in ("".join(s.split()) for s, _ in imgs):
                problems.append(f"{where}: its html does not show the image/png picture")
    return problems


def referenced_models(nb: Mapping[str, Any]) -> set[str]:
    """The widget models the outputs show."""
    return {str(out["data"][WIDGET_VIEW].get("model_id")) for _, _, out in outputs(nb)
            if isinstance(out["data"].get(WIDGET_VIEW), dict)}


def widget_problems(nb: Mapping[str, Any]) -> list[str]:
    """What breaks the ``metadata.widgets`` rule above ([] when none)."""
    widgets = nb.get("metadata", {}).get("widgets")
    if widgets is None:
        return []
    saved = widgets.get(WIDGET_STATE) if isinstance(widgets, dict) else None
    state = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(state, dict):
        return [f"metadata.widgets has no {WIDGET_STATE} with a 'state' (GitHub refuses it)"]
    problems = []
    wanted = sorted(referenced_models(nb))
    seen: set[str] = set()
    while wanted:
        model = wanted.pop()
        if model in seen:
            continue
        seen.add(model)
        entry = state.get(model)
        if not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
            problems.append(f"widget model {model} is shown or referred to, but has no state")
            continue
        wanted += _MODEL.findall(str(entry["state"]))
    return problems


def notebook_problems(nb: Mapping[str, Any]) -> list[str]:
    """Every rule of this module at once."""
    return output_problems(nb) + widget_problems(nb)
