"""``distinct`` gives what ``np.unique`` gives, dense ids or spread ones."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_gpumem.data.ids import distinct


@pytest.mark.parametrize(("low", "high", "n", "dtype"), [
    (-1, 5, 1000, np.int32), (0, 1, 1, np.int64), (-1, 40_000, 300, np.int32),
    (0, 1 << 40, 500, np.int64), (7, 8, 0, np.int32)])
def test_distinct_is_unique(low: int, high: int, n: int, dtype: type) -> None:
    values = np.random.default_rng(n).integers(low, high, n).astype(dtype)
    got = distinct(values)
    want = np.unique(values, return_inverse=True)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w.reshape(-1))
    assert got[0].dtype == values.dtype
