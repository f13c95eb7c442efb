"""The live view: a ``LiveSession`` (``widget``) sampling a ``MemorySource``'s memory while code
runs (a bare ``%gpumem``, a ``%%gpumem_trace`` cell)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpumem.sources.protocol import MemorySource

__all__ = ["live_session"]


def live_session(source: MemorySource | None) -> Any | None:
    """A started ``LiveSession`` sampling ``source``'s allocated and reserved bytes and the
    device's used bytes, or None where the live widget cannot be shown (no source, anywidget or
    ipywidgets missing, or no frontend)."""
    if source is None:
        return None

    def sample() -> tuple[int, int, int | None]:
        free, total = source.mem_get_info()
        return source.memory_allocated(), source.memory_reserved(), total - free

    try:
        from jupyter_gpumem.notebook import widget as widget
    except ImportError:  # anywidget or ipywidgets missing: no live view, the rest works
        return None
    try:
        session = widget.LiveSession(sample, interval_s=0.2)
        session.start()
    except Exception:
        return None
    return session
