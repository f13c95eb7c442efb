"""What the magics put in front of the user: IPython's ``display``, the small objects it shows,
and the one-line ``UsageError`` of a bad argument."""

from __future__ import annotations

import io
from typing import Any

from IPython.core.error import UsageError

__all__ = ["Picture", "StatusLine", "display", "one_line", "usage_error"]


def display(obj: Any) -> None:
    """IPython's ``display`` (untyped), given a type once, here."""
    from IPython import display as ipython_display

    show: Any = ipython_display.display
    show(obj)


def one_line(message: str, magic: str = "%gpumem") -> str:
    """``message`` on one line, pointing at ``magic?`` for the full usage."""
    flat = message.strip().replace("\r", " ").replace("\n", " ")
    return f"{flat} (see {magic}? for usage)"


def usage_error(message: str, magic: str = "%gpumem") -> UsageError:
    """The ``UsageError`` of a bad argument to ``magic``: one line, pointing at its usage."""
    return UsageError(one_line(message, magic))


class Picture:
    """A matplotlib figure as text/plain + image/png."""

    def __init__(self, fig: Any, text: str) -> None:
        self.fig = fig
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png", dpi=80)
        return {"text/plain": self.text, "image/png": buf.getvalue()}


class StatusLine:
    """The one-line status as text/plain."""

    def __init__(self, line: str) -> None:
        self.line = line

    def __repr__(self) -> str:
        return self.line

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.line}
