"""The lives of a trace's blocks: each allocation until its address leaves the layout.

A block's bytes stop counting at its ``free_requested`` (its interval, ``data.intervals``), but
it stays in the layout until the ``free_completed`` of that request; a ``free_completed`` whose
request came before the trace is one more block older than the trace. ``BlockLives`` gives
the lives' columns (``LIFE_COLUMNS``) whole, or for the few lives a view is sent: a trace of
millions of lives sends thousands, so nothing is worked out for all of them until asked.

Our allocator completes a free at once, the next event: where every request of the trace is
completed so, each life ends one event after its interval, and nothing is searched for (Note
[Short lives] holds for the lives of short intervals then). Otherwise each request's completion
is searched for (``_completions``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import FREE_COMPLETED, FREE_REQUESTED, NO_CELL, NO_SITE, NO_STACK
from jupyter_gpumem.data.pairs import first_where
from jupyter_gpumem.render.view_lives import coarsest

if TYPE_CHECKING:
    from jupyter_gpumem.data.intervals import Intervals
    from jupyter_gpumem.data.timeline import Timeline

__all__ = ["LIFE_COLUMNS", "BlockLives", "block_lives"]

#: The columns of a block life, in the order a view is sent them.
LIFE_COLUMNS = ("start", "end", "addr", "size", "requested", "stack", "site", "cell", "band")
IntArray = npt.NDArray[np.int64]


class BlockLives(Mapping[str, npt.NDArray[Any]]):
    """Every block life (``block_lives``), a column (``LIFE_COLUMNS``) a key: the lives of the
    intervals ``rows``, then those of the ``free_completed`` events ``older`` (blocks whose
    free was requested before the trace). A column is worked out whole when asked for as a
    key, or for some lives only (``take``, ``coarsest``)."""

    def __init__(self, tl: Timeline, iv: Intervals, rows: IntArray | slice,
                 groups: npt.NDArray[np.int32], freed: int, older: IntArray,
                 ends: IntArray | None) -> None:
        """``groups``: the band of each interval, ``freed`` of the older lives; ``ends``: each
        life's end where some were searched for, else None (each ends one event after its
        interval if that ends at a request: every request is completed by the next event)."""
        self._tl, self._iv, self._groups, self._freed = tl, iv, groups, freed
        self._every = isinstance(rows, slice)  # the lives of every interval, in their order
        self._rows = np.zeros(0, np.int64) if isinstance(rows, slice) else rows
        self._mine = len(iv) if isinstance(rows, slice) else len(rows)  # lives of intervals
        self._older, self._ends = older, ends
        self._seen = len(iv) - len(iv.older)  # the first lives are the seen intervals'
        self._band_table: npt.NDArray[np.int32] | None = None
        self._cols: dict[str, npt.NDArray[Any]] = {}

    @property
    def count(self) -> int:
        """How many lives there are."""
        return self._mine + len(self._older)

    @property
    def older_completions(self) -> int:
        """Lives of blocks whose free was requested before the trace (the last ones)."""
        return len(self._older)

    def renumber_bands(self, table: npt.NDArray[np.int32]) -> None:
        """Band ``b`` becomes ``table[b]``."""
        self._band_table = table if self._band_table is None else table[self._band_table]
        self._cols.pop("band", None)

    def column(self, name: str, lives: IntArray) -> npt.NDArray[Any]:
        """Column ``name`` of the ``lives`` (indices, increasing)."""
        mine = lives[lives < self._mine]
        theirs = lives[len(mine):] - self._mine
        rows = self._intervals(mine)
        tl, iv = self._tl, self._iv
        if name == "start":
            out: npt.NDArray[Any] = np.where(mine < self._seen, iv.start.take(rows), -1)
            return np.concatenate([out, np.full(len(theirs), -1, np.int64)])
        if name == "end":
            if self._ends is not None:
                return self._ends.take(lives)
            end = iv.end.take(rows)
            end += end < len(tl)  # each request completed by the next event
            return np.concatenate([end, self._older.take(theirs)])
        if name == "band":
            band = np.concatenate([self._groups.take(rows),
                                   np.full(len(theirs), self._freed, np.int32)])
            return band if self._band_table is None else self._band_table.take(band)
        older = self._older.take(theirs)
        extra = {"addr": tl.addr.take(older), "requested": tl.size.take(older),
                 "size": tl.memo.get("block_size", tl.memo["extra"]).take(older),
                 "stack": np.full(len(older), NO_STACK, np.int32),
                 "site": np.full(len(older), NO_SITE, np.int32),
                 "cell": np.full(len(older), NO_CELL, np.int32)}
        return np.concatenate([iv.column_at(name, rows), extra[name]])

    def _intervals(self, lives: IntArray) -> IntArray:
        """The intervals of ``lives`` (lives of intervals)."""
        return lives if self._every else self._rows.take(lives)

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        if name not in LIFE_COLUMNS:
            raise KeyError(name)
        found = self._cols.get(name)
        if found is None:
            found = self._cols[name] = self.column(name, np.arange(self.count))
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(LIFE_COLUMNS)

    def __len__(self) -> int:
        return len(LIFE_COLUMNS)

    def take(self, mask: npt.NDArray[np.bool_]) -> dict[str, npt.NDArray[Any]]:
        """The columns of the lives ``mask`` picks."""
        lives = np.flatnonzero(mask)
        return {name: self.column(name, lives) for name in LIFE_COLUMNS}

    def _short(self, lives: IntArray) -> npt.NDArray[np.bool_]:
        """Which of the ``lives`` are of short intervals and end one event after at most
        (Note [Short lives] holds for them)."""
        mine = lives < self._mine
        rows = self._intervals(lives[mine])
        short = np.zeros(len(lives), bool)
        short[mine] = self._iv.short.take(rows)
        if self._ends is not None:
            short[mine] &= self.column("end", lives[mine]) - self._iv.end.take(rows) <= 1
        return short

    def coarsest(self, n: int, shift: int, peak: int, every: int) -> npt.NDArray[np.int8]:
        """``view_lives.coarsest`` of every life: worked out for the long ones, and for the
        short ones found live at a checkpoint (one a checkpoint at most, Note [Short lives])."""
        out = np.full(self.count, -1, np.int8)
        if self._every and self._ends is None:  # the long intervals' lives, and the older
            longs = np.concatenate([self._iv.long, np.arange(self._mine, self.count)])
        else:
            everyone = np.arange(self.count)
            longs = everyone[~self._short(everyone)]
        out[longs] = coarsest(self.column("start", longs), self.column("end", longs), n, shift,
                              peak, every)
        events = np.unique(np.concatenate([np.arange(1 << shift, n + 1, 1 << shift) - 1,
                                           [peak, n - 1]]))
        events = events[events >= 0]
        if not self._seen or not len(events):
            return out
        starts = self._iv.start[:self._seen]  # (the first lives' starts, increasing)
        last = np.searchsorted(starts, events, side="right") - 1  # the last allocation
        events, last = events[last >= 0], last[last >= 0]
        lives, at = np.unique(last, return_inverse=True)
        live = (self._short(lives).take(at)
                & (self.column("end", lives).take(at) > events))  # the short one live then
        lives = np.unique(last[live])
        out[lives] = coarsest(self.column("start", lives), self.column("end", lives), n, shift,
                              peak, every)
        return out


def block_lives(tl: Timeline, iv: Intervals, groups: npt.NDArray[np.int32],
                freed: int) -> BlockLives:
    """The lives of the blocks of the layout: the allocations seen in the trace and the blocks
    older than it that have an address (start -1), each until its address leaves the layout.
    A life's ``band`` is its interval's group (``groups``); ``freed`` for a block older than
    the trace whose free was requested before it (no interval: its bytes count in no band)."""
    n = len(tl)
    seen = len(iv) - len(iv.older)
    addressed = iv.older != 0
    every_request = bool(addressed.all())  # every request ends a life (an interval's)
    rows: IntArray | slice = slice(None) if every_request else np.concatenate(
        [np.arange(seen), seen + np.flatnonzero(addressed)])
    action = tl.action
    request = tl.memo.get("requested")  # (the timeline's, where it has requests)
    if request is None:
        request = action == FREE_REQUESTED
    requests = int(np.count_nonzero(request))
    if not requests:
        return BlockLives(tl, iv, rows, groups, freed, np.zeros(0, np.int64),
                          iv.end[rows].copy())
    completed = action == FREE_COMPLETED
    at_once = np.zeros(n + 1, bool)  # by event: a request completed by the next event
    np.logical_and(request[:-1], completed[1:], out=at_once[:n - 1])
    at_once[:n - 1] &= tl.memo["same_next"] if "same_next" in tl.memo else (
        tl.addr[:-1] == tl.addr[1:])
    if every_request and int(np.count_nonzero(at_once)) == requests:
        done = int(np.count_nonzero(completed))

        def unended(k: int) -> npt.NDArray[np.bool_]:  # not right after a request: theirs
            out: npt.NDArray[np.bool_] = completed[:k].copy()  # came before the trace
            out[1:] &= ~at_once[:k - 1]
            return out

        older = first_where(unended, done - requests, n)
        return BlockLives(tl, iv, rows, groups, freed, older, None)
    ends, older = _completions(tl, iv.end[rows], at_once, request, completed)
    return BlockLives(tl, iv, rows, groups, freed, older, ends)


def _completions(tl: Timeline, end: IntArray, at_once: npt.NDArray[np.bool_],
                 request: npt.NDArray[np.bool_], completed: npt.NDArray[np.bool_]
                 ) -> tuple[IntArray, IntArray]:
    """Each life's end (``end``) moved from a ``free_requested`` to the ``free_completed`` of
    the same address after it: the next event where it completes the request at once
    (``at_once``, by event), else the first later one that completes no request at once (the
    request itself where there is none); then the ``free_completed`` events that end no life
    (the ends of as many more lives); and those events."""
    n = len(tl)
    quick = at_once.take(end)
    out = end + quick
    slow = np.flatnonzero(np.append(request, False).take(end) & ~quick)
    finished = np.flatnonzero(completed)
    if len(slow) and len(finished):
        used = np.zeros(n, bool)
        used[out[quick]] = True
        out[slow] = _searched(tl, end[slow], finished[~used[finished]])
    ends = np.zeros(n + 1, bool)
    ends[out] = True
    older = finished[~ends[finished]]
    return np.concatenate([out, older]), older


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
