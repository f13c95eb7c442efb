"""The level-of-detail series of a window and band bytes at any event, against the events."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from layout_workload import random_snapshot

from jupyter_gpumem.data.intervals import band_values, live_intervals
from jupyter_gpumem.data.lod import MAX_COLUMNS, BandIndex, column_starts, window_lod
from jupyter_gpumem.data.ranking import band_groups
from jupyter_gpumem.data.timeline import Timeline, build_timeline, peak_index


def random_timeline(seed: int, steps: int = 600, tail: int | None = None) -> Timeline:
    """A random workload's timeline; with ``tail``, only its last events (a trace that starts
    with blocks older than it)."""
    return build_timeline(random_snapshot(seed, steps, tail=tail))


TIMELINES = {seed: random_timeline(seed, tail=None if seed % 2 else 700) for seed in range(4)}


@settings(max_examples=150, deadline=None)
@given(seed=st.sampled_from(sorted(TIMELINES)), a=st.floats(0, 1), b=st.floats(0, 1),
       columns=st.integers(1, 400))
def test_each_column_holds_the_true_min_and_max_of_its_events(seed: int, a: float, b: float,
                                                              columns: int) -> None:
    tl = TIMELINES[seed]
    n = len(tl)
    i0, i1 = sorted((round(a * n), round(b * n)))
    lod = window_lod(tl, i0, i1, columns)
    assert len(lod) <= columns
    bounds = [*lod.start.tolist(), i1]
    assert bounds[0] == i0 if i1 > i0 else len(lod) == 0
    for c in range(len(lod)):
        lo, hi = bounds[c], bounds[c + 1]
        assert lo < hi  # no empty column, and the columns tile the window
        alloc, res = tl.allocated[lo:hi], tl.reserved[lo:hi]
        assert lod.allocated_min[c] == alloc.min() and lod.allocated_max[c] == alloc.max()
        assert lod.reserved_min[c] == res.min() and lod.reserved_max[c] == res.max()
        assert lod.peak_at[c] == lo + int(alloc.argmax())  # the first highest event
        assert lod.time_us[c] == tl.time_us[lo]
    widths = np.diff(bounds)
    assert len(set(widths[:-1].tolist())) <= 1 and (len(widths) == 0 or widths[-1] <= widths[0])


def test_a_window_of_few_events_is_exact() -> None:
    tl = TIMELINES[1]
    lod = window_lod(tl, 10, 60, 2000)
    assert lod.per_column == 1
    assert np.array_equal(lod.start, np.arange(10, 60))
    assert np.array_equal(lod.allocated_min, tl.allocated[10:60])
    assert np.array_equal(lod.allocated_max, tl.allocated[10:60])


def test_a_spike_of_one_event_survives_any_zoom() -> None:
    tl = TIMELINES[0]
    peak = peak_index(tl)
    for columns in (1, 7, 100, 1999):
        lod = window_lod(tl, 0, len(tl), columns)
        assert int(lod.allocated_max.max()) == int(tl.allocated.max())
        assert peak in lod.peak_at.tolist()


def test_bad_windows_are_refused() -> None:
    tl = TIMELINES[0]
    with pytest.raises(ValueError, match="passes the trace"):
        window_lod(tl, 0, len(tl) + 1, 10)
    with pytest.raises(ValueError, match="0 <= i0 <= i1"):
        column_starts(5, 2, 10)
    with pytest.raises(ValueError, match="columns must be"):
        column_starts(0, 10, MAX_COLUMNS + 1)


@pytest.mark.parametrize("seed", sorted(TIMELINES))
def test_band_bytes_at_any_event_are_the_bands_of_the_whole_timeline(seed: int) -> None:
    tl = TIMELINES[seed]
    iv = live_intervals(tl)
    chosen, groups = band_groups(iv, peak_index(tl), 5)
    index = BandIndex(iv, groups, len(chosen) + 1, len(tl))
    every = np.arange(len(tl), dtype=np.int64)
    expected = band_values(iv, groups, len(chosen) + 1, len(tl), every)
    assert np.array_equal(index.at(every), expected)
    assert np.array_equal(index.at(every).sum(axis=0), tl.allocated)  # the bands add up
    picks = np.array([len(tl) - 1, 0, 3, 3], np.int64)  # any order, repeats
    assert np.array_equal(index.at(picks), expected[:, picks])
