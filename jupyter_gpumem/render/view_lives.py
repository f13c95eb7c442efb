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
from typing import TYPE_CHECKING, Any

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

__all__ = ["STACK_LEFT_OUT", "Names", "block_lives", "bound_lives", "live_in"]

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
                 extra: dict[str, npt.NDArray[Any]]) -> None:
        """``rows``: the interval of each life but the last ``len(extra["addr"])``, whose
        columns ``extra`` gives."""
        self._iv, self._rows, self._extra = iv, rows, extra
        self._cols: dict[str, npt.NDArray[Any]] = {"start": start, "end": end, "band": band}

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
    start = np.concatenate([iv.start[:seen], np.full(int(addressed.sum()), -1, np.int64)])
    end, orphans = _completions(tl, iv.end[rows])
    k = len(orphans)
    extra = {"addr": tl.addr[orphans], "size": tl.memo.get("block_size", tl.memo["extra"])[
                 orphans], "requested": tl.size[orphans],
             "stack": np.full(k, NO_STACK, np.int32), "site": np.full(k, NO_SITE, np.int32),
             "cell": np.full(k, NO_CELL, np.int32)}
    return BlockLives(iv, rows, np.concatenate([start, np.full(k, -1, np.int64)]),
                      np.concatenate([end, orphans]).astype(np.int64),
                      np.concatenate([groups[rows], np.full(k, freed, np.int32)]
                                     ).astype(np.int32), extra)


def _completions(tl: Timeline, end: npt.NDArray[np.int64]
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each life's end moved from a ``free_requested`` to the ``free_completed`` of the same
    address after it (the request itself where there is none), and the ``free_completed``
    events that end no life. Our allocator completes a free at once, the next event: those
    are found by a look one event on, for every request at once; only the rest are searched."""
    n = len(tl)
    action, addr = tl.action, tl.addr
    req = np.flatnonzero(action == FREE_REQUESTED)
    if not len(req):
        return end.copy(), np.zeros(0, np.int64)
    nxt = np.minimum(req + 1, n - 1)
    quick = (req + 1 < n) & (action[nxt] == FREE_COMPLETED) & (addr[nxt] == addr[req])
    kind = np.zeros(n + 1, np.int8)  # by event: 1 a request completed next, 2 another request
    kind[req] = 2 - quick.view(np.int8)
    at = kind[end]
    quick_end = at == 1
    out = end + quick_end
    slow = np.flatnonzero(at == 2)
    done = np.flatnonzero(action == FREE_COMPLETED)
    if len(slow) and len(done):
        used = np.zeros(n, bool)
        used[out[quick_end]] = True
        out[slow] = _searched(tl, end[slow], done[~used[done]])
    if not len(slow) and int(np.count_nonzero(quick_end)) == len(done):
        return out, np.zeros(0, np.int64)  # each free_completed ends a life (its own)
    ends = np.zeros(n + 1, bool)
    ends[out] = True
    return out, done[~ends[done]]


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


def bound_lives(kinds: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]],
                n: int, peak: int) -> tuple[list[npt.NDArray[np.bool_]], list[int] | None]:
    """Which lives of each kind (``(start, end, most)``: blocks, segments) to keep, and the
    checkpoints (None: all kept, exact everywhere).

    Past a kind's ``most``: the lives live at -1, the peak, the last event and ``SPREAD``
    evenly spaced events, halving the evenly spaced ones (keeping every other one) until every
    kind fits. If the three fixed checkpoints alone hold too many, the largest-index lives are
    cut and no event is exact but the checkpoints still name where the layout is closest."""
    if all(len(start) <= most for start, _, most in kinds):
        return [np.ones(len(start), bool) for start, _, _ in kinds], None
    fixed = sorted({-1, peak, n - 1})
    needs = [_spread_needed(start, end, n, fixed) for start, end, _ in kinds]
    levels = SPREAD.bit_length() - 1
    level = -1  # the finest spread at which every kind fits; -1: the fixed checkpoints alone
    for lv in range(levels, -1, -1):
        if all(int((need <= lv).sum()) <= most for need, (_, _, most) in zip(needs, kinds,
                                                                            strict=True)):
            level = lv
            break
    keep = [need <= level for need in needs]
    for k, (_, _, most) in zip(keep, kinds, strict=True):
        if k.sum() > most:
            k[np.flatnonzero(k)[most:]] = False
    spaced = [-1 + ((j * n) >> level) for j in range(2**level + 1)] if level >= 0 else []
    return keep, sorted(set(fixed) | set(spaced))


def _spread_needed(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], n: int,
                   fixed: list[int]) -> npt.NDArray[np.int64]:
    """For each life ``[start, end)``, the fewest evenly spaced checkpoints that catch it:
    ``L`` where the events ``-1 + j * n // 2**L`` (``j`` in ``0 .. 2**L``) are the first
    spacing with one in the life; -1 where a ``fixed`` checkpoint is in it; past
    ``log2(SPREAD)`` where none is. The spacings nest: one of ``2**L`` is in every finer one."""
    top = SPREAD.bit_length() - 1
    lo = -((start + 1) * -SPREAD // n)  # the first point of the finest spacing at or past start
    hi = np.minimum(((end + 1) * SPREAD - 1) // n, SPREAD)  # the last before end
    # the point of [lo, hi] divisible by the highest power of two: the highest bit where
    # lo - 1 and hi differ (lo = 0 is divisible by all)
    bits = np.frexp(((lo - 1) ^ hi).astype(np.float64))[1] - 1
    zeros = np.where(lo == 0, top, np.minimum(bits, top))
    need = np.where(lo <= hi, top - zeros, top + 1)
    for f in fixed:
        need[(start <= f) & (end > f)] = -1
    return need.astype(np.int64)


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
