"""The life of every allocation of a trace, and the bytes live in each band after any events.

One computation for every view of a trace: the notebook's payload, the static picture, the
kernel's answers and the tables all read the same ``Intervals`` (worked out once a timeline,
``live_intervals``) and the same band bytes (``band_values``). Pure numpy over the timeline's
columns; the matching of frees with allocations is ``data.pairs``.

- ``Intervals``: block ``k`` counts as allocated after events ``start[k] .. end[k]-1``, the
  allocations seen in the trace first, in the order of their events, then those older than it.
- ``band_values``: bytes live in each band after each of some events, from the intervals alone
  (Note [Band bytes at some events]): nothing as long as the trace is made.
- ``holder_band_groups``, ``live_at``: which band by holder each interval is in, which are live.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import NO_CELL, NO_STACK
from jupyter_gpumem.data.holders import FREED, HOLDER_BANDS, HOLDER_ROLES, NO_HOLDER, holder_role
from jupyter_gpumem.data.timeline import Timeline
from jupyter_gpumem.data.together import together

__all__ = ["Intervals", "band_values", "holder_band_groups", "live_at", "live_intervals",
           "live_rows"]

IntArray = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]


@dataclass(frozen=True, eq=False)
class Intervals:
    """Live allocations: block ``k`` counts as allocated after events ``start[k] .. end[k]-1``.

    The allocations of the trace come first, in the order of their events (``seen``); then the
    blocks allocated before the trace: those freed in it (start 0, end their free), the
    timeline's ``old`` blocks (live through it, with their own sites), and any bytes older than
    the trace not accounted for so (a trace built without the end state), one entry with site
    NO_SITE and address 0. A block still live at the end ends at ``n``. ``addr``, ``requested``
    and ``cell`` are worked out on first use."""

    start: IntArray
    end: IntArray
    size: IntArray
    stack: Int32Array  # id into the timeline's ``stacks`` (NO_STACK if unknown)
    site_of_stack: Int32Array  # the timeline's: each stack's site (``site``), NO_STACK's last
    stack_ids: IntArray  # the distinct values of ``stack``
    seen: npt.NDArray[np.bool_]  # whether the allocation itself is in the trace
    #: whether the block is freed by the next alloc or free event (a seen one): most blocks
    #: (Note [Short lives])
    short: npt.NDArray[np.bool_]
    #: the trace's (cell, addr, size) columns, and the older blocks' (addr, requested)
    sources: tuple[Any, ...] = field(repr=False)
    #: what is worked out once and read by several views (``ranking``): never compared
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.start)

    @functools.cached_property
    def site(self) -> Int32Array:
        """Id into the timeline's ``sites`` of the allocating line (NO_SITE if unknown): its
        stack's (readers that group by site can group by ``stack`` and this table)."""
        return self.site_of_stack.take(self.stack)

    @functools.cached_property
    def long(self) -> IntArray:
        """The intervals that are not ``short``."""
        return np.flatnonzero(~self.short)

    def short_live(self, events: IntArray) -> IntArray:
        """For each of ``events`` (in ``[0, n)``), the ``short`` interval live after it, or
        -1: there is at most one (Note [Short lives])."""
        seen = len(self) - len(self.older)
        if not seen:
            return np.full(len(events), -1, np.int64)
        last = np.searchsorted(self.start[:seen], events, side="right") - 1  # the last alloc
        k = np.maximum(last, 0)
        hit = (last >= 0) & self.short.take(k) & (self.end.take(k) > events)
        return np.where(hit, k, -1)

    @functools.cached_property
    def cell(self) -> Int32Array:
        """Cell of the allocating event (NO_CELL if unknown)."""
        return self.column_at("cell", slice(None))

    @functools.cached_property
    def addr(self) -> IntArray:
        """Block address (0 for the unseen remainder)."""
        return self.column_at("addr", slice(None))

    @functools.cached_property
    def requested(self) -> IntArray:
        """Bytes the user asked for (the block size if unknown)."""
        return self.column_at("requested", slice(None))

    @property
    def older(self) -> IntArray:
        """The addresses of the intervals older than the trace, in their order."""
        return self.sources[3]  # type: ignore[no-any-return]

    def column_at(self, name: str, rows: Any) -> npt.NDArray[Any]:
        """Column ``name`` of the intervals ``rows`` (increasing indices, a boolean mask or a
        slice), without working out the whole column."""
        if name not in ("cell", "addr", "requested"):
            return getattr(self, name)[rows]  # type: ignore[no-any-return]
        found = self.__dict__.get(name)
        if found is not None:
            return found[rows]  # type: ignore[no-any-return]
        rows = np.arange(len(self))[rows]
        k = len(self) - len(self.older)  # the seen ones come first
        mine, theirs = rows[rows < k], rows[rows >= k] - k
        at = self.start[mine]
        if name == "cell":
            return np.concatenate([self.sources[0][at],
                                   np.full(len(theirs), NO_CELL, np.int32)]).astype(np.int32)
        older = self.sources[3 if name == "addr" else 4]
        return np.concatenate([self.sources[1 if name == "addr" else 2][at],
                               older[theirs]]).astype(np.int64)


