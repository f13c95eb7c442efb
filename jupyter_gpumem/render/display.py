"""Display objects. ``SnapshotView`` shows a snapshot; ``TraceResult`` (``trace_result``), the
result of ``trace()`` and ``%%gpumem_trace``, shares this module's MIME type.

Each gives Jupyter a MIME bundle: a short ``text/plain`` summary, an ``image/png`` of the static
plot (so GitHub, nbviewer and nbconvert show a picture), and the data itself under
``MIME_TYPE`` for our JupyterLab renderer. ``repr()`` never serialises the trace.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.schema import SCHEMA_VERSION
from jupyter_gpumem.data.units import format_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot

#: The MIME type of our rich output; the JupyterLab renderer registers for it.
MIME_TYPE = "application/vnd.jupyter-gpumem.trace+json"
#: Version of the object under MIME_TYPE: ``{"schema", "kind", "snapshot", ...}``.
MIME_SCHEMA_VERSION = 1


def _png(draw: Any, *args: Any, **kwargs: Any) -> bytes:
    ax = draw(*args, **kwargs)
    buf = io.BytesIO()
    ax.figure.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return buf.getvalue()


def _trace_len(snapshot: Snapshot) -> int:
    return sum(len(t) for t in snapshot.get("device_traces", []))


class SnapshotView:
    """A snapshot shown in a notebook: summary text, block-layout picture, and the data."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

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

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from jupyter_gpumem.render.plots import plot_segments

        return {
            "text/plain": self.summary(),
            "image/png": _png(plot_segments, self.snapshot),
            MIME_TYPE: {"schema": MIME_SCHEMA_VERSION, "kind": "snapshot",
                        "snapshot": with_schema(self.snapshot)},
        }

    def __repr__(self) -> str:
        return f"<SnapshotView {self.summary()}>"


def with_schema(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot with its ``schema`` key set, as the MIME data carries it."""
    return {**snapshot, "schema": snapshot.get("schema", SCHEMA_VERSION)}
