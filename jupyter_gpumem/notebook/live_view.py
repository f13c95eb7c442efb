"""The live view: a ``LiveSession`` widget sampling one ``MemorySource`` while cells run.

A bare ``%gpumem`` starts one (when ``GpuMem.live_view`` is on), and so does
``%%gpumem_trace --live`` for its cell. Each sample is the source's allocated and reserved
bytes and the device's used bytes (total less free; None where the source cannot say). With
several sources picked, a bare ``%gpumem`` follows the first that can be read (its widget is
titled with the source's name); the status line above it gives every source's numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jupyter_gpumem.notebook.widget import LiveSession
    from jupyter_gpumem.sources.protocol import MemorySource

__all__ = ["INTERVAL_S", "live_session", "reading"]

#: Seconds between two samples.
INTERVAL_S = 0.2


def reading(source: MemorySource) -> tuple[int, int, int | None]:
    """One sample of ``source``: ``(allocated, reserved, device used)``; used (total less free,
    every process's) is None where the source cannot say. The live view and JupyterLab's panel
    take these."""
    try:
        free, total = source.mem_get_info()
    except Exception:  # a library that cannot say: the device curve is left out
        used = None
    else:
        used = int(total) - int(free)
    return int(source.memory_allocated()), int(source.memory_reserved()), used


def live_session(source: MemorySource, *, title: str = "") -> LiveSession | None:
    """A started ``LiveSession`` sampling ``source``, or None where the live widget cannot be
    shown (anywidget or ipywidgets missing, or no frontend)."""

    def sample() -> tuple[int, int, int | None]:
        return reading(source)

    try:
        from jupyter_gpumem.notebook import widget
    except ImportError:  # anywidget or ipywidgets missing: no live view, the rest works
        return None
    try:
        session = widget.LiveSession(sample, interval_s=INTERVAL_S, title=title)
        session.start()
    except Exception:
        return None
    return session
