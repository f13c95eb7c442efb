"""Which allocation sites hold the most memory at a point of a trace: one ranking for every
view (the text summaries, the bands of the plots and the widget, ``TraceResult.top_sites``).

Sites are ranked by bytes live after the event asked for (by default the peak), ties going to
the site with the most bytes × events over the whole trace, then to the lower site id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    return _ranking(iv, index, iv.site if keys is None else keys)[3]


def _ranking(iv: Intervals, index: int, keys: npt.NDArray[np.int32]
             ) -> tuple[npt.NDArray[np.int32], npt.NDArray[Any], IntArray,
                        tuple[npt.NDArray[np.int32], IntArray, IntArray]]:
    """The distinct keys, each interval's code and each code's index among the keys
    (``ids.codes``), and ``ranked_sites``'s answer (kept on ``iv`` for its sites: the payload
    and the picture both ask)."""
    memo_key = (("ranked", index) if keys is iv.site else
                ("ranked cells", index) if keys is iv.__dict__.get("cell") else None)
    found = iv.memo.get(memo_key)
    if found is not None:
        return found  # type: ignore[no-any-return]
    uniq, code, place = codes(keys)
    live = live_rows(iv, index)
    live_keys = place.take(code.take(live))
    at = np.bincount(live_keys, weights=iv.size.take(live).astype(np.float64),  # exact below
                     minlength=len(uniq))                                       # 2**53
    count = np.bincount(live_keys, minlength=len(uniq))
    # bytes × events over the whole trace only settle ties: worked out only for tied keys
    by_at = np.sort(at)
    tied = np.isin(at, by_at[1:][by_at[1:] == by_at[:-1]])
    overall: npt.NDArray[np.float64] = np.zeros(len(uniq))
    if tied.any():
        some = np.flatnonzero(tied.take(place).take(code))
        spans = iv.end.take(some) - iv.start.take(some)
        overall = np.bincount(place.take(code.take(some)), minlength=len(uniq),
                              weights=iv.size.take(some) * spans.astype(np.float64)
                              ).astype(np.float64)
    order = np.lexsort((uniq, -overall, -at))
    found = (uniq, code, place, (uniq[order].astype(np.int32), at[order].astype(np.int64),
                                 count[order].astype(np.int64)))
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
    ids, nbytes, count = ranked_sites(iv, index)
    return [SiteUse(tl.site_label(int(s)), int(b), int(c))
            for s, b, c in zip(ids, nbytes, count, strict=True) if c][:top]


def band_groups(iv: Intervals, index: int, top: int, keys: npt.NDArray[np.int32] | None = None,
                missing: int = NO_SITE) -> tuple[list[int], npt.NDArray[np.int32]]:
    """The bands of a timeline: the ``top`` sites (or values of ``keys``, such as ``iv.cell``)
    first in ``ranked_sites`` at event ``index``, leaving out ``missing``, and the band of every
    interval (``len(chosen)`` is "other")."""
    uniq, code, place, (ids, _, _) = _ranking(iv, index, iv.site if keys is None else keys)
    chosen = [int(k) for k in ids if k != missing][:top]
    band = {key: g for g, key in enumerate(chosen)}
    lookup = np.array([band.get(int(k), len(chosen)) for k in uniq], np.int32)
    return chosen, lookup.take(place).take(code)
