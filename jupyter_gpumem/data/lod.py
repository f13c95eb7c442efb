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

from jupyter_gpumem.data.intervals import Intervals
from jupyter_gpumem.data.timeline import IntArray, Timeline

__all__ = ["MAX_COLUMNS", "BandIndex", "Extremes", "Lod", "column_extremes", "column_starts",
           "extreme_points", "step_extremes", "window_lod"]

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
    alloc = column_extremes(tl.allocated, start, i1)
    res = step_extremes(tl.reserved_events, tl.reserved_levels, start, i1)
    return Lod(start=start, stop=i1, peak_at=alloc.argmax, allocated_min=alloc.min,
               allocated_max=alloc.max, reserved_min=res.min, reserved_max=res.max,
               time_us=tl.time_us[start])


@dataclass(frozen=True, eq=False)
class Extremes:
    """The lowest and highest value of each column of a series, and the first event of each."""

    min: IntArray
    max: IntArray
    argmin: IntArray
    argmax: IntArray


def column_extremes(y: IntArray, starts: IntArray, stop: int) -> Extremes:
    """Of ``y`` over the columns ``[starts[c], starts[c+1])`` (the last to ``stop``; equal
    widths, the last possibly shorter): each column's extremes and where they are first."""
    width = int(starts[1] - starts[0]) if len(starts) > 1 else stop - int(starts[0])
    first = int(starts[0])
    full = (stop - first) // width
    arg_low, arg_high = np.empty(len(starts), np.int64), np.empty(len(starts), np.int64)
    if full:
        rows = y[first:first + full * width].reshape(full, width)
        np.add(rows.argmin(axis=1), starts[:full], out=arg_low[:full])
        np.add(rows.argmax(axis=1), starts[:full], out=arg_high[:full])
    if full < len(starts):  # the shorter last column
        last = y[int(starts[-1]):stop]
        arg_low[-1] = starts[-1] + int(last.argmin())
        arg_high[-1] = starts[-1] + int(last.argmax())
    return Extremes(y.take(arg_low), y.take(arg_high), arg_low, arg_high)


def step_extremes(events: IntArray, levels: IntArray, starts: IntArray, stop: int) -> Extremes:
    """``column_extremes`` of a series that is ``levels[0]`` before ``events[0]`` and
    ``levels[j + 1]`` from ``events[j]`` on (``events`` increasing): from its few steps, never
    the whole series."""
    first = np.searchsorted(events, starts, side="right")  # the level at each column's start
    ends = np.append(starts[1:], stop)
    last = np.searchsorted(events, ends - 1, side="right")  # and at its last event
    low, high = levels[first], levels[first]
    arg_low, arg_high = starts.copy(), starts.copy()
    busy = np.flatnonzero(last > first)  # the columns where it steps (few: steps are)
    if len(busy):
        # the levels a busy column steps to: first+1 .. last, from events first .. last-1
        counts = last[busy] - first[busy]
        owner = np.repeat(np.arange(len(busy)), counts)
        at = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts) \
            + np.repeat(first[busy], counts)  # level index - 1 = the event's index
        values = levels[at + 1]
        for pick, out, arg in ((np.minimum, low, arg_low), (np.maximum, high, arg_high)):
            best = pick.reduceat(values, np.cumsum(counts) - counts)
            mine = out[busy]
            better = pick(best, mine) != mine  # strictly: the column's start is first
            cols = busy[better]
            out[cols] = best[better]
            hit = values == best[owner]  # the first event reaching each column's best
            hit_first = np.unique(owner[hit], return_index=True)[1]
            arg[cols] = events[at[np.flatnonzero(hit)[hit_first]]][better]
    return Extremes(low, high, arg_low, arg_high)


def extreme_points(tl: Timeline, max_points: int) -> IntArray:
    """The events a picture of ``tl`` is drawn through: every event if there are at most
    ``max_points``, else the first and last and, in each of ``max_points // 2`` columns, the
    first events of the lowest and the highest allocated and reserved bytes (so a peak or a
    dip of one event is never lost; ``timeline.downsample`` of each series, together)."""
    n = len(tl)
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    starts = np.arange(0, n, -(-n // max(1, max_points // 2)), dtype=np.int64)
    a = column_extremes(tl.allocated, starts, n)
    r = step_extremes(tl.reserved_events, tl.reserved_levels, starts, n)
    return np.unique(np.concatenate([a.argmin, a.argmax, r.argmin, r.argmax, [0, n - 1]]))


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
