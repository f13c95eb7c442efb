"""What the magics put in front of the user: IPython's ``display``, the small objects it shows,
and the one-line ``UsageError`` of a bad argument."""

from __future__ import annotations

import contextlib
import html
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from jupyter_gpumem.data.schema import Snapshot

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
    """A matplotlib figure as text/plain + text/html ``<img alt>`` (one PNG, with words saying
    what it shows: nbconvert's own image/png output has no alt text)."""

    def __init__(self, fig: Any, text: str, alt: str | None = None) -> None:
        self.fig = fig
        self.text = text
        self.alt = alt or text

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from jupyter_gpumem.render.display import figure_png, img_tag

        return {"text/plain": self.text,
                "text/html": f"<p>{html.escape(self.text)}</p>\n"
                             + img_tag(figure_png(self.fig), self.alt)}


class StatusLine:
    """What a bare ``%gpumem`` leaves: the one-line status, and with ``snapshot`` (the current
    segments) a picture of the block layout and the view payload (kind snapshot), so the saved
    notebook keeps both."""

    def __init__(self, line: str, snapshot: Snapshot | None = None,
                 cell_files: Mapping[str, int] | None = None) -> None:
        self.line = line
        self.snapshot = snapshot
        self.cell_files = cell_files  # names sites "cell [N] line L"

    def __repr__(self) -> str:
        return self.line

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self.line,
                                  "text/html": f"<p>{html.escape(self.line)}</p>"}
        if self.snapshot is None:
            return bundle
        from jupyter_gpumem.render.display import MIME_TYPE, SnapshotView, img_tag

        view = SnapshotView(self.snapshot, title="current block layout",
                            cell_files=self.cell_files)
        with contextlib.suppress(ImportError):  # no matplotlib: the words and the data go
            bundle["text/html"] += "\n" + img_tag(view.png(), view.alt())
        bundle[MIME_TYPE] = view.to_json()
        return bundle
