"""Each free of a trace matched with its allocation, in the order of the allocations.

A block's life runs from its allocation to its free, the next event of the same address; a trace
of ten million events has millions of them, and every view (the timeline's bands, the lives of
the layout, the top sites) reads them. Our C core names each event's partner as it exports the
trace (``TraceColumns.paired``, Note [Paired events]): ``from_partners`` reads them.
``match_frees`` finds them for any other trace with one sort of the alloc and free events by
address (Note [Matching frees in one sort]); ``columns.pair_events`` uses it. Both give them in
the order of the allocations, so that whatever is read at an allocation (its size, stack,
cell) is a gather of increasing positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Matched", "allocated_at", "first_where", "from_partners", "match_frees"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class Matched:
    """The allocations of a trace of ``n`` events with their frees."""

    n: int  # events in the trace
    alloc: IntArray  # every allocation event, in order
    end: IntArray  # the event of each allocation's free; n: never freed in the trace
    orphan: IntArray  # frees matched with no allocation (of blocks older than the trace), in order
    at_once: BoolArray  # whether each allocation's free is the next event

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
                same_next: BoolArray | None = None) -> Matched:
    """Match every free (``is_free``) with the allocation (``is_alloc``) of the same address
    just before it: the free is matched when, among the events of its address, the one before
    it is an allocation (Note [Matching frees in one sort]). ``same_next``: ``addr[:-1] ==
    addr[1:]``, where the caller has it."""
    n = len(addr)
    if int(np.count_nonzero(is_alloc)) + int(np.count_nonzero(is_free)) < n // 4:
        some = np.flatnonzero(is_alloc | is_free)  # few (segment events): among themselves
        m = match_frees(addr.take(some), is_alloc.take(some), is_free.take(some))
        alloc, end = some.take(m.alloc), np.append(some, n).take(m.end)
        return Matched(n=n, alloc=alloc, end=end, orphan=some.take(m.orphan),
                       at_once=(end == alloc + 1) & (end < n))
    alloc = np.flatnonzero(is_alloc)
    # an allocation freed by the next event: matched at once
    at_once_ev = np.zeros(n, bool)
    if n > 1:
        np.logical_and(is_alloc[:-1], is_free[1:], out=at_once_ev[:-1])
        at_once_ev[:-1] &= addr[:-1] == addr[1:] if same_next is None else same_next
    kind_ev = is_free.view(np.int8) + 2 * at_once_ev.view(np.int8)  # _ALLOC, _FREE or _BOTH
    kept_ev = is_alloc | is_free
    kept_ev[1:] &= ~at_once_ev[:-1]  # all but the frees matched at once
    kept = np.flatnonzero(kept_ev)
    del kept_ev
    at_once = at_once_ev.take(alloc)
    end = alloc + 1
    np.copyto(end, n, where=~at_once)
    if not len(kept):
        return Matched(n=n, alloc=alloc, end=end, orphan=kept, at_once=at_once)
    kind = kind_ev.take(kept)
    del kind_ev
    g = _grouped(addr.take(kept), np.arange(len(kept)), kind, len(kept))  # by place in kept
    paired = np.flatnonzero(g.same & (g.kind[:-1] == _ALLOC) & (g.kind[1:] == _FREE))
    after = np.ones(len(g.order), bool)  # a free not right after its allocation: an orphan
    after[paired + 1] = False
    orphan = kept.take(np.sort(g.order.take(np.flatnonzero(after & (g.kind == _FREE)))))
    # the others' frees, from the sort's (address) order to the allocations' order: an
    # allocation's place among them is its place in kept less the frees kept before it
    by_alloc = g.order.take(paired)
    frees_before: IntArray = np.cumsum(kind == _FREE, dtype=np.int64)
    end[by_alloc - frees_before.take(by_alloc)] = kept.take(g.order.take(paired + 1))
    return Matched(n=n, alloc=alloc, end=end, orphan=orphan, at_once=at_once)


@dataclass(frozen=True, eq=False)
class _Grouped:
    """Events sorted by (address, order)."""

    order: IntArray  # their orders (places among the alloc and free events)
    kind: npt.NDArray[np.int8]  # their kinds: _ALLOC, _FREE or _BOTH
    same: BoolArray  # whether each after the first has the address of the one before


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
        return _Grouped(order=order.take(by), kind=kind.take(by), same=a_s[1:] == a_s[:-1])
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
    return _Grouped(order=order_s, kind=kind_s, same=key[1:] == key[:-1])


def from_partners(paired: IntArray, alloc: IntArray, is_free: BoolArray) -> Matched:
    """The ``Matched`` of a trace whose events name their partners (``paired``: -1 for none;
    ``TraceColumns.paired``), its allocations ``alloc`` (their events) and frees
    ``is_free``."""
    n = len(paired)
    end = paired.take(alloc)
    never = end < 0
    np.copyto(end, n, where=never)
    orphans = int(np.count_nonzero(is_free)) - (len(alloc) - int(np.count_nonzero(never)))
    at_once = end == alloc + 1
    if len(alloc) and alloc[-1] == n - 1:
        at_once[-1] = False  # (never freed)
    return Matched(n=n, alloc=alloc, end=end, at_once=at_once,
                   orphan=first_where(lambda k: is_free[:k] & (paired[:k] < 0), orphans, n))


def first_where(mask: Callable[[int], BoolArray], count: int, n: int) -> IntArray:
    """``np.flatnonzero(mask(n))`` where it holds ``count`` events (``mask(k)``: the mask of
    the first ``k`` events): the events found in a prefix grown until it holds them all.
    Frees of blocks older than the trace come at its start, so the prefix is short."""
    k = min(n, 4096)
    while True:
        found = np.flatnonzero(mask(k))
        if len(found) >= count or k >= n:
            return found
        k = min(n, k * 16)


def allocated_at(addr: IntArray, m: Matched, addresses: IntArray) -> BoolArray:
    """Which of ``addresses`` some allocation of the trace has. A block live at the end that the
    trace allocated is among those it never frees (a few): the others are looked for among
    every allocation only where some are not."""
    addresses = np.asarray(addresses, np.int64)
    found = np.isin(addresses, addr.take(m.alloc[~m.freed]))
    if found.all():
        return found
    rest = np.unique(addresses[~found])
    allocated = addr.take(m.alloc)
    at = np.minimum(np.searchsorted(rest, allocated), len(rest) - 1)
    hit = rest.take(np.unique(at[rest.take(at) == allocated]))
    return found | np.isin(addresses, hit)
