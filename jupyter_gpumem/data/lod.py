"""A timeline at any zoom: the level-of-detail series of a window of events, and band bytes at
any event. Pure numpy over a ``Timeline``'s columns; no pass over the events in Python.

A window ``[i0, i1)`` of events is cut into columns of equal width (the last may be shorter):
column ``c`` holds events ``start[c] .. start[c+1]-1``. Each column keeps the lowest and the
highest allocated and reserved bytes after any of its events, so a spike of one event is never
lost however far the view is zoomed out; ``peak_at`` is the event of its highest allocated
bytes (the first such), where the view draws the bands and picks a layout. A column of one
event is that event exactly.

Bytes a band holds after event ``k`` come from ``BandIndex``: each band's changes, stored once
at the events that change it, with their running sum, so any set of events is a binary search
each (Note [Band bytes at any event]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.timeline import IntArray, Intervals, Timeline

__all__ = ["MAX_COLUMNS", "BandIndex", "Lod", "column_starts", "window_lod"]

#: The most columns a window is cut into.
MAX_COLUMNS = 10_000


@dataclass(frozen=True, eq=False)
class Lod:
    """The level-of-detail series of events ``start[0] .. stop-1``: one entry a column."""

    start: IntArray  # first event of each column
    stop: int  # one past the window's last event
    peak_at: IntArray  # event of the column's highest allocated bytes (the first such)
    allocated_min: IntArray
    allocated_max: IntArray
    reserved_min: IntArray
    reserved_max: IntArray
    time_us: IntArray  # time of each column's first event

    def __len__(self) -> int:
        return len(self.start)

    @property
    def per_column(self) -> int:
        """Events in a full column (1: every event its own column, the series is exact)."""
        return int(self.start[1] - self.start[0]) if len(self.start) > 1 else max(
            self.stop - (int(self.start[0]) if len(self.start) else self.stop), 1)


def column_starts(i0: int, i1: int, columns: int) -> IntArray:
    """The first event of each column of ``[i0, i1)`` cut into at most ``columns`` columns of
    equal width (the last may be shorter)."""
    if not 0 <= i0 <= i1:
        raise ValueError(f"a window needs 0 <= i0 <= i1, got [{i0}, {i1})")
    if not 1 <= columns <= MAX_COLUMNS:
        raise ValueError(f"columns must be in [1, {MAX_COLUMNS}], got {columns}")
    width = max(1, -(-(i1 - i0) // columns))
    return np.arange(i0, i1, width, dtype=np.int64)


def window_lod(tl: Timeline, i0: int, i1: int, columns: int) -> Lod:
    """The series of events ``[i0, i1)`` of ``tl`` in at most ``columns`` columns."""
    n = len(tl)
    if i1 > n:
        raise ValueError(f"the window [{i0}, {i1}) passes the trace's {n} events")
    start = column_starts(i0, i1, columns)
    empty = np.zeros(0, np.int64)
    if not len(start):
        return Lod(start=start, stop=i1, peak_at=empty, allocated_min=empty,
                   allocated_max=empty, reserved_min=empty, reserved_max=empty, time_us=empty)
    offsets = start - i0
    alloc = tl.allocated[i0:i1]
    res = tl.reserved[i0:i1]
    return Lod(start=start, stop=i1, peak_at=i0 + _argmax_columns(alloc, offsets),
               allocated_min=np.minimum.reduceat(alloc, offsets),
               allocated_max=np.maximum.reduceat(alloc, offsets),
               reserved_min=np.minimum.reduceat(res, offsets),
               reserved_max=np.maximum.reduceat(res, offsets),
               time_us=tl.time_us[start])


def _argmax_columns(y: IntArray, offsets: IntArray) -> IntArray:
    """The offset in ``y`` of the first highest value of each column (columns of equal width
    from ``offsets``, the last possibly shorter)."""
    width = int(offsets[1] - offsets[0]) if len(offsets) > 1 else len(y)
    full = len(y) // width
    out = np.empty(len(offsets), np.int64)
    if full:
        out[:full] = (y[:full * width].reshape(full, width).argmax(axis=1)
                      + offsets[:full])
    if full < len(offsets):  # the shorter last column
        last = int(offsets[-1])
        out[-1] = last + int(y[last:].argmax())
    return out


# Note [Band bytes at any event]: a band's bytes after event k are the sizes of its intervals
# with start <= k < end (``timeline.band_values``). Each event starts at most one interval (an
# alloc) or ends at most one (a free), so a band changes only at its own events: the index keeps,
# for each band, those events (sorted, as the trace is) and the running sum of their changes,
# plus the bytes of its intervals older than the trace. The bytes after k are that base plus the
# running sum at the last of its events <= k: one ``searchsorted`` a band for any set of events,
# and about 12 bytes an alloc or free kept.


class BandIndex:
    """Bytes live in each band after any event (Note [Band bytes at any event])."""

    def __init__(self, iv: Intervals, groups: npt.NDArray[np.int32], n_groups: int,
                 n: int) -> None:
        """``groups[k]``: the band (0 .. n_groups-1) of interval ``k``; ``n``: events."""
        sizes = iv.size.astype(np.int64)
        seen = iv.seen
        ends = iv.end < n
        band = np.full(n, -1, np.int8 if n_groups < 127 else np.int32)
        delta = np.zeros(n, np.int64)
        band[iv.start[seen]] = groups[seen]
        delta[iv.start[seen]] = sizes[seen]
        band[iv.end[ends]] = groups[ends]
        delta[iv.end[ends]] -= sizes[ends]
        older = ~seen
        self.base = np.bincount(groups[older], sizes[older].astype(np.float64),
                                minlength=n_groups).astype(np.int64)
        self.events: list[npt.NDArray[np.int32 | np.int64]] = []
        self.sums: list[IntArray] = []
        small = np.int32 if n < 2**31 else np.int64
        for g in range(n_groups):
            at = np.flatnonzero(band == g)
            self.events.append(at.astype(small))
            self.sums.append(np.cumsum(delta[at]))

    def __len__(self) -> int:
        return len(self.events)

    def at(self, events: IntArray) -> IntArray:
        """Bytes of each band after each of ``events``: shape (bands, len(events))."""
        out = np.empty((len(self.events), len(events)), np.int64)
        for g, (at, sums) in enumerate(zip(self.events, self.sums, strict=True)):
            pos = np.searchsorted(at, events, side="right") - 1
            out[g] = self.base[g] + np.where(pos >= 0, sums[np.maximum(pos, 0)] if len(sums)
                                             else 0, 0)
        return out
