"""The distinct values of an id column (stack, site, cell ids), in one linear pass.

``np.unique`` sorts: at ten million events that is most of a view's time. Ids are small
integers (an index into a table, or -1), so a count per possible value finds them, and a
lookup table gives each entry's place among them. Where the values are spread wide (an address,
say), it sorts as ``np.unique`` does. The results are ``np.unique``'s: the distinct values in
increasing order, each entry's index among them, the first entry of each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["distinct"]

IntArray = npt.NDArray[np.int64]


def distinct(values: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], IntArray, IntArray]:
    """``np.unique(values, return_index=True, return_inverse=True)`` of an integer column:
    (distinct values, the first index of each, each entry's index into them)."""
    n = len(values)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return values[:0], empty, empty
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span > max(4 * n, 1 << 16):
        uniq, first, inverse = np.unique(values, return_index=True, return_inverse=True)
        return uniq, first.astype(np.int64), inverse.reshape(-1).astype(np.int64)
    shifted = values.astype(np.int64) - low
    present = np.flatnonzero(np.bincount(shifted, minlength=span))
    place = np.full(span, -1, np.int64)
    place[present] = np.arange(len(present), dtype=np.int64)
    first = np.full(span, n, np.int64)
    np.minimum.at(first, shifted, np.arange(n, dtype=np.int64))
    return (present + low).astype(values.dtype), first[present], place[shifted]