def live_intervals(tl: Timeline) -> Intervals:
    """Every allocation's life, for stacked bands and per-site totals (worked out once a
    timeline: the arrays are shared, never to be changed)."""
    found: Intervals | None = tl.memo.get("intervals")
    if found is None:
        found = tl.memo["intervals"] = _intervals(tl)
    return found


def _intervals(tl: Timeline) -> Intervals:
    n = len(tl)
    m = tl.matched
    old = tl.old
    blocks = tl.memo.get("block_size", tl.memo["extra"])  # an alloc's or free's block bytes
    orphan = m.orphan
    orphan_size = blocks[orphan]
    unseen = tl.start_allocated - int(orphan_size.sum()) - int(old.size.sum())
    base = np.array([unseen], np.int64) if unseen > 0 else np.zeros(0, np.int64)
    k = len(orphan) + len(old) + len(base)  # the allocations older than the trace
    no_stack = np.full(len(orphan), NO_STACK, np.int32), np.full(len(base), NO_STACK, np.int32)
    start, end, size, stack, seen, short = together(  # (copies, where some blocks are older)
        n,
        lambda: _joined(m.alloc, np.zeros(k, np.int64)),
        lambda: _joined(m.end, orphan, np.full(len(old) + len(base), n, np.int64)),
        lambda: _joined(blocks.take(m.alloc), orphan_size, old.size, base),
        lambda: _joined(tl.alloc_stack, no_stack[0], old.stack, no_stack[1]),
        lambda: _joined(np.ones(len(m.alloc), bool), np.zeros(k, bool)),
        lambda: _joined(m.at_once, np.zeros(k, bool)))
    return Intervals(
        start=start, end=end, size=size, stack=stack, site_of_stack=tl.site_of_stack,
        stack_ids=np.unique(np.concatenate([tl.memo["alloc_stacks"], old.stack,
                                            no_stack[0][:1], no_stack[1][:1]])),
        seen=seen, short=short,
        sources=(tl.cell, tl.addr, tl.size,
                 np.concatenate([tl.addr[orphan], old.addr, np.zeros(len(base), np.int64)]),
                 np.concatenate([tl.size[orphan], old.requested, base])))


