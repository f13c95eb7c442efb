"""Richer ways a kernel shows a trace result than its bundle: ``TraceResult._ipython_display_``
tries each in order, and each returns whether it showed the result. The IPython extension adds
its linked view of a long trace (``notebook.trace_view.show_trace``) while it is loaded; with
none that takes a result, its bundle is shown. A module of its own, free of imports, so that
loading the extension imports no renderer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["KERNEL_VIEWS"]

#: The views, in the order they are tried.
KERNEL_VIEWS: list[Callable[[Any], bool]] = []
