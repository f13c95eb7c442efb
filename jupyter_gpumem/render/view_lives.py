"""The lives of a trace's blocks and segments, and the few of them a view is sent.

After event ``k`` (-1: before the first event) the layout is exactly the segments and blocks
with ``start <= k < end``. A trace of millions of events has millions of lives; a saved view
keeps those live at some checkpoints (``bound_lives``: exact there), a kernel sends those live
in a window or at one event (``live_in``). The stacks and sites they point to travel with them,
renumbered and held to a budget of characters (``Names``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
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
    from jupyter_gpumem.data.timeline import Intervals, Timeline

__all__ = ["STACK_LEFT_OUT", "Names", "block_lives", "bound_lives", "live_in"]

Lives = dict[str, npt.NDArray[Any]]

#: The stack id of a block whose stack the view's budget left out (its frames are in the file).
STACK_LEFT_OUT = -2


def block_lives(tl: Timeline, iv: Intervals, groups: npt.NDArray[np.int32], freed: int) -> Lives:
    """The lives of the blocks of the layout: the allocations seen in the trace and the blocks
    older than it that have an address (start -1), each until its address leaves the layout.
    A life's ``band`` is its interval's group (``groups``); ``freed`` for a block older than
    the trace whose free was requested before it (no interval: its bytes count in no band).

    That is at the ``free_completed`` of its free: the intervals end at ``free_requested``,
    when the bytes stop counting as allocated. A ``free_completed`` whose request came before
    the trace is one more block older than the trace."""
    n = len(tl)
    keep = iv.seen | (iv.addr != 0)
    start = np.where(iv.seen, iv.start, -1)[keep]
    end = iv.end[keep].copy()
    cols = {"addr": iv.addr[keep], "size": iv.size[keep], "requested": iv.requested[keep],
            "stack": iv.stack[keep], "site": iv.site[keep], "cell": iv.cell[keep],
            "band": groups[keep]}
    at_request = end < n
    at_request[at_request] = tl.action[end[at_request]] == FREE_REQUESTED
    done = np.flatnonzero(tl.action == FREE_COMPLETED)
    if len(done) and at_request.any():
        end[at_request] = _completions(tl, end[at_request], cols["addr"][at_request], done)
    if np.any(tl.action == FREE_REQUESTED):  # the free_completed events that end no life
        ends = np.zeros(n + 1, bool)
        ends[end] = True
        orphans = done[~ends[done]]
    else:
        orphans = np.zeros(0, np.int64)
    k = len(orphans)
    start = np.concatenate([start, np.full(k, -1)]).astype(np.int64)
    end = np.concatenate([end, orphans]).astype(np.int64)
    extra: Lives = {"addr": tl.addr[orphans], "size": tl.block_size[orphans],
                    "requested": tl.size[orphans], "stack": np.full(k, NO_STACK),
                    "site": np.full(k, NO_SITE), "cell": np.full(k, NO_CELL),
                    "band": np.full(k, freed)}
    out = {name: np.concatenate([col, extra[name]]) for name, col in cols.items()}
    return {"start": start, "end": end, **out}


def _completions(tl: Timeline, req: npt.NDArray[np.int64], addr: npt.NDArray[np.int64],
                 done: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The first ``free_completed`` (among ``done``) of the same address after each request
    ``req`` (the request itself where there is none). Our allocator completes a free at once,
    the next event: those are found by a look one event on; only the rest are searched."""
    n = len(tl)
    out = req.copy()
    nxt = np.minimum(req + 1, n - 1)
    quick = (req + 1 < n) & (tl.action[nxt] == FREE_COMPLETED) & (tl.addr[nxt] == addr)
    out[quick] = req[quick] + 1
    rest = ~quick
    if not rest.any():
        return out
    used = np.zeros(n, bool)
    used[out[quick]] = True
    done = done[~used[done]]
    if not len(done):
        return out
    # The first free_completed of the same address after the request: one sorted key.
    req_r, addr_r = req[rest], addr[rest]
    _, inv = np.unique(np.concatenate([tl.addr[done], addr_r]), return_inverse=True)
    stride = n + 1
    done_key = inv[:len(done)].astype(np.int64) * stride + done
    order = np.argsort(done_key)
    done_key, done_sorted = done_key[order], done[order]
    req_addr = inv[len(done):].astype(np.int64)
    pos = np.searchsorted(done_key, req_addr * stride + req_r, side="right")
    hit = np.zeros(len(req_r), bool)
    found = pos < len(done_key)
    hit[found] = done_key[pos[found]] // stride == req_addr[found]
    req_r[hit] = done_sorted[pos[hit]]
    out[rest] = req_r
    return out


def live_in(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], lo: int,
            hi: int) -> npt.NDArray[np.bool_]:
    """Which lives hold after some event of ``[lo, hi)`` (``lo`` may be -1: before the
    trace)."""
    return (start < hi) & (end > lo)


def _live_at_any(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64],
                 checkpoints: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which lives hold at one of the sorted ``checkpoints`` (some c with start <= c < end)."""
    return (np.searchsorted(checkpoints, end, side="left")
            > np.searchsorted(checkpoints, start, side="left"))


def bound_lives(kinds: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]],
                n: int, peak: int) -> tuple[list[npt.NDArray[np.bool_]], list[int] | None]:
    """Which lives of each kind (``(start, end, most)``: blocks, segments) to keep, and the
    checkpoints (None: all kept, exact everywhere).

    Past a kind's ``most``: the lives live at -1, the peak, the last event and evenly spaced
    events, halving the evenly spaced ones until every kind fits. If the three fixed
    checkpoints alone hold too many, the largest-index lives are cut and no event is exact
    but the checkpoints still name where the layout is closest."""
    if all(len(start) <= most for start, _, most in kinds):
        return [np.ones(len(start), bool) for start, _, _ in kinds], None
    fixed = {-1, peak, n - 1}
    spread = min(n, 1024)
    while True:
        spaced = np.linspace(-1, n - 1, spread + 2).round().astype(np.int64).tolist()
        cps = np.array(sorted(fixed | set(spaced if spread else [])), np.int64)
        keep = [_live_at_any(start, end, cps) for start, end, _ in kinds]
        fits = all(int(k.sum()) <= most for k, (_, _, most) in zip(keep, kinds, strict=True))
        if fits or spread == 0:
            break
        spread //= 2
    for k, (_, _, most) in zip(keep, kinds, strict=True):
        if k.sum() > most:
            k[np.flatnonzero(k)[most:]] = False
    return keep, [int(c) for c in cps]


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