def _joined(first: npt.NDArray[Any], *rest: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``first`` then ``rest``, in ``first``'s dtype (``first`` itself when they are empty:
    the arrays of a trace that holds every allocation are shared, not copied)."""
    if not any(len(r) for r in rest):
        return first
    return np.concatenate([first, *rest]).astype(first.dtype, copy=False)


def live_at(iv: Intervals, index: int) -> npt.NDArray[np.bool_]:
    """Which intervals are live after event ``index`` (-1: before the first event)."""
    if index < 0:
        return ~iv.seen
    return (iv.start <= index) & (iv.end > index)


def live_rows(iv: Intervals, index: int) -> IntArray:
    """``np.flatnonzero(live_at(iv, index))``, from the long intervals and the one short one
    (Note [Short lives])."""
    if index < 0:
        return np.flatnonzero(~iv.seen)
    rows = iv.long
    live = rows.take(np.flatnonzero((iv.start.take(rows) <= index) & (iv.end.take(rows) > index)))
    short = iv.short_live(np.array([index], np.int64))
    return np.sort(np.concatenate([live, short[short >= 0]])) if short[0] >= 0 else live


# Note [Short lives]: most blocks are freed by the next alloc or free event of the trace (a
# temporary; ``Matched.at_once``). Such an interval is live after events start .. end - 1, and
# no allocation falls in it, so the one live after event p, if any, is that of the last
# allocation at or before p: a binary search a question, however many there are. Work over
# every interval (bands at some events, lives at some checkpoints) goes over the others
# (``long``), a fifth of them in a training loop, and asks for the short ones at those events.


# Note [Band bytes at some events]: a band's bytes after event p are the sizes of its intervals
# with start <= p < end. With the events asked for sorted (p_0 < p_1 < ...), an interval holds
# at exactly the events p_j with j in [rank(start), rank(end)), where rank(x) counts the p_j
# below x; so each interval adds its size at one rank and takes it off at another, and a running
# sum over the ranks gives every band at every event: a pass over the intervals, none over the
# trace. The ranks are a lookup in buckets of events holding few of the p_j each (about one:
# the columns of a level-of-detail series hold one each), checked against the p_j of the
# bucket; where the p_j bunch up, a binary search (``np.searchsorted``) instead.


def band_values(iv: Intervals, groups: Int32Array, n_groups: int, n: int, at: IntArray,
                columns: tuple[int, int] | None = None) -> IntArray:
    """Bytes live in each group after the events ``at`` (in ``[0, n)``): an array of shape
    (n_groups, len(at)). ``groups[k]`` is the group (0..n_groups-1) of interval ``k`` (Note
    [Band bytes at some events]). ``columns``: ``(first, width)`` where ``at`` has one event
    in each column ``[first + c * width, first + (c + 1) * width)`` (a level-of-detail series'
    ``peak_at``), which makes the ranks a division."""
    at = np.asarray(at, np.int64)
    if columns is None:
        points, back = np.unique(at, return_inverse=True)
        back = back.reshape(-1)
    else:
        points, back = at, None
    out = np.zeros((n_groups, len(points) + 1), np.int64)
    if len(points) and len(iv):
        rows = iv.long
        first = _ranks(points, iv.start.take(rows), n, columns)
        last = _ranks(points, iv.end.take(rows), n, columns)
        some = np.flatnonzero(first < last)  # those live at one of the events at least
        spans = rows.take(some)
        g = groups.take(spans).astype(np.int64)
        sizes = iv.size.take(spans)
        np.add.at(out, (g, first.take(some)), sizes)
        np.subtract.at(out, (g, last.take(some)), sizes)
    values = np.cumsum(out[:, :-1], axis=1)
    if len(points) and len(iv):  # and the short intervals, one an event at most
        short = iv.short_live(points)
        hit = np.flatnonzero(short >= 0)
        np.add.at(values, (groups.take(short[hit]).astype(np.int64), hit),
                  iv.size.take(short[hit]))
    return values if back is None else values[:, back]


#: Points a bucket of ``_ranks`` may hold before a binary search does better.
_MOST_IN_BUCKET = 6


def _ranks(points: IntArray, values: IntArray, n: int,
           columns: tuple[int, int] | None = None) -> IntArray:
    """``np.searchsorted(points, values)`` (``points`` sorted and distinct, in ``[0, n)``;
    ``values`` in ``[0, n]``), through buckets of events (Note [Band bytes at some events]),
    or the ``columns`` of ``band_values`` that hold one point each."""
    if columns is not None:
        first, width = columns
        col = values - first
        col //= width
        np.clip(col, 0, len(points) - 1, out=col)
        rank: IntArray = col + (values > points.take(col))
        return rank
    width = max(1, (n + 1) // (2 * len(points)))
    edges = np.searchsorted(points, np.arange(0, n + width + 1, width))  # points below each
    held = np.diff(edges)
    most = int(held.max()) if len(held) else 0
    if most > _MOST_IN_BUCKET:
        return np.searchsorted(points, values)
    bucket = values // width
    rank = edges[bucket]
    starts = edges[:-1]
    for j in range(most):  # the bucket's j-th point, where it has one, below the value
        point = np.where(held > j, points[np.minimum(starts + j, len(points) - 1)],
                         np.iinfo(np.int64).max)
        rank += point[bucket] < values
    return rank


def holder_band_groups(iv: Intervals, n: int, held: Mapping[int, Sequence[str]]
                       ) -> Int32Array:
    """The band by holder (an index into ``holders.HOLDER_BANDS``) of every interval of a
    trace of ``n`` events: ``FREED`` if it ends in the trace, else the first role in
    ``HOLDER_ROLES`` of its block's holders (``held``: address -> names), else ``NO_HOLDER``."""
    groups = np.full(len(iv), HOLDER_BANDS.index(NO_HOLDER), np.int32)
    alive = iv.end >= n
    groups[~alive] = HOLDER_BANDS.index(FREED)
    if not held:
        return groups
    for k in np.flatnonzero(alive & (iv.addr != 0)):
        names = held.get(int(iv.addr[k]))
        if names:
            groups[k] = min(HOLDER_ROLES.index(holder_role(name)) for name in names)
    return groups
