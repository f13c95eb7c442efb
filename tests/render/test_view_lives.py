"""Block lives and the bounded view's checkpoints, against the trace read one event at a time.

``view_lives`` ends each life at its free_completed for every free at once, and picks the lives
a saved view keeps from the long ones and the short ones found at the checkpoints; the
references (``random_traces``, and brute force over the checkpoints here) say what they must
be.
"""

from __future__ import annotations

import numpy as np
import pytest
from random_traces import ALLOC, CASES, random_timeline, reference_lives

from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.render.block_lives import LIFE_COLUMNS, block_lives
from jupyter_gpumem.render.view_lives import SPREAD, Spans, bound_lives, coarsest


def _lives(seed: int, damaged: bool, requests: bool, n: int = 200):
    entries, end_blocks, tl = random_timeline(seed, damaged, requests, n)
    iv = live_intervals(tl)
    groups = (np.arange(len(iv)) % 3).astype(np.int32)
    return entries, end_blocks, tl, iv, block_lives(tl, iv, groups, 3)


@pytest.mark.parametrize(("seed", "damaged", "requests"), CASES)
def test_each_life_ends_at_the_completion_of_its_free(seed: int, damaged: bool,
                                                      requests: bool) -> None:
    entries, end_blocks, _, _, lives = _lives(seed, damaged, requests)
    n = len(entries)
    want, unended = reference_lives(entries)
    older = [(-1, n, b["address"]) for b in end_blocks
             if not any(e["action"] == ALLOC and e["addr"] == b["address"] for e in entries)]
    want = sorted(want + older + [(-1, k, entries[k]["addr"]) for k in unended])
    got = sorted(zip(lives["start"].tolist(), lives["end"].tolist(),
                     lives["addr"].astype(int).tolist(), strict=True))
    assert got == want
    # a life's columns, whole or for the lives a view is sent
    picked = lives.take(np.arange(lives.count) % 2 == 0)
    for name in LIFE_COLUMNS:
        assert picked[name].tolist() == lives[name][::2].tolist(), name


def _brutecoarsest(start: int, end: int, n: int, shift: int, peak: int, every: int) -> int:
    if any(start <= f < end for f in (-1, peak, n - 1)):
        return every
    caught = [j for j in range((n >> shift) + 1) if start <= (j << shift) - 1 < end]
    if not caught:
        return -1
    return max(min((j & -j).bit_length() - 1, every) if j else every for j in caught)


@pytest.mark.parametrize(("n", "seed"), [(1, 0), (7, 1), (100, 2), (1024, 3), (5000, 4),
                                         (33_333, 5)])
def test_the_coarsest_spacing_that_catches_a_life(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    start = rng.integers(-1, n, 400)
    end = np.minimum(start + rng.integers(1, max(2, n // 3), 400), n)
    end[::7] = n
    shift = max(0, -(-n // SPREAD) - 1).bit_length()
    every = (n >> shift).bit_length()
    peak = int(rng.integers(-1, n))
    got = coarsest(start, end, n, shift, peak, every)
    assert got.tolist() == [_brutecoarsest(a, b, n, shift, peak, every)
                            for a, b in zip(start.tolist(), end.tolist(), strict=True)]


@pytest.mark.parametrize(("seed", "damaged"), [(s, d) for s in range(8) for d in (False, True)])
def test_a_bounded_view_keeps_the_lives_live_at_its_checkpoints(seed: int,
                                                                damaged: bool) -> None:
    _, _, tl, _, lives = _lives(seed, damaged, True, n=3000)
    n = len(tl)
    peak = int(tl.allocated.argmax())
    start, end = lives["start"], lives["end"]
    shift = max(0, -(-n // SPREAD) - 1).bit_length()
    every = (n >> shift).bit_length()
    # the short lives found at the checkpoints: as if worked out for every life
    assert lives.coarsest(n, shift, peak, every).tolist() == coarsest(
        start, end, n, shift, peak, every).tolist()
    segments = Spans(np.array([-1, 5]), np.array([n, n]))
    for most in (3, 40, 200, 10**6):
        (kept, seg), checkpoints = bound_lives([(lives, most), (segments, 100)], n, peak)
        if most >= lives.count:
            assert checkpoints is None and kept.all() and seg.all()
            continue
        cps = np.array(checkpoints)
        assert {-1, peak, n - 1} <= set(checkpoints)
        spaced = sorted(set(checkpoints) - {peak, n - 1})
        step = spaced[1] - spaced[0] if len(spaced) > 1 else None
        if step is not None:  # evenly spaced: every step-th event less one
            assert spaced == list(range(-1, n, step)) and step & (step - 1) == 0
        live = np.array([bool(((cps >= a) & (cps < b)).any())
                         for a, b in zip(start.tolist(), end.tolist(), strict=True)])
        if live.sum() <= most:
            assert kept.tolist() == live.tolist()
            if step is not None and step > 1 << shift:  # and one halving fewer would not fit
                finer = np.unique(np.concatenate([cps, np.arange(-1, n, step // 2)]))
                assert sum(bool(((finer >= a) & (finer < b)).any()) for a, b in zip(
                    start.tolist(), end.tolist(), strict=True)) > most
        else:  # the fixed checkpoints alone hold too many: the first ones are kept
            assert kept.tolist() == (np.cumsum(live) <= most).__and__(live).tolist()
