"""Display objects: a snapshot, and the result of ``%%gpumem_trace``.

Each gives Jupyter a MIME bundle: a short ``text/plain`` summary, an ``image/png`` of the static
plot (so GitHub, nbviewer and nbconvert show a picture), and the data itself under
``MIME_TYPE`` for our JupyterLab renderer. ``repr()`` never serialises the trace.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._schema import SCHEMA_VERSION
from ._units import format_bytes

if TYPE_CHECKING:
    from ._schema import Frame, SegmentInfo, Snapshot
    from ._timeline import Timeline

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
        from ._plots import plot_segments

        return plot_segments(self.snapshot, ax)

    def plot_timeline(self, ax: Any = None, **kwargs: Any) -> Any:
        from ._plots import plot_timeline

        return plot_timeline(self.snapshot, ax, **kwargs)

    def save_html(self, path: str | os.PathLike[str], title: str | None = None) -> str:
        from ._html import save_html

        return save_html(self.snapshot, path, title=title)

    def save(self, path: str | os.PathLike[str]) -> str:
        from ._io import save_snapshot

        return save_snapshot(self.snapshot, path)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from ._plots import plot_segments

        return {
            "text/plain": self.summary(),
            "image/png": _png(plot_segments, self.snapshot),
            MIME_TYPE: {"schema": MIME_SCHEMA_VERSION, "kind": "snapshot",
                        "snapshot": _with_schema(self.snapshot)},
        }

    def __repr__(self) -> str:
        return f"<SnapshotView {self.summary()}>"


def _with_schema(snapshot: Snapshot) -> dict[str, Any]:
    return {**snapshot, "schema": snapshot.get("schema", SCHEMA_VERSION)}


@dataclass
class SiteTotal:
    """An allocating line and what its allocations held at the peak."""

    site: str  # "file:line"
    bytes: int  # bytes of its blocks live at the peak
    count: int  # number of its blocks live at the peak


@dataclass
class SurvivingBlock:
    """A block still allocated at the end of the trace."""

    address: int
    size: int
    requested_size: int
    site: str | None  # "file:line" that allocated it, if known
    frames: list[Frame]


@dataclass(eq=False, repr=False)
class TraceResult:
    """What ``%%gpumem_trace`` shows and ``-o`` hands back. Built from a snapshot alone.

    ``holders`` maps a block address to the user variables found holding it; the magic fills it.
    """

    snapshot: Snapshot
    title: str = ""
    device: int | None = None
    top: int = 10
    holders: dict[int, list[str]] = field(default_factory=dict)
    peak_index: int = field(init=False)
    peak_allocated: int = field(init=False)
    top_sites: list[SiteTotal] = field(init=False)
    surviving: list[SurvivingBlock] = field(init=False)

    def __post_init__(self) -> None:
        from ._timeline import build_timeline, live_intervals, peak_index, site_of, top_sites

        self._timeline: Timeline = build_timeline(self.snapshot, self.device)
        tl = self._timeline
        self.peak_index = peak_index(tl)
        self.peak_allocated = int(tl.allocated[self.peak_index]) if len(tl) else 0
        iv = live_intervals(tl)
        self.top_sites = [SiteTotal(s, b, c) for s, b, c in
                          top_sites(tl, iv, self.peak_index, self.top)]
        dev = self.device if self.device is not None else (
            self.snapshot.get("jupyter_gpumem") or {}).get("device", 0)
        self.surviving = [
            SurvivingBlock(b["address"], b["size"], b["requested_size"], site_of(b["frames"]),
                           b["frames"])
            for s in self.snapshot.get("segments", []) if s.get("device", dev) == dev
            for b in s["blocks"] if b["state"] == "active_allocated"]

    @property
    def timeline(self) -> Timeline:
        return self._timeline

    def segments_at(self, at: Literal["peak", "end"] | int = "end") -> list[SegmentInfo]:
        """The block layout at the peak, at the end, or after event ``at``."""
        from ._replay import replay_segments

        n = len(self._timeline)
        if at == "end":
            index = n
        elif at == "peak":
            index = self.peak_index + 1
        elif isinstance(at, int) and not isinstance(at, bool):
            index = at + 1 if at >= 0 else 0
        else:
            raise ValueError(f"at must be 'peak', 'end' or an event index, got {at!r}")
        dev = self.device if self.device is not None else (
            self.snapshot.get("jupyter_gpumem") or {}).get("device", 0)
        return replay_segments(self.snapshot, min(index, n), dev if isinstance(dev, int) else 0)

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        from ._plots import plot_timeline

        return plot_timeline(self.snapshot, ax, device=self.device, **kwargs)

    def plot_segments(self, at: Literal["peak", "end"] | int = "end", ax: Any = None) -> Any:
        from ._plots import plot_segments

        return plot_segments(self.segments_at(at), ax)

    def save_html(self, path: str | os.PathLike[str], title: str | None = None) -> str:
        from ._html import save_html

        return save_html(self.snapshot, path, title=title or self.title or None,
                         device=self.device, timeline=self._timeline)

    def to_json(self) -> dict[str, Any]:
        """The result as plain data (what ``save`` writes and the MIME bundle carries)."""
        return {
            "schema": MIME_SCHEMA_VERSION,
            "kind": "trace",
            "title": self.title,
            "peak_index": self.peak_index,
            "peak_allocated": self.peak_allocated,
            "top_sites": [vars(s) for s in self.top_sites],
            "surviving": [{"address": b.address, "size": b.size,
                           "requested_size": b.requested_size, "site": b.site,
                           "holders": self.holders.get(b.address, [])} for b in self.surviving],
            "snapshot": _with_schema(self.snapshot),
        }

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the result as JSON (``.gz`` compresses); ``load_snapshot`` reads it back."""
        import gzip

        from ._io import dumps_json

        data = dumps_json(self.to_json()).encode("utf-8")
        p = os.fspath(path)
        with (gzip.open(p, "wb") if p.endswith(".gz") else open(p, "wb")) as f:
            f.write(data)
        return p

    def summary(self) -> str:
        n = len(self._timeline)
        lines = [f"gpumem trace{': ' + self.title if self.title else ''}: {n} events, peak "
                 f"{format_bytes(self.peak_allocated)} allocated at event {self.peak_index}, "
                 f"{len(self.surviving)} blocks survive"]
        for s in self.top_sites[:5]:
            lines.append(f"  {format_bytes(s.bytes):>10}  {s.count:>5}×  {s.site}")
        return "\n".join(lines)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from ._plots import plot_timeline

        return {
            "text/plain": self.summary(),
            "image/png": _png(plot_timeline, self.snapshot, device=self.device),
            MIME_TYPE: self.to_json(),
        }

    def __repr__(self) -> str:
        return (f"<TraceResult {len(self._timeline)} events, peak "
                f"{format_bytes(self.peak_allocated)}, {len(self.surviving)} surviving blocks>")
