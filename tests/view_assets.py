"""The built view assets (``jupyter_gpumem/render/static/dist``, from ``labextension/``).

A test that needs them is marked ``needs_dist``: it skips where they are not built locally,
and never under ``CI=true``, where a missing asset must fail the test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DIST = Path(__file__).parent.parent / "jupyter_gpumem" / "render" / "static" / "dist"
ASSETS = ("widget.js", "viewer.js", "view.css")
BUILT = all((DIST / name).is_file() for name in ASSETS)

needs_dist = pytest.mark.skipif(
    not BUILT and os.environ.get("CI") != "true",
    reason="the view assets are not built (jlpm build in labextension/)")
