"""What the magics put in front of the user: IPython's ``display``, the small objects it shows,
and the one-line ``UsageError`` of a bad argument."""

from __future__ import annotations

import html
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
    """A matplotlib figure as text/plain, text/html ``<img alt>`` (words saying what it shows:
    nbconvert's own image/png output has no alt text) and the same PNG as image/png, drawn once
    (Note [Static fallbacks] in ``render.display``)."""

    def __init__(self, fig: Any, text: str, alt: str | None = None) -> None:
        self.fig = fig
        self.text = text
        self.alt = alt or text
        self._png: bytes | None = None

    def __repr__(self) -> str:
        return self.text

    def png(self) -> bytes:
        from jupyter_gpumem.render.display import figure_png

        if self._png is None:
            self._png = figure_png(self.fig)
        return self._png

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from jupyter_gpumem.render.display import img_tag, png_data

        return {"text/plain": self.text,
                "text/html": f"<p>{html.escape(self.text)}</p>\n" + img_tag(self.png(), self.alt),
                **png_data(self.png())}


class StatusLine:
    """The one-line status of a bare ``%gpumem``: its own output (text/plain and text/html),
    so every frontend shows it, whatever renders the layout displayed after it."""

    def __init__(self, line: str) -> None:
        self.line = line

    def __repr__(self) -> str:
        return self.line

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.line, "text/html": f"<p>{html.escape(self.line)}</p>"}
