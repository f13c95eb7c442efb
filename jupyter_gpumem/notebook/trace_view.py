"""How a traced cell shows its trace: the result's bundle, or for a long trace a widget whose
view asks the kernel for the detail its saved data leaves out.

A trace whose saved view is coarse (``TraceResult.coarse``: more events than the timeline's
columns, or more block lives than it keeps) is shown as a ``TraceWidget`` (``trace_widget``):
the same output bundle (text, picture, the view payload under ``MIME_TYPE``) plus the widget
view, whose timeline refines on zoom and whose layout is exact at any event while this kernel
runs (Note [A view asks the kernel] in ``widget``). Saved, the notebook keeps the bundle:
opened with no kernel, our renderer draws the payload (the widget fallback), and says where it
is coarse.

The IPython extension puts ``show_trace`` in ``render.kernel_views.KERNEL_VIEWS`` while it is
loaded, so every way a result is shown takes it: ``%%gpumem_trace``, ``%gpumem load FILE``, a
``with trace() as t`` block's ``t``.

Note [A few trace views stay linked]: the widget keeps the trace's detail (its timeline and
every block life: hundreds of MB at ten million events). The last ``OPEN_TRACE_VIEWS`` stay
linked; showing one more turns the oldest into its saved bundle (its output is updated in
place, its widget closed, its detail let go), as a finished live view does (Note [A finished
view lets go]). ``close_trace_views`` (the extension's unload) turns them all.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpumem.notebook.trace_widget import TraceWidget
    from jupyter_gpumem.render.trace_result import TraceResult

__all__ = ["OPEN_TRACE_VIEWS", "close_trace_views", "show_trace"]

#: Trace widgets kept linked to the kernel at most (Note [A few trace views stay linked]).
OPEN_TRACE_VIEWS = 4

#: The linked trace widgets, oldest first, each with the display handle of its output.
_OPEN: list[tuple[TraceWidget, Any]] = []


def show_trace(result: TraceResult) -> bool:
    """Show ``result`` as a ``TraceWidget`` when its saved view is coarse and widgets can be
    shown here; whether it did (``kernel_views.KERNEL_VIEWS``: else its bundle is shown)."""
    if not result.coarse:
        return False
    from IPython import display as ipython_display

    show: Any = ipython_display.display
    try:
        from jupyter_gpumem.notebook.trace_widget import TraceWidget

        widget = TraceWidget(result)
    except Exception:  # no widgets here (no anywidget, no comm): the bundle says it all
        return False
    handle = show(widget, display_id=True)
    _OPEN.append((widget, handle))
    while len(_OPEN) > OPEN_TRACE_VIEWS:
        _unlink(*_OPEN.pop(0))
    return True


def _unlink(widget: TraceWidget, handle: Any) -> None:
    """Turn a trace widget's output into its saved bundle and close it."""
    with contextlib.suppress(Exception):  # an output already gone: nothing to update
        if handle is not None:
            handle.update(widget.static_bundle(), raw=True)
    widget.close()


def close_trace_views() -> int:
    """Turn every linked trace widget into its saved bundle (the extension's unload); how
    many."""
    opened = list(_OPEN)
    _OPEN.clear()
    for widget, handle in opened:
        _unlink(widget, handle)
    return len(opened)
