"""``check_seconds``: the one check of every timeout, interval and time budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jupyter_gpumem.data.units import MAX_SECONDS, check_seconds


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0, 0.0, -1, -1e-9, True, False,
                                 None, "1", b"1", [1], MAX_SECONDS * 2, 10**400, np.nan])
def test_what_is_no_timeout_is_refused_naming_the_argument(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout must be a number of seconds in \(0, 86400\]"):
        check_seconds("timeout", bad)


@pytest.mark.parametrize("good", [1e-9, 0.5, 1, 10, MAX_SECONDS, np.float32(2.5), np.int64(3)])
def test_a_timeout_comes_back_as_a_float(good: object) -> None:
    got = check_seconds("timeout", good)
    assert type(got) is float and got == float(good)  # type: ignore[arg-type]


def test_the_bounds_can_include_the_least_and_change_the_most() -> None:
    assert check_seconds("every_s", 0, least_ok=True) == 0.0
    assert check_seconds("--interval", 0.05, least=0.05, least_ok=True, most=3600) == 0.05
    with pytest.raises(ValueError, match=r"--interval must be a number of seconds in "
                                         r"\[0.05, 3600\], got 0.04"):
        check_seconds("--interval", 0.04, least=0.05, least_ok=True, most=3600)
    with pytest.raises(ValueError, match="max_ms must be a number of milliseconds"):
        check_seconds("max_ms", math.nan, unit="milliseconds")
