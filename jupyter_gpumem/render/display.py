"""Display objects. ``SnapshotView`` shows a snapshot; ``TraceResult`` (``trace_result``), the
result of ``trace()`` and ``%%gpumem_trace``, shares this module's MIME type.

Each gives Jupyter a MIME bundle that survives saving the notebook (Note [Static fallbacks]): a
short ``text/plain`` summary, ``text/html`` with ONE picture as ``<img alt="...">``, the same
picture as ``image/png``, and the view payload (``view_payload``, base64 columns) under
``MIME_TYPE`` for our JupyterLab renderer, which draws the interactive views from it with no
kernel. ``repr()`` never serialises the trace.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.render.view_payload import VIEW_SCHEMA, build_view

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import SegmentInfo, Snapshot

__all__ = ["MIME_SCHEMA_VERSION", "MIME_TYPE", "PALETTE_COLOURS", "SnapshotView", "figure_png",
           "img_tag", "layout_alt", "palette_png", "png_data"]

#: The MIME type of our rich output; the JupyterLab renderer registers for it.
MIME_TYPE = "application/vnd.jupyter-gpumem.trace+json"
#: Version of the object under MIME_TYPE: the view payload's.
MIME_SCHEMA_VERSION = VIEW_SCHEMA


# Note [Static fallbacks]: where our extension is absent (GitHub's and nbviewer's notebook views,
# which are nbconvert's HTML; VS Code; JupyterLab without it; nbconvert to HTML, LaTeX or PDF),
# a reader sees the MIME type it ranks first among those an output carries: ``text/html`` for
# the HTML views, ``image/png`` for LaTeX/PDF and image diffs (nbdime), ``text/plain`` for a
# terminal. So every output we display carries ``text/plain`` (a line that says what it shows),
# and a picture or rich view (our ``MIME_TYPE``, a widget view) also carries its ONE picture
# twice: inside ``text/html`` as ``<img alt>`` (nbconvert's own ``image/png`` output has no alt
# text, and the html adds the text line and tables) and as ``image/png``. No output can point
# at another MIME type's bytes, so the picture is stored twice: ``palette_png`` keeps it small
# (64 colours, zlib's best), and it is rendered once per output (each display caches it).


#: Colours a picture in a notebook keeps: its PNG is stored with a palette of this many.
PALETTE_COLOURS = 64


def figure_png(fig: Any, colours: int = PALETTE_COLOURS, **kwargs: Any) -> bytes:
    """A matplotlib figure as PNG bytes (80 dpi), with a palette of ``colours`` (``palette_png``):
    a notebook stores every picture twice (Note [Static fallbacks]), so each is kept a quarter of
    its full-colour size."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, **kwargs)
    return palette_png(buf.getvalue(), colours)


def png_data(png: bytes | None) -> dict[str, str]:
    """``{"image/png": base64}`` of a picture, for a MIME bundle; ``{}`` without one."""
    if png is None:
        return {}
    return {"image/png": base64.b64encode(png).decode("ascii")}


def palette_png(png: bytes, colours: int = PALETTE_COLOURS) -> bytes:
    """``png`` with a palette of its ``colours`` most used colours, every other pixel (the
    anti-aliased edges) taking the nearest of them: flat areas keep their exact colour. Opaque
    pictures only (a figure's background is); others come back as they are."""
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    rgba = np.asarray(image.convert("RGBA"))
    if (rgba[..., 3] != 255).any():
        return png
    rgb = rgba[..., :3].reshape(-1, 3).astype(np.uint32)
    packed, index, counts = np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2],
                                      return_inverse=True, return_counts=True)
    found = np.stack([packed >> 16, (packed >> 8) & 255, packed & 255], axis=1)
    palette = found[np.argsort(-counts, kind="stable")[:colours]]
    gap = ((found[:, None, :].astype(np.int32) - palette[None, :, :].astype(np.int32)) ** 2
           ).sum(axis=2)
    nearest = gap.argmin(axis=1).astype(np.uint8)
    pixels = nearest[index.reshape(-1)].reshape(rgba.shape[:2])
    out = Image.fromarray(pixels, mode="P")
    out.putpalette(palette.astype(np.uint8).reshape(-1).tolist())
    buf = io.BytesIO()
    out.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def img_tag(png: bytes, alt: str) -> str:
    """An inline ``<img>`` of ``png`` with its alternative text (which must say something)."""
    if not alt.strip():
        raise ValueError("a picture needs alternative text")
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt, quote=True)}"/>'


