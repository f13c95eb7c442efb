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

from jupyter_gpumem.data.codes import NO_CELL, NO_SITE, NO_STACK
from jupyter_gpumem.data.holders import FREED, HOLDER_BANDS, HOLDER_ROLES, NO_HOLDER, holder_role
from jupyter_gpumem.data.timeline import Timeline

__all__ = ["Intervals", "band_values", "holder_band_groups", "live_at", "live_intervals"]

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
    site: Int32Array
    stack: Int32Array  # id into the timeline's ``stacks`` (NO_STACK if unknown)
    seen: npt.NDArray[np.bool_]  # whether the allocation itself is in the trace
    #: the trace's (cell, addr, size) columns, and the older blocks' (addr, requested)
    sources: tuple[Any, ...] = field(repr=False)
    #: what is worked out once and read by several views (``ranking``): never compared
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.start)

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
    older_addr = np.concatenate([tl.addr[orphan], old.addr, np.zeros(len(base), np.int64)])
    older_requested = np.concatenate([tl.size[orphan], old.requested, base])
    return Intervals(
        start=np.concatenate([m.alloc, np.zeros(k, np.int64)]),
        end=np.concatenate([m.end, orphan, np.full(len(old) + len(base), n, np.int64)]),
        size=np.concatenate([blocks[m.alloc], orphan_size, old.size, base]).astype(np.int64),
        site=np.concatenate([tl.site_of_stack[tl.alloc_stack],
                             np.full(len(orphan), NO_SITE, np.int32), old.site,
                             np.full(len(base), NO_SITE, np.int32)]).astype(np.int32),
        stack=np.concatenate([tl.alloc_stack, np.full(len(orphan), NO_STACK, np.int32),
                              old.stack, np.full(len(base), NO_STACK, np.int32)]
                             ).astype(np.int32),
        seen=np.arange(len(m.alloc) + k) < len(m.alloc),
        sources=(tl.cell, tl.addr, tl.size, older_addr, older_requested))


def live_at(iv: Intervals, index: int) -> npt.NDArray[np.bool_]:
    """Which intervals are live after event ``index`` (-1: before the first event)."""
    if index < 0:
        return ~iv.seen
    return (iv.start <= index) & (iv.end > index)


# Note [Band bytes at some events]: a band's bytes after event p are the sizes of its intervals
# with start <= p < end. With the events asked for sorted (p_0 < p_1 < ...), an interval holds
# at exactly the events p_j with j in [rank(start), rank(end)), where rank(x) counts the p_j
# below x; so each interval adds its size at one rank and takes it off at another, and a running
# sum over the ranks gives every band at every event: a pass over the intervals, none over the
# trace. The ranks are a lookup in buckets of events holding few of the p_j each (about one:
# the columns of a level-of-detail series hold one each), checked against the p_j of the
# bucket; where the p_j bunch up, a binary search (``np.searchsorted``) instead.


def band_values(iv: Intervals, groups: Int32Array, n_groups: int, n: int,
                at: IntArray) -> IntArray:
    """Bytes live in each group after the events ``at`` (in ``[0, n)``): an array of shape
    (n_groups, len(at)). ``groups[k]`` is the group (0..n_groups-1) of interval ``k`` (Note
    [Band bytes at some events])."""
    at = np.asarray(at, np.int64)
    points, back = np.unique(at, return_inverse=True)
    out = np.zeros((n_groups, len(points) + 1), np.int64)
    if len(points) and len(iv):
        first = _ranks(points, iv.start, n)
        last = _ranks(points, iv.end, n)
        spans = np.flatnonzero(first < last)
        g = groups[spans].astype(np.int64)
        sizes = iv.size[spans]
        np.add.at(out, (g, first[spans]), sizes)
        np.subtract.at(out, (g, last[spans]), sizes)
    return np.cumsum(out[:, :-1], axis=1)[:, back.reshape(-1)]


#: Points a bucket of ``_ranks`` may hold before a binary search does better.
_MOST_IN_BUCKET = 6


def _ranks(points: IntArray, values: IntArray, n: int) -> IntArray:
    """``np.searchsorted(points, values)`` (``points`` sorted and distinct, in ``[0, n)``;
    ``values`` in ``[0, n]``), through buckets of events (Note [Band bytes at some events])."""
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
