"""Which allocation sites hold the most memory at a point of a trace: one ranking for every
view (the text summaries, the bands of the plots and the widget, ``TraceResult.top_sites``).

Sites are ranked by bytes live after the event asked for (by default the peak), ties going to
the site with the most bytes × events over the whole trace, then to the lower site id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import NO_SITE
from jupyter_gpumem.data.ids import codes
from jupyter_gpumem.data.intervals import Intervals, live_rows
from jupyter_gpumem.data.timeline import IntArray, Timeline, peak_index


@dataclass(frozen=True)
class SiteUse:
    """Bytes and blocks live at one point that one line allocated."""

    site: str  # "file:line", "cell [N] line L", or NO_SITE_LABEL
    bytes: int  # bytes of its blocks live then
    count: int  # number of its blocks live then


def ranked_sites(iv: Intervals, index: int, keys: npt.NDArray[np.int32] | None = None
                 ) -> tuple[npt.NDArray[np.int32], IntArray, IntArray]:
    """Every site id of the intervals (or every value of ``keys``, one per interval, such as
    ``iv.cell``), ranked: most bytes live after event ``index`` first, ties to the most bytes ×
    events over the whole trace, then to the lower id. Returns the ids, and the bytes and
    allocations of each live after ``index``, in that order."""
    r = _ranking(iv, index, keys)
    order = r.order(np.ones(len(r.uniq), bool))
    return r.uniq[order].astype(np.int32), r.at[order].astype(np.int64), r.count[order]


class _Ranking:
    """What ``ranked_sites`` is worked out from: the distinct keys (``ids.codes``), the bytes
    and allocations of each live after the event, and, on demand, the bytes × events over the
    whole trace of the keys whose order it settles (only ties need it: a pass over their
    intervals)."""

    def __init__(self, iv: Intervals, index: int, keys: npt.NDArray[np.int32] | None) -> None:
        """``keys``: one a interval; None: their sites, read through their stacks (no pass
        over the intervals: a stack is a code, its site's index a lookup)."""
        self.iv = iv
        if keys is None:
            sites = iv.site_of_stack.take(iv.stack_ids)
            self.uniq = np.unique(sites)
            self.code = iv.stack  # (NO_STACK, -1, is the table's last entry)
            # (a stack no interval has, an oom's, may have a site of none: any index will do)
            self.place = np.minimum(np.searchsorted(self.uniq, iv.site_of_stack),
                                    max(len(self.uniq) - 1, 0))
        else:
            self.uniq, self.code, self.place = codes(keys)
        live = live_rows(iv, index)
        live_keys = self.place.take(self.code.take(live))
        self.at = np.bincount(live_keys, weights=iv.size.take(live).astype(np.float64),
                              minlength=len(self.uniq))  # exact below 2**53 bytes
        self.count = np.bincount(live_keys, minlength=len(self.uniq)).astype(np.int64)
        self.overall = np.full(len(self.uniq), np.nan)

    def keys_of(self, rows: npt.NDArray[np.int64] | slice) -> IntArray:
        """Each interval's index among ``uniq``."""
        return self.place.take(self.code[rows])

    def order(self, among: npt.NDArray[np.bool_]) -> IntArray:
        """The ranking of the keys ``among`` picks (indices into ``uniq``), working out the
        tie-break only for those that tie with another of them."""
        mine = np.flatnonzero(among)
        at = self.at[mine]
        by_at = np.sort(at)
        tied = mine[np.isin(at, by_at[1:][by_at[1:] == by_at[:-1]])]
        missing = tied[np.isnan(self.overall[tied])]
        if len(missing):
            wanted = np.zeros(len(self.uniq), bool)
            wanted[missing] = True
            some = np.flatnonzero(wanted.take(self.place).take(self.code))
            spans = self.iv.end.take(some) - self.iv.start.take(some)
            sums = np.bincount(self.keys_of(some), minlength=len(self.uniq),
                               weights=self.iv.size.take(some) * spans.astype(np.float64))
            self.overall[missing] = sums[missing]
        overall = np.where(np.isin(mine, tied), self.overall[mine], 0.0)
        return mine[np.lexsort((self.uniq[mine], -overall, -at))]


def _ranking(iv: Intervals, index: int, keys: npt.NDArray[np.int32] | None) -> _Ranking:
    """The ``_Ranking`` of ``keys`` (None: the sites) at ``index`` (kept on ``iv`` for its sites
    and cells: the payload and the picture both ask)."""
    memo_key = (("ranked", index) if keys is None else
                ("ranked cells", index) if keys is iv.__dict__.get("cell") else None)
    found: _Ranking | None = iv.memo.get(memo_key)
    if found is None:
        found = _Ranking(iv, index, keys)
        if memo_key:
            iv.memo[memo_key] = found
    return found


def top_sites(tl: Timeline, iv: Intervals, index: int | None = None,
              top: int = 10) -> list[SiteUse]:
    """The ``top`` allocation sites by bytes live after event ``index`` (default: the peak;
    -1: before the first event), ranked as ``ranked_sites`` does. Allocations with no known
    site are one more site, ``NO_SITE_LABEL``."""
    if index is None:
        index = peak_index(tl)
    r = _ranking(iv, index, None)
    order = r.order(r.count > 0)[:top]  # those with no block live are left out
    return [SiteUse(tl.site_label(int(s)), int(b), int(c)) for s, b, c in zip(
        r.uniq[order].tolist(), r.at[order].tolist(), r.count[order].tolist(), strict=True)]


def band_groups(iv: Intervals, index: int, top: int, keys: npt.NDArray[np.int32] | None = None,
                missing: int = NO_SITE) -> tuple[list[int], npt.NDArray[np.int32]]:
    """The bands of a timeline: the ``top`` sites (or values of ``keys``, such as ``iv.cell``)
    first in ``ranked_sites`` at event ``index``, leaving out ``missing``, and the band of every
    interval (``len(chosen)`` is "other")."""
    r = _ranking(iv, index, keys)
    order = r.order(r.uniq != missing)
    chosen = [int(k) for k in r.uniq[order][:top]]
    lookup = np.full(len(r.uniq), len(chosen), np.int32)
    lookup[order[:top]] = np.arange(len(chosen), dtype=np.int32)
    if not len(lookup):
        return chosen, np.zeros(len(iv), np.int32)
    return chosen, lookup.take(r.place).take(r.code)  # (the small table first)


def key_count(iv: Intervals, index: int, keys: npt.NDArray[np.int32] | None = None) -> int:
    """How many distinct sites (or values of ``keys``) the intervals have."""
    return len(_ranking(iv, index, keys).uniq)
