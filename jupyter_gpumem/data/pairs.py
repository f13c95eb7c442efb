"""Each free of a trace matched with its allocation: the one sort a trace's views make.

A block's life runs from its allocation to its free, the next event of the same address; a trace
of ten million events has millions of them, and every view (the timeline's bands, the lives of
the layout, the top sites) reads them. ``match_frees`` finds them all with one sort of the
alloc and free events by address (Note [Matching frees in one sort]) and gives them in the
order of the allocations, so that whatever is read at an allocation (its size, stack, cell) is
a gather of increasing positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Matched", "match_frees"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class Matched:
    """The allocations of a trace of ``n`` events with their frees."""

    n: int  # events in the trace
    alloc: IntArray  # every allocation event, in order
    end: IntArray  # the event of each allocation's free; n: never freed in the trace
    orphan: IntArray  # frees matched with no allocation (of blocks older than the trace), in order
    known: BoolArray  # for each address asked about: whether some allocation has it

    @property
    def freed(self) -> BoolArray:
        """Which allocations are freed in the trace."""
        return self.end < self.n


# Note [Matching frees in one sort]: the alloc and free events, grouped by address and in time
# order within an address, are one increasing key each: (address - lowest) above the event's
# place above two bits of kind. One ``np.sort`` of those keys (unique, so any sort is stable)
# lines every address's events up; a free right after an allocation of its address is that
# allocation's free, any other free an orphan. This is ``np.lexsort((position, address))`` at
# a fraction of its cost (numpy's quicksort of int64 uses SIMD; an argsort does not). Where
# the addresses span too many bits for the key, their common low zero bits are shifted out,
# and failing that lexsort does it.
#
# Most blocks are freed at once: the event after an allocation (among allocs and frees) is its
# free, the same address. Those pairs are matched before the sort and go into it as one event
# of a third kind, "alloc and free", which matches with nothing: where the events of an
# address are not allocs and frees by turns (a damaged trace), it still stands between those
# before it and those after, as the pair did. A training loop's temporaries make four fifths
# of its blocks: the sort is of half as many keys. The matches come out in address order; a
# scatter puts them in the order of the allocations.

#: Kinds of event in the sort's keys (Note [Matching frees in one sort]).
_ALLOC, _FREE, _BOTH = 0, 1, 2


def match_frees(addr: IntArray, is_alloc: BoolArray, is_free: BoolArray,
                addresses: IntArray | None = None) -> Matched:
    """Match every free (``is_free``) with the allocation (``is_alloc``) of the same address
    just before it: the free is matched when, among the events of its address, the one before
    it is an allocation (Note [Matching frees in one sort]). ``addresses``: also say which of
    these addresses some allocation has (``Matched.known``)."""
    n = len(addr)
    pos = np.flatnonzero(is_alloc | is_free)
    asked = np.zeros(0 if addresses is None else len(addresses), bool)
    if not len(pos):
        return Matched(n=n, alloc=pos, end=pos.copy(), orphan=pos.copy(), known=asked)
    a = addr.take(pos)
    free = is_free.take(pos)
    # an allocation and, next, its free: matched at once (j, j + 1 among ``pos``)
    both = np.zeros(len(pos), bool)
    np.logical_and(a[1:] == a[:-1], ~free[:-1], out=both[:-1])
    both[:-1] &= free[1:]
    kept = np.flatnonzero(~np.concatenate([[False], both[:-1]]))  # all but those frees
    kind = free.take(kept).view(np.int8) + 2 * both.take(kept).view(np.int8)
    g = _grouped(a.take(kept), kept, kind, n)
    del a
    paired = np.flatnonzero(g.same & (g.kind[:-1] == _ALLOC) & (g.kind[1:] == _FREE))
    after = np.ones(len(g.order), bool)  # a free not right after its allocation: an orphan
    after[paired + 1] = False
    orphan = pos.take(np.sort(g.order.take(np.flatnonzero(after & (g.kind == _FREE)))))
    # each allocation's free, in the allocations' order: those at once, then the sort's
    allocs = np.flatnonzero(~free)  # the allocations' places among ``pos``
    end = np.where(both.take(allocs), pos.take(np.minimum(allocs + 1, len(pos) - 1)), n)
    sorted_alloc = g.order.take(paired)
    frees_before: IntArray = np.cumsum(free, dtype=np.int64)
    end[sorted_alloc - frees_before.take(sorted_alloc)] = pos.take(g.order.take(paired + 1))
    if addresses is not None and len(addresses):
        asked = g.allocates(np.asarray(addresses, np.int64))
    return Matched(n=n, alloc=pos.take(allocs), end=end, orphan=orphan, known=asked)


@dataclass(frozen=True, eq=False)
class _Grouped:
    """Events sorted by (address, order)."""

    order: IntArray  # their orders (places among the alloc and free events)
    kind: npt.NDArray[np.int8]  # their kinds: _ALLOC, _FREE or _BOTH
    same: BoolArray  # whether each after the first has the address of the one before
    codes: IntArray  # their addresses as ``code`` gives them: increasing
    code: Callable[[IntArray], IntArray | None]  # addresses as codes (None: no event has them)

    def allocates(self, addresses: IntArray) -> BoolArray:
        """Whether some allocation has each of ``addresses``."""
        out = np.zeros(len(addresses), bool)
        codes = self.code(addresses)
        if codes is None:
            return out
        lo = np.searchsorted(self.codes, codes, side="left")
        hi = np.searchsorted(self.codes, codes, side="right")
        for k in np.flatnonzero(lo < hi).tolist():  # an address: its events, any alloc?
            out[k] = bool(np.any(self.kind[lo[k]:hi[k]] != _FREE))
        return out


def _grouped(a: IntArray, order: IntArray, kind: npt.NDArray[np.int8], n: int) -> _Grouped:
    """The events of addresses ``a``, orders ``order`` (increasing, below ``n``) and kinds
    ``kind`` sorted by (address, order). Arrays as large as the events are made as few times
    as can be: on a machine short of memory bandwidth a new array costs as much as a pass."""
    lo, hi = int(a.min()), int(a.max())
    obits = max(n, 1).bit_length() + 2  # the order and the kind
    shift = 0
    if (hi - lo).bit_length() + obits > 63:  # shift out the low bits every address shares
        low_bits = int(np.bitwise_or.reduce(a ^ a[0]))
        shift = (low_bits & -low_bits).bit_length() - 1 if low_bits else 0
    if ((hi >> shift) - (lo >> shift)).bit_length() + obits > 63:
        by = np.lexsort((order, a))
        a_s = a.take(by)
        return _Grouped(order=order.take(by), kind=kind.take(by), same=a_s[1:] == a_s[:-1],
                        codes=a_s, code=lambda x: x)
    low = int(a[0]) & ((1 << shift) - 1)  # every address is a[0] modulo 2**shift
    lo >>= shift
    key = a  # (a is ours to change)
    if shift:
        key >>= shift
    key -= lo
    key <<= obits - 2
    key |= order
    key <<= 2
    key |= kind
    key.sort()
    kind_s = (key.view(np.uint8)[:: key.itemsize] & 3).view(np.int8)  # the low byte (little-
    if not np.little_endian:  # pragma: no cover                          endian) holds them
        kind_s = (key & 3).astype(np.int8)
    order_s = key >> 2
    order_s &= (1 << (obits - 2)) - 1
    key >>= obits  # the addresses' codes: (address >> shift) - lo

    def code(x: IntArray) -> IntArray | None:
        ok = (x & ((1 << shift) - 1)) == low
        return np.where(ok, (x >> shift) - lo, -1) if ok.any() else None

    return _Grouped(order=order_s, kind=kind_s, same=key[1:] == key[:-1], codes=key,
                    code=code)
