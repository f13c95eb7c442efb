"""The lives of a trace's blocks and segments, and the few of them a view is sent.

After event ``k`` (-1: before the first event) the layout is exactly the segments and blocks
with ``start <= k < end``. A trace of millions of events has millions of lives; a saved view
keeps those live at some checkpoints (``bound_lives``: exact there), a kernel sends those live
in a window or at one event (``live_in``). The stacks and sites they point to travel with them,
renumbered and held to a budget of characters (``Names``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import (
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_SITE,
    NO_STACK,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.intervals import Intervals
    from jupyter_gpumem.data.timeline import Timeline

__all__ = ["LIFE_COLUMNS", "STACK_LEFT_OUT", "BlockLives", "Lifespans", "Names", "Spans",
           "block_lives", "bound_lives", "live_in"]

#: The stack id of a block whose stack the view's budget left out (its frames are in the file).
STACK_LEFT_OUT = -2
#: The columns of a block life, in the order a view is sent them.
LIFE_COLUMNS = ("start", "end", "addr", "size", "requested", "stack", "site", "cell", "band")
#: Evenly spaced checkpoints a bounded view keeps at most (a power of two: halving them keeps
#: every other one).
SPREAD = 1024


class BlockLives(Mapping[str, npt.NDArray[Any]]):
    """Every block life (``block_lives``), a column (``LIFE_COLUMNS``) a key. ``start``, ``end``
    and ``band`` are arrays; the others are read from the intervals when first asked for, or
    for the lives a view is sent only (``take``): a trace of millions of lives sends thousands."""

    def __init__(self, iv: Intervals, rows: Any, start: npt.NDArray[np.int64],
                 end: npt.NDArray[np.int64], band: npt.NDArray[np.int32],
                 extra: dict[str, npt.NDArray[Any]], short: npt.NDArray[np.bool_]) -> None:
        """``rows``: the interval of each life but the last ``len(extra["addr"])``, whose
        columns ``extra`` gives; ``short``: the lives of short intervals (``Intervals.short``)
        that end with them or the event after (Note [Short lives] holds for them)."""
        self._iv, self._rows, self._extra, self._short = iv, rows, extra, short
        self._cols: dict[str, npt.NDArray[Any]] = {"start": start, "end": end, "band": band}

    @property
    def count(self) -> int:
        """How many lives there are."""
        return len(self._cols["start"])

    def coarsest(self, n: int, shift: int, peak: int, every: int) -> npt.NDArray[np.int8]:
        """``_coarsest`` of every life: worked out for the long ones, and for the short ones
        found live at a checkpoint (one a checkpoint at most, Note [Short lives])."""
        start, end = self._cols["start"], self._cols["end"]
        out = np.full(len(start), -1, np.int8)
        rows = np.flatnonzero(~self._short)
        out[rows] = _coarsest(start.take(rows), end.take(rows), n, shift, peak, every)
        events = np.unique(np.concatenate([np.arange(1 << shift, n + 1, 1 << shift) - 1,
                                           [peak, n - 1]]))
        events = events[events >= 0]
        seen = len(self._iv) - len(self._iv.older)  # the first lives: the seen intervals
        if not seen:
            return out
        last = np.searchsorted(start[:seen], events, side="right") - 1
        k = np.maximum(last, 0)
        hit = (last >= 0) & self._short.take(k) & (end.take(k) > events)
        rows = np.unique(k[hit])
        out[rows] = _coarsest(start.take(rows), end.take(rows), n, shift, peak, every)
        return out

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        found = self._cols.get(name)
        if found is None:
            if name not in LIFE_COLUMNS:
                raise KeyError(name)
            found = self._cols[name] = np.concatenate([self._iv.column_at(name, self._rows),
                                                       self._extra[name]])
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(LIFE_COLUMNS)

    def __len__(self) -> int:
        return len(LIFE_COLUMNS)

    @property
    def older_completions(self) -> int:
        """Lives of blocks whose free was requested before the trace (the last ones)."""
        return len(self._extra["addr"])

    def renumber_bands(self, table: npt.NDArray[np.int32]) -> None:
        """Band ``b`` becomes ``table[b]``."""
        self._cols["band"] = table[self._cols["band"]]

    def take(self, mask: npt.NDArray[np.bool_]) -> dict[str, npt.NDArray[Any]]:
        """The columns of the lives ``mask`` picks."""
        idx = np.flatnonzero(mask)
        mine = len(self._cols["start"]) - len(self._extra["addr"])
        rows = np.arange(len(self._iv))[self._rows][idx[idx < mine]]
        theirs = idx[idx >= mine] - mine
        return {name: self._cols[name][idx] if name in self._cols else np.concatenate(
                    [self._iv.column_at(name, rows), self._extra[name][theirs]])
                for name in LIFE_COLUMNS}


def block_lives(tl: Timeline, iv: Intervals, groups: npt.NDArray[np.int32],
                freed: int) -> BlockLives:
    """The lives of the blocks of the layout: the allocations seen in the trace and the blocks
    older than it that have an address (start -1), each until its address leaves the layout.
    A life's ``band`` is its interval's group (``groups``); ``freed`` for a block older than
    the trace whose free was requested before it (no interval: its bytes count in no band).

    That is at the ``free_completed`` of its free: the intervals end at ``free_requested``,
    when the bytes stop counting as allocated. A ``free_completed`` whose request came before
    the trace is one more block older than the trace."""
    seen = len(iv) - len(iv.older)
    addressed = iv.older != 0
    rows: Any = slice(None) if addressed.all() else np.concatenate(
        [np.arange(seen), seen + np.flatnonzero(addressed)])
    ends = iv.end[rows]
    end, orphans, searched = _completions(tl, ends, every_request=bool(addressed.all()))
    mine, k = len(ends), len(orphans)  # the lives of intervals, then of older completions
    start = np.full(mine + k, -1, np.int64)
    start[:seen] = iv.start[:seen]
    band = np.full(mine + k, freed, np.int32)
    band[:mine] = groups[rows]
    short = np.zeros(mine + k, bool)  # short: and ended by the next event at the latest
    short[:mine] = iv.short[rows]
    if searched:
        short[:mine] &= end[:mine] - ends <= 1
    extra = {"addr": tl.addr[orphans], "size": tl.memo.get("block_size", tl.memo["extra"])[
                 orphans], "requested": tl.size[orphans],
             "stack": np.full(k, NO_STACK, np.int32), "site": np.full(k, NO_SITE, np.int32),
             "cell": np.full(k, NO_CELL, np.int32)}
    return BlockLives(iv, rows, start, end, band, extra, short)


def _completions(tl: Timeline, end: npt.NDArray[np.int64], every_request: bool = False
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], bool]:
    """Each life's end (``end``) moved from a ``free_requested`` to the ``free_completed`` of
    the same address after it (the request itself where there is none), then the
    ``free_completed`` events that end no life (the ends of as many more lives); and those
    events; and whether some end was searched for (else each moved by one event at most).
    ``every_request``: every request ends a life. Our allocator completes a free at once, the
    next event: those are found by comparing each event with the next, for every event at
    once; only the rest are searched."""
    n = len(tl)
    action, addr = tl.action, tl.addr
    request = action == FREE_REQUESTED
    requests = int(np.count_nonzero(request))
    if not requests:
        return end.copy(), np.zeros(0, np.int64), False
    at_once = np.zeros(n + 1, bool)  # by event: a request completed by the next event
    np.logical_and(request[:-1], action[1:] == FREE_COMPLETED, out=at_once[:n - 1])
    at_once[:n - 1] &= addr[:-1] == addr[1:]
    quick = at_once.take(end)
    done = int(np.count_nonzero(action == FREE_COMPLETED))
    quick_ends = int(np.count_nonzero(quick))
    if int(np.count_nonzero(at_once)) == requests:
        searched = False  # every request is completed by the next event
    else:
        searched = every_request or bool(np.any(np.append(request, False).take(end) & ~quick))
    if not searched and (every_request or quick_ends == done):
        # each free_completed right after a request that ends a life ends that life
        orphans = np.zeros(0, np.int64)
        if quick_ends < done:
            unended = action == FREE_COMPLETED
            unended[1:] &= ~at_once[:n - 1]
            orphans = np.flatnonzero(unended)
        out = np.empty(len(end) + len(orphans), np.int64)
        np.add(end, quick, out=out[:len(end)])
        out[len(end):] = orphans
        return out, orphans, False
    out = end + quick
    slow = np.flatnonzero(np.append(request, False).take(end) & ~quick)
    finished = np.flatnonzero(action == FREE_COMPLETED)
    if len(slow) and len(finished):
        used = np.zeros(n, bool)
        used[out[quick]] = True
        out[slow] = _searched(tl, end[slow], finished[~used[finished]])
    ends = np.zeros(n + 1, bool)
    ends[out] = True
    orphans = finished[~ends[finished]]
    return np.concatenate([out, orphans]), orphans, True


def _searched(tl: Timeline, req: npt.NDArray[np.int64], done: npt.NDArray[np.int64]
              ) -> npt.NDArray[np.int64]:
    """The first ``free_completed`` (among ``done``) of the address of each request ``req``
    after it (the request itself where there is none)."""
    n = len(tl)
    out = req.copy()
    if not len(done):
        return out
    # The first free_completed of the same address after the request: one sorted key.
    addr = tl.addr[req]
    _, inv = np.unique(np.concatenate([tl.addr[done], addr]), return_inverse=True)
    stride = n + 1
    done_key = inv[:len(done)].astype(np.int64) * stride + done
    order = np.argsort(done_key)
    done_key, done_sorted = done_key[order], done[order]
    req_addr = inv[len(done):].astype(np.int64)
    pos = np.searchsorted(done_key, req_addr * stride + req, side="right")
    hit = np.zeros(len(req), bool)
    found = pos < len(done_key)
    hit[found] = done_key[pos[found]] // stride == req_addr[found]
    out[hit] = done_sorted[pos[hit]]
    return out


def live_in(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], lo: int,
            hi: int) -> npt.NDArray[np.bool_]:
    """Which lives hold after some event of ``[lo, hi)`` (``lo`` may be -1: before the
    trace)."""
    return (start < hi) & (end > lo)


class Spans:
    """Lives given as their ``start`` and ``end`` (segments'), for ``bound_lives``."""

    def __init__(self, start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]) -> None:
        self.start, self.end = start, end

    @property
    def count(self) -> int:
        return len(self.start)

    def coarsest(self, n: int, shift: int, peak: int, every: int) -> npt.NDArray[np.int64]:
        return _coarsest(self.start, self.end, n, shift, peak, every)


