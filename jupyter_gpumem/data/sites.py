"""Allocation sites: the line of the user's code behind a stack, named one way everywhere."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from jupyter_gpumem.data.schema import Frame

#: Frames in these files belong to libraries, not to the user's code.
LIBRARY_MARKERS = ("site-packages", "dist-packages", "/cupy/", "/cupyx/", "/cupy_backends/",
                   "/numpy/", "<frozen ", "\\cupy\\", "\\numpy\\", "/IPython/", "\\IPython\\")
_IPYTHON_INPUT = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")


def is_library_file(filename: str) -> bool:
    """Whether a frame's file belongs to CuPy, numpy, IPython, an installed package or Python."""
    return any(marker in filename for marker in LIBRARY_MARKERS)


def site_of(frames: Sequence[Frame], cell_files: Mapping[str, int] | None = None, *,
            full: bool = False) -> str | None:
    """The allocating line: the innermost frame outside libraries, as ``"cell [3] line 2"`` for
    a notebook cell (known from ``cell_files`` or IPython's input names) and ``"train.py:12"``
    otherwise (the whole path with ``full``); None when no such frame is known."""
    for f in frames:
        filename = f["filename"]
        if is_library_file(filename):
            continue
        cell = cell_files.get(filename) if cell_files else None
        if cell is None:
            m = _IPYTHON_INPUT.match(filename)
            cell = int(m.group(1)) if m else None
        if cell is not None:
            return f"cell [{cell}] line {f['line']}"
        if full:
            return f"{filename}:{f['line']}"
        base = filename.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{base}:{f['line']}"
    return None


def short_site(site: str) -> str:
    """``"/a/b/train.py:12"`` → ``"train.py:12"``, for labels; cell sites stay as they are."""
    path, _, line = site.rpartition(":")
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{base}:{line}" if path else site
