"""What a kernel answers a trace view's questions, on its widget's comm (Note [A view asks the
kernel]): the timeline of a window, the layout at an event, from the trace's ``TraceDetail``;
the payload's shapes, each column's bytes one buffer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.render.payload_columns import split_buffers

if TYPE_CHECKING:
    from jupyter_gpumem.render.view_detail import TraceDetail

__all__ = ["answer_question"]

Send = Callable[..., None]


def answer_question(send: Send, detail: TraceDetail | None,
                    question: Mapping[str, Any]) -> None:
    """Answer a view's ``window`` or ``layout`` ``question`` from ``detail`` through ``send``
    (a widget's: content, then ``buffers``); one it cannot answer gets ``{"type": "error"}``."""
    kind, ask = question["type"], question.get("id")
    try:
        if detail is None:
            raise ValueError("this kernel no longer keeps the trace's detail")
        if kind == "window":
            answer = detail.window(_int(question, "i0"), _int(question, "i1"),
                                   _int(question, "columns"))
        else:
            answer = detail.layout(_int(question, "k"))
    except (ValueError, TypeError) as exc:
        send({"type": "error", "id": ask, "message": str(exc)})
        return
    content, buffers = split_buffers(answer)
    send({"type": kind, "id": ask, **content}, buffers=buffers)


def _int(question: Mapping[str, Any], key: str) -> int:
    """An integer field of a view's question (TypeError naming it otherwise)."""
    value = question.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{key} must be an integer, got {value!r}")
    return value


# Note [A view asks the kernel]: a saved view of a long trace is coarse (``view_payload``: 2,000
# columns, the layout exact at checkpoints). While the kernel that made it runs, its widget
# keeps the trace's ``TraceDetail`` and the view asks for what it is about to draw: the
# timeline of the window it zoomed to (a column a pixel), the layout at the slider's event. The
# answers come back on the widget's own comm in a few tens of milliseconds at ten million
# events (``bench/bench_trace_scale.py``), each at most a few MB (``view_detail``'s bounds).
# The kernel answers only between cells (its shell thread runs the cell), so a view asking
# while a cell runs waits; the view keeps drawing what it has meanwhile.
