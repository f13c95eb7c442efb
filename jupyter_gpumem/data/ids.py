"""The distinct values of an id column (stack, site, cell ids), in one linear pass.

``np.unique`` sorts: at ten million events that is most of a view's time. Ids are small
integers (an index into a table, or -1), so a count per possible value finds them, and a
lookup table gives each entry's place among them. Where the values are spread wide (an address,
say), it sorts as ``np.unique`` does. The results are ``np.unique``'s: the distinct values in
increasing order, and each entry's index among them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["codes", "distinct"]

IntArray = npt.NDArray[np.int64]


def distinct(values: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], IntArray]:
    """``np.unique(values, return_inverse=True)`` of an integer column: (distinct values, each
    entry's index into them)."""
    uniq, code, place = codes(values)
    return uniq, place.take(code)


def codes(values: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any], IntArray]:
    """The distinct values of an integer column, each entry as a small code, and each code's
    index among the distinct values (``place[code]``: ``distinct``'s index, worked out only
    where it is asked for). The code is the value less the lowest where the values are dense,
    else the index itself."""
    n = len(values)
    if n == 0:
        return values[:0], np.zeros(0, np.int64), np.zeros(0, np.int64)
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span > max(4 * n, 1 << 16):
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1).astype(np.int64), np.arange(len(uniq), dtype=np.int64)
    code = values - values.dtype.type(low) if low else values
    present = np.bincount(code, minlength=span) > 0
    return (np.flatnonzero(present) + low).astype(values.dtype), code, np.cumsum(present) - 1
