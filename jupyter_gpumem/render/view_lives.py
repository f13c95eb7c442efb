"""The few of a trace's block and segment lives a view is sent.

After event ``k`` (-1: before the first event) the layout is exactly the segments and blocks
with ``start <= k < end`` (the blocks': ``block_lives``). A trace of millions of events has
millions of lives; a saved view keeps those live at some checkpoints (``bound_lives``: exact
there), a kernel sends those live in a window or at one event (``live_in``). The stacks and
sites they point to travel with them, renumbered and held to a budget of characters
(``Names``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import NO_SITE, NO_STACK

__all__ = ["SPREAD", "STACK_LEFT_OUT", "Lifespans", "Names", "Spans", "bound_lives", "coarsest",
           "live_in"]

#: The stack id of a block whose stack the view's budget left out (its frames are in the file).
STACK_LEFT_OUT = -2
#: Evenly spaced checkpoints a bounded view keeps at most (a power of two: halving them keeps
#: every other one).
SPREAD = 1024


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
        return coarsest(self.start, self.end, n, shift, peak, every)


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


def coarsest(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], n: int, shift: int,
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
