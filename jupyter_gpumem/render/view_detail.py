"""A trace's views at any zoom, any event: what a kernel answers a view with.

``TraceDetail`` is worked out once a trace (its timeline, intervals, bands, every block and
segment life) and gives the parts of the view payload (``view_payload``) and the answers to a
view's two questions, in the payload's own shapes (bytes columns):

- ``window(i0, i1, columns)``: the timeline of events ``[i0, i1)`` in at most ``columns``
  columns (``data.lod``), and the lives of every block and segment live in it when there are at
  most ``max_lives``, so the layout at any event of the window, and the block under a click,
  need no further question;
- ``layout(k)``: the lives live after event ``k``: the layout there, exactly (the largest
  ``max_blocks`` blocks when more are live).

Each answer carries the stacks and sites its lives point to (``view_lives.Names``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import SHOWN_FRAMES
from jupyter_gpumem.data.devices import device_segments, device_total, device_trace
from jupyter_gpumem.data.holders import FREED, HOLDER_BANDS
from jupyter_gpumem.data.intervals import band_values, holder_band_groups, live_intervals
from jupyter_gpumem.data.lod import BandIndex, window_lod
from jupyter_gpumem.data.mapped import virtual_range
from jupyter_gpumem.data.ranking import band_groups
from jupyter_gpumem.data.sites import cell_of, is_library_file, short_site
from jupyter_gpumem.data.timeline import (
    SegmentLives,
    Timeline,
    peak_allocated,
    peak_index,
    segment_lives,
)
from jupyter_gpumem.render.block_lives import BlockLives, block_lives
from jupyter_gpumem.render.payload_columns import column
from jupyter_gpumem.render.view_lives import Names, live_in

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, Snapshot

__all__ = ["MAX_ANSWER_LIVES", "MAX_LAYOUT_BLOCKS", "NAMES_BUDGET", "TraceDetail", "view_stack"]

Bands = Literal["site", "holder"]

#: Block lives a window's answer carries at most (more: none, the view asks for layouts).
MAX_ANSWER_LIVES = 20_000
#: Blocks a layout's answer carries at most: the largest (the view draws at most 50,000).
MAX_LAYOUT_BLOCKS = 50_000
#: Characters of JSON the stacks and sites of one payload or answer take at most (a notebook
#: file's indentation adds to it: at most about half again for short names).
NAMES_BUDGET = 200_000

_BLOCK_DTYPES = {"start": "i4", "end": "i4", "addr": "f8", "size": "f8", "requested": "f8",
                 "stack": "i4", "site": "i4", "cell": "i4", "band": "i4"}


def view_stack(frames: Sequence[Frame], cell_files: Mapping[str, int] | None = None
               ) -> list[list[Any]]:
    """The user's frames (no CuPy, numpy, IPython or other installed package, nothing outside
    the first module level) as ``[filename, line, name]`` triples, innermost first; the
    innermost three if none is the user's. A notebook cell's file is named ``cell [N]``."""
    user = [f for f in frames if not is_library_file(f["filename"])] or list(frames[:3])
    top = next((i for i, f in enumerate(user) if f["name"] == "<module>"), len(user) - 1)
    return [[_file_name(f["filename"], cell_files), f["line"], f["name"]]
            for f in user[:top + 1][:SHOWN_FRAMES]]


def _file_name(filename: str, cell_files: Mapping[str, int] | None) -> str:
    cell = cell_of(filename, cell_files)
    return filename if cell is None else f"cell [{cell}]"


@dataclass(eq=False)
class TraceDetail:
    """Everything a trace's views are drawn from, for one device (see the module notes)."""

    timeline: Timeline
    peak: int  # the event of the highest allocated bytes; -1: at the start
    band_labels: list[str]
    band_sites: list[int]  # site bands: the timeline's site id of each band but "other"
    bands_by: Bands
    groups: npt.NDArray[np.int32]  # the band of each interval
    lives: BlockLives  # every block life (``view_lives.block_lives``)
    segments: SegmentLives
    ranges: npt.NDArray[np.float64]  # virtual bytes each expandable segment life reserves
    cell_files: Mapping[str, int] | None

    @classmethod
    def build(cls, snapshot: Snapshot, device: int, tl: Timeline, *,
              cell_files: Mapping[str, int] | None, bands: Bands, top: int,
              held: Mapping[int, Sequence[str]]) -> TraceDetail:
        """The detail of ``snapshot``'s trace on ``device`` (``tl`` its timeline). ``top``
        sites get a band each with ``bands="site"``; with ``bands="holder"`` a block live at
        the end is in the band of its holders (``held``: address -> names)."""
        n = len(tl)
        iv = live_intervals(tl)
        peak = -1 if peak_allocated(tl) <= tl.start_allocated else peak_index(tl)
        if bands == "site":
            chosen, groups = band_groups(iv, peak, top)
            lives = block_lives(tl, iv, groups, len(chosen))
            labels = [short_site(tl.sites[s]) for s in chosen] + ["other"]
        else:
            chosen = []
            groups = holder_band_groups(iv, n, held)
            lives = block_lives(tl, iv, groups, HOLDER_BANDS.index(FREED))
            # Leave out the bands no block is in; renumber the rest, bottom first.
            used = np.bincount(groups, minlength=len(HOLDER_BANDS)) > 0
            used[HOLDER_BANDS.index(FREED)] |= lives.older_completions > 0
            renumber = (np.cumsum(used) - 1).astype(np.int32)
            groups = renumber[groups]
            lives.renumber_bands(renumber)
            labels = [HOLDER_BANDS[g] for g in np.flatnonzero(used).tolist()]
        sl = segment_lives(tl, device_segments(snapshot, device), device_trace(snapshot, device))
        return cls(timeline=tl, peak=peak, band_labels=labels, band_sites=list(chosen),
                   bands_by=bands, groups=groups, lives=lives, segments=sl,
                   ranges=_ranges(sl, device_total(snapshot, device)), cell_files=cell_files)

    @property
    def n(self) -> int:
        return len(self.timeline)

    def bands_at(self, events: npt.NDArray[np.int64],
                 columns: tuple[int, int] | None = None) -> npt.NDArray[np.int64]:
        """Bytes of each band after each of ``events`` (``columns``: as ``band_values``
        takes them): from the band index once it is built (the first window builds it, for
        the many that follow), else from the intervals."""
        if "band_index" in self.__dict__:
            return self.band_index.at(events)
        return band_values(live_intervals(self.timeline), self.groups, len(self.band_labels),
                           self.n, events, columns)

    @functools.cached_property
    def band_index(self) -> BandIndex:
        """Band bytes at any event (built on first use: the first window asks for it). The
        lives' starts and ends, which every window and layout reads, are worked out with it."""
        self.lives["start"], self.lives["end"]
        return BandIndex(live_intervals(self.timeline), self.groups, len(self.band_labels),
                         self.n)

    # -- names -----------------------------------------------------------------------------

    def names(self, budget: int = NAMES_BUDGET) -> Names:
        """A fresh table of the stacks and sites one payload or answer is sent."""
        tl = self.timeline
        return Names(self._stack, lambda s: short_site(tl.sites[s]), budget)

    def _stack(self, sid: int) -> list[list[Any]]:
        return view_stack(self.timeline.stacks[sid], self.cell_files)

    # -- parts -----------------------------------------------------------------------------

    def series(self, i0: int, i1: int, columns: int) -> dict[str, Any]:
        """The timeline of events ``[i0, i1)``: min and max of each column, the bands at its
        highest allocated event (``peak_at``)."""
        lod = window_lod(self.timeline, i0, i1, columns)
        bands = self.bands_at(lod.peak_at, (i0, lod.per_column))
        return {"index": column(lod.start, "i4"), "time_us": column(lod.time_us),
                "allocated": column(lod.allocated_max), "reserved": column(lod.reserved_max),
                "allocated_min": column(lod.allocated_min),
                "reserved_min": column(lod.reserved_min),
                "peak_at": column(lod.peak_at, "i4"),
                "bands": [column(b) for b in bands],
                "window": [i0, i1], "per_column": lod.per_column}

    def lives_part(self, blocks: npt.NDArray[np.bool_], segments: npt.NDArray[np.bool_],
                   names: Names, *, checkpoints: list[int] | None = None,
                   exact: tuple[int, int] | None = None, dropped: int = 0) -> dict[str, Any]:
        """The lives picked by ``blocks`` and ``segments`` (masks), their stacks and sites
        renumbered into ``names``. ``exact``: the events ``[lo, hi)`` at which they are every
        life there is, with their stacks and sites (an answer's); None: a payload's, exact
        everywhere or at ``checkpoints``, its names the payload's. ``dropped``: lives that
        belong there but were left out."""
        picked = self.lives.take(blocks)
        picked["stack"] = names.stack_ids(picked["stack"])
        picked["site"] = names.site_ids(picked["site"])
        sl = self.segments
        return {
            "blocks": {name: column(col, _BLOCK_DTYPES[name]) for name, col in picked.items()},
            "segments": {
                "start": column(sl.start[segments], "i4"), "end": column(sl.end[segments], "i4"),
                "addr": column(sl.addr[segments]), "size": column(sl.size[segments]),
                "stream": column(sl.stream[segments]), "small": column(sl.small[segments], "u1"),
                "expandable": column(sl.expandable[segments], "u1"),
                "group": column(sl.group[segments], "i4"),
                "range": column(self.ranges[segments]),
            },
            "checkpoints": checkpoints,
            "dropped": dropped,
            **({} if exact is None else {"exact": list(exact), "stacks": names.stacks,
                                         "sites": names.sites}),
        }

    # -- answers ---------------------------------------------------------------------------

    def window(self, i0: int, i1: int, columns: int,
               max_lives: int = MAX_ANSWER_LIVES) -> dict[str, Any]:
        """The answer to "events [i0, i1) in ``columns`` columns" (see the module notes)."""
        n = self.n
        if not (0 <= i0 < i1 <= n):
            raise ValueError(f"a window needs 0 <= i0 < i1 <= {n}, got [{i0}, {i1})")
        self.band_index  # noqa: B018 (a view that asks for one window asks for more: build it)
        out: dict[str, Any] = {"timeline": self.series(i0, i1, columns), "lives": None}
        blocks = live_in(self.lives["start"], self.lives["end"], i0, i1)
        if int(blocks.sum()) <= max_lives:
            names = self.names()
            segments = live_in(self.segments.start, self.segments.end, i0, i1)
            out["lives"] = self.lives_part(blocks, segments, names, exact=(i0, i1))
        return out

    def layout(self, k: int, max_blocks: int = MAX_LAYOUT_BLOCKS) -> dict[str, Any]:
        """The answer to "the layout after event ``k``" (-1: before the trace)."""
        if not -1 <= k < max(self.n, 0):
            raise ValueError(f"an event must be in [-1, {self.n - 1}], got {k}")
        blocks = live_in(self.lives["start"], self.lives["end"], k, k + 1)
        live = int(blocks.sum())
        if live > max_blocks:  # the largest: the picture is about where the bytes are
            idx = np.flatnonzero(blocks)
            drop = idx[np.argsort(-self.lives["size"][idx], kind="stable")[max_blocks:]]
            blocks[drop] = False
        names = self.names()
        segments = live_in(self.segments.start, self.segments.end, k, k + 1)
        return {"lives": self.lives_part(blocks, segments, names, exact=(k, k + 1),
                                         dropped=live - int(blocks.sum()))}


def _ranges(sl: SegmentLives, total: int) -> npt.NDArray[np.float64]:
    """The virtual bytes each expandable segment reserves (0: classic, or the device's size
    unknown)."""
    if not total:
        return np.zeros(len(sl), np.float64)
    big, small = virtual_range(total, small=False), virtual_range(total, small=True)
    return np.where(sl.expandable, np.where(sl.small, small, big), 0).astype(np.float64)