def layout_alt(segments: list[SegmentInfo], when: str = "") -> str:
    """What a block-layout picture shows, in words with its numbers."""
    reserved = sum(s["total_size"] for s in segments)
    live = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    allocated = sum(b["size"] for b in live)
    free = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive")
    where = f" {when}" if when else ""
    if not segments:
        return f"Block layout{where}: no segments, nothing reserved."
    return (f"Block layout{where}: {len(segments)} segment{'s' if len(segments) != 1 else ''} "
            f"of GPU memory ({format_bytes(reserved)} reserved), one row each, with "
            f"{len(live)} allocated block{'s' if len(live) != 1 else ''} "
            f"({format_bytes(allocated)}) and {format_bytes(free)} cached free.")


def _trace_len(snapshot: Snapshot) -> int:
    return sum(len(t) for t in snapshot.get("device_traces", []))


class SnapshotView:
    """A snapshot shown in a notebook: summary text, block-layout picture, and the data."""

    def __init__(self, snapshot: Snapshot, title: str = "",
                 cell_files: Mapping[str, int] | None = None,
                 holders: Mapping[int, Sequence[str]] | None = None) -> None:
        self.snapshot = snapshot
        self.title = title
        self.cell_files = cell_files  # a cell's source file name -> its number: "cell [N] line L"
        self.holders = holders  # a block's address -> the variables that hold it
        self._png: bytes | None = None

    def summary(self) -> str:
        segs = self.snapshot.get("segments", [])
        reserved = sum(s["total_size"] for s in segs)
        allocated = sum(b["size"] for s in segs for b in s["blocks"]
                        if b["state"] == "active_allocated")
        blocks = sum(1 for s in segs for b in s["blocks"] if b["state"] == "active_allocated")
        return (f"GPU memory snapshot: {len(segs)} segments, {format_bytes(reserved)} reserved, "
                f"{format_bytes(allocated)} allocated in {blocks} blocks, "
                f"{_trace_len(self.snapshot)} trace events")

    def plot(self, ax: Any = None) -> Any:
        from jupyter_gpumem.render.plots import plot_segments

        return plot_segments(self.snapshot, ax)

    def plot_timeline(self, ax: Any = None, **kwargs: Any) -> Any:
        from jupyter_gpumem.render.plots import plot_timeline

        return plot_timeline(self.snapshot, ax, **kwargs)

    def save_html(self, path: str | os.PathLike[str], title: str | None = None) -> str:
        from jupyter_gpumem.render.html import save_html

        return save_html(self.snapshot, path, title=title)

    def save(self, path: str | os.PathLike[str]) -> str:
        from jupyter_gpumem.data.files import save_snapshot

        return save_snapshot(self.snapshot, path)

    def alt(self) -> str:
        """What the picture shows, in words."""
        return layout_alt(list(self.snapshot.get("segments", [])))

    def png(self) -> bytes:
        """The block layout as PNG bytes, drawn once (Note [Static fallbacks])."""
        from jupyter_gpumem.render.plots import plot_segments

        if self._png is None:
            self._png = figure_png(plot_segments(self.snapshot).figure, bbox_inches="tight")
        return self._png

    def html(self) -> str:
        return (f"<p>{html.escape(self.summary())}</p>\n"
                + img_tag(self.png(), self.alt()))

    def to_json(self) -> dict[str, Any]:
        """The view payload (kind snapshot) that the MIME bundle carries."""
        return build_view(self.snapshot, kind="snapshot", title=self.title,
                          cell_files=self.cell_files, holders=self.holders)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.summary(), "text/html": self.html(), **png_data(self.png()),
                MIME_TYPE: self.to_json()}

    def __repr__(self) -> str:
        return f"<SnapshotView {self.summary()}>"
