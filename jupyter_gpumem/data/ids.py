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

__all__ = ["distinct"]

IntArray = npt.NDArray[np.int64]


def distinct(values: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], IntArray]:
    """``np.unique(values, return_inverse=True)`` of an integer column: (distinct values, each
    entry's index into them)."""
    n = len(values)
    if n == 0:
        return values[:0], np.zeros(0, np.int64)
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span > max(4 * n, 1 << 16):
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1).astype(np.int64)
    shifted = values - values.dtype.type(low) if low else values
    present = np.bincount(shifted, minlength=span) > 0
    place = np.cumsum(present) - 1
    return (np.flatnonzero(present) + low).astype(values.dtype), place[shifted]
