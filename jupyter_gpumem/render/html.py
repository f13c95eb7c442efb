"""One self-contained HTML file that draws a snapshot's timeline and block layout, offline.

No network: the page is inline HTML, the shared view CSS and the viewer script built from
``labextension/src`` (``static/dist/viewer.js`` and ``static/dist/view.css`` beside this module),
with the data embedded as the view payload (``view_payload``, schema 2, base64 columns). The
viewer reads it from ``<script id="gm-data">`` and draws into ``<div id="gm-root">``: the same
views as the widget and the JupyterLab renderer.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.render.view_payload import build_view

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.data.timeline import Timeline

__all__ = ["dist_asset", "render_html", "save_html"]


def dist_asset(name: str) -> str:
    """The text of a built view asset (``static/dist/NAME``: ``widget.js``, ``viewer.js``,
    ``view.css``). They come from the labextension build, shipped in the wheel and sdist."""
    path = resources.files(__package__).joinpath("static", "dist", name)
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the view asset static/dist/{name} is missing: build it with `jlpm build` in "
            "labextension/ (pip install builds it when Node is there)") from None


def _script_json(data: object) -> str:
    """JSON that is safe inside ``<script>``: no ``</script>``, no ``<!--``, no ``//``."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("/", "\\/"))


def render_html(snapshot: Snapshot, *, title: str = "GPU memory", device: int | None = None,
                timeline: Timeline | None = None,
                cell_files: Mapping[str, int] | None = None,
                payload: Mapping[str, Any] | None = None) -> str:
    """The whole page as a string. ``payload``: a view payload (base64 columns) to
    embed instead of the snapshot's, such as a trace result's with its tables."""
    data: Any = payload if payload is not None else build_view(
        snapshot, kind="trace", device=device, timeline=timeline, title=title,
        cell_files=cell_files)
    script = "\n" + dist_asset("viewer.js") + "\n"
    style = "\n" + dist_asset("view.css") + _PAGE_STYLE + "\n"
    # The page may run its own script and style and nothing else: no network, no inline event
    # handlers, no other script even if some data did break out of its element.
    csp = (f"default-src 'none'; script-src {_hash(script)}; style-src {_hash(style)}; "
           "base-uri 'none'; form-action 'none'")
    return _PAGE.format(title=html.escape(title), data=_script_json(data), script=script,
                        style=style, csp=html.escape(csp))


def _hash(text: str) -> str:
    """A Content-Security-Policy source for an inline element holding exactly ``text``."""
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def save_html(snapshot: Snapshot, path: str | os.PathLike[str], *, title: str | None = None,
              device: int | None = None, timeline: Timeline | None = None,
              cell_files: Mapping[str, int] | None = None,
              payload: Mapping[str, Any] | None = None) -> str:
    """Write the page to ``path`` (UTF-8); returns the path written."""
    if title is None:
        title = f"GPU memory · {os.path.basename(os.fspath(path))}"
    text = render_html(snapshot, title=title, device=device, timeline=timeline,
                       cell_files=cell_files, payload=payload)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)


#: The page's own few rules around the shared view CSS.
_PAGE_STYLE = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
#gm-root .gm-title { font-size: 16px; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<div id="gm-root"></div>
<script type="application/json" id="gm-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