class Lifespans(Protocol):
    """What ``bound_lives`` reads of a kind of lives (``Spans``, ``BlockLives``)."""

    @property
    def count(self) -> int: ...

    def coarsest(self, n: int, shift: int, peak: int, every: int) -> npt.NDArray[Any]: ...


def bound_lives(kinds: Sequence[tuple[Lifespans, int]], n: int, peak: int
                ) -> tuple[list[npt.NDArray[np.bool_]], list[int] | None]:
    """Which lives of each kind (``(lives, most)``: blocks, segments) to keep, and the
    checkpoints (None: all kept, exact everywhere).

    Past a kind's ``most``: the lives live at -1, the peak, the last event and evenly spaced
    events (at most ``SPREAD``, every ``2**k``-th), halving the evenly spaced ones (keeping
    every other one) until every kind fits. If the three fixed checkpoints alone hold too many,
    the largest-index lives are cut and no event is exact but the checkpoints still name where
    the layout is closest."""
    if all(lives.count <= most for lives, most in kinds):
        return [np.ones(lives.count, bool) for lives, _ in kinds], None
    shift = max(0, -(-n // SPREAD) - 1).bit_length()  # spaced 2**shift: at most SPREAD of them
    last = n >> shift  # the spaced checkpoints: j * 2**shift - 1 for j in 0 .. last
    fixed = sorted({-1, peak, n - 1})
    every = last.bit_length()  # halved this often, only j = 0 (-1) is left: the fixed alone
    coarsest = [lives.coarsest(n, shift, peak, every) for lives, _ in kinds]
    halvings = every  # the fewest halvings at which every kind fits (kept: coarsest >= h)
    for h in range(every + 1):
        if all(int(np.count_nonzero(c >= h)) <= most for c, (_, most) in zip(
                coarsest, kinds, strict=True)):
            halvings = h
            break
    keep = [c >= halvings for c in coarsest]
    for k, (_, most) in zip(keep, kinds, strict=True):
        if k.sum() > most:
            k[np.flatnonzero(k)[most:]] = False
    spaced = [(j << (halvings + shift)) - 1 for j in range((last >> halvings) + 1)]
    return keep, sorted(set(fixed) | set(spaced))


def _coarsest(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], n: int, shift: int,
              peak: int, every: int) -> npt.NDArray[np.int64]:
    """For each life ``[start, end)`` of a trace of ``n`` events: the most halvings of the
    spaced checkpoints (events ``j * 2**shift - 1``, ``j`` in ``0 .. n >> shift``) after
    which one is still in it (-1: none ever is), or ``every`` where a fixed one is (-1,
    ``peak``, the last event). Halving ``h`` times keeps the ``j`` divisible by ``2**h``: the
    most is the highest power of two dividing some ``j`` of the life."""
    lo = start + (1 << shift)
    lo >>= shift  # the first j with j * 2**shift - 1 >= start
    hi = np.minimum(end >> shift, n >> shift)  # the last with j * 2**shift - 1 < end
    # the j of [lo, hi] with the most trailing zeros: at the highest bit where lo - 1 and hi
    # differ (lo = 0, j = 0, is the fixed -1)
    x = lo - 1
    x ^= hi
    np.clip(x, 0, None, out=x)  # (below 0 only where lo = 0: the fixed -1, set below)
    highest = np.full(1 << every, -1, np.int64)  # x < 2**every: the highest bit of each
    for bit in range(every):
        highest[1 << bit:2 << bit] = bit
    out = highest.take(x, mode="clip")
    out[lo > hi] = -1
    out[(start <= peak) & (end > peak)] = every
    out[(end >= n) | (start < 0)] = every
    return out


class Names:
    """The stacks and sites one view is sent, renumbered from the timeline's ids and held to
    ``budget`` characters of JSON between them: the most used first; past the budget a stack is
    ``STACK_LEFT_OUT`` and a site ``NO_SITE``."""

    def __init__(self, stack_of: Callable[[int], list[list[Any]]],
                 site_of: Callable[[int], str], budget: int) -> None:
        self._stack_of, self._site_of = stack_of, site_of
        self.left = budget
        self.stacks: list[list[list[Any]]] = []
        self.sites: list[str] = []
        self._stack_ids: dict[int, int] = {}
        self._site_ids: dict[int, int] = {}
        self._frames_ids: dict[tuple[tuple[Any, ...], ...], int] = {}

    def _fits(self, value: Any) -> bool:
        size = len(json.dumps(value)) + 2  # and its separator in the list
        if size > self.left:
            return False
        self.left -= size
        return True

    def stack_ids(self, ids: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
        """``ids`` (the timeline's stack ids) as this view's."""
        return self._renumber(ids, self._stack_ids, self._add_stack, NO_STACK, STACK_LEFT_OUT)

    def site_ids(self, ids: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
        """``ids`` (the timeline's site ids) as this view's."""
        return self._renumber(ids, self._site_ids, self._add_site, NO_SITE, NO_SITE)

    def frames_id(self, frames: list[list[Any]]) -> int:
        """The id of a stack given by its (shown) frames, added if new and it fits."""
        key = tuple(map(tuple, frames))
        sid = self._frames_ids.get(key)
        if sid is None:
            if not self._fits(frames):
                return STACK_LEFT_OUT
            sid = self._frames_ids[key] = len(self.stacks)
            self.stacks.append(frames)
        return sid

    def _add_stack(self, old: int) -> int:
        return self.frames_id(self._stack_of(old))

    def _add_site(self, old: int) -> int:
        name = self._site_of(old)
        if not self._fits(name):
            return NO_SITE
        self.sites.append(name)
        return len(self.sites) - 1

    @staticmethod
    def _renumber(ids: npt.NDArray[np.int32], table: dict[int, int],
                  add: Callable[[int], int], none: int, left_out: int
                  ) -> npt.NDArray[np.int32]:
        uniq, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        new = np.full(len(uniq), none, np.int32)
        for j in np.argsort(-counts, kind="stable").tolist():  # the most used first
            old = int(uniq[j])
            if old < 0:
                continue
            if old not in table:
                table[old] = add(old)
            new[j] = table[old] if table[old] >= 0 else left_out
        return new[inverse.reshape(-1)] if len(ids) else np.zeros(0, np.int32)
