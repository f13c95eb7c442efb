"""The lives of blocks and the bytes by band, against the trace read one event at a time.

``data.pairs``, ``data.intervals`` and ``data.lod`` are vectorised for traces of ten million
events; ``random_traces`` says, event by event, what they must give, for an allocator's traces
and damaged ones, with and without free_requested, with blocks older than the trace.
"""

from __future__ import annotations

import numpy as np
import pytest
from layout_workload import random_snapshot
from random_traces import (
    ALLOC,
    CASES,
    block_bytes,
    free_action,
    random_timeline,
    reference_intervals,
    reference_pairs,
)

from jupyter_gpumem.data.codes import FREE_COMPLETED, FREE_REQUESTED, NO_STACK
from jupyter_gpumem.data.columns import as_columns, pair_events
from jupyter_gpumem.data.intervals import band_values, live_at, live_intervals, live_rows
from jupyter_gpumem.data.lod import column_extremes, extreme_points, step_extremes
from jupyter_gpumem.data.pairs import allocated_at, match_frees
from jupyter_gpumem.data.ranking import band_groups, ranked_sites, top_sites
from jupyter_gpumem.data.timeline import build_timeline, downsample, trace_columns


@pytest.mark.parametrize(("seed", "damaged", "requests"), CASES)
def test_each_free_matches_the_event_before_it_at_its_address(seed: int, damaged: bool,
                                                              requests: bool) -> None:
    entries, end_blocks, tl = random_timeline(seed, damaged, requests)
    pairs, orphans = reference_pairs(entries)
    m = tl.matched
    allocs = [i for i, e in enumerate(entries) if e["action"] == ALLOC]
    assert m.alloc.tolist() == allocs
    assert m.end.tolist() == [pairs.get(i, len(entries)) for i in allocs]
    assert m.orphan.tolist() == orphans
    asked = np.array([b["address"] for b in end_blocks] + [1 << 30, 7], np.int64)
    assert allocated_at(tl.addr, m, asked).tolist() == [
        any(e["action"] == ALLOC and e["addr"] == a for e in entries) for a in asked.tolist()]
    # the matching of a trace without its partners, and the partners it gives
    cols = as_columns(entries)
    action, addr = cols.column("action"), cols.column("addr")
    free = action == (FREE_REQUESTED if free_action(entries) == "free_requested"
                      else FREE_COMPLETED)
    again = match_frees(addr, action == 0, free)
    assert again.end.tolist() == m.end.tolist() and again.orphan.tolist() == orphans
    assert again.at_once.tolist() == m.at_once.tolist()
    partner = pair_events(action, addr)
    for a, f in pairs.items():
        assert (partner[a], partner[f]) == (f, a)
    # a block freed at once has no allocation inside its life (Note [Short lives])
    for start, end, once in zip(m.alloc.tolist(), m.end.tolist(), m.at_once.tolist(),
                                strict=True):
        if once:
            assert not any(entries[k]["action"] == ALLOC for k in range(start + 1, end))


@pytest.mark.parametrize("spread", [1, 3, 1 << 20, 1 << 62])
def test_matching_with_addresses_spread_wide(spread: int) -> None:
    """Addresses far apart (their key shifted or sorted by lexsort), few frees (matched among
    themselves), address 0, and ties of addresses."""
    rng = np.random.default_rng(spread % 1000)
    for n in (0, 1, 2, 7, 60):
        addr = rng.integers(0, 5, n).astype(np.int64) * spread
        action = rng.integers(0, 4, n)
        is_alloc, is_free = action == 0, action == 1
        entries = [{"action": {0: ALLOC, 1: "free_requested"}.get(int(a), "oom"), "addr": int(x)}
                   for a, x in zip(action, addr, strict=True)]
        pairs, orphans = reference_pairs(entries)
        m = match_frees(addr, is_alloc, is_free)
        allocs = np.flatnonzero(is_alloc).tolist()
        assert m.end.tolist() == [pairs.get(i, n) for i in allocs]
        assert m.orphan.tolist() == orphans
        assert allocated_at(addr, m, addr[:3]).tolist() == np.isin(addr[:3],
                                                                   addr[is_alloc]).tolist()


@pytest.mark.parametrize(("seed", "damaged", "requests"), CASES)
def test_intervals_are_every_allocation_and_the_older_blocks(seed: int, damaged: bool,
                                                             requests: bool) -> None:
    entries, end_blocks, tl = random_timeline(seed, damaged, requests)
    iv = live_intervals(tl)
    n = len(entries)
    seen = [(int(s), int(e), int(b), int(a)) for s, e, b, a, older in zip(
        iv.start, iv.end, iv.size, iv.addr, ~iv.seen, strict=True)
        if not (older and e == n)]  # the blocks live through the trace: from the end state
    assert sorted(seen) == reference_intervals(entries)
    assert iv.start[iv.seen].tolist() == sorted(iv.start[iv.seen].tolist())  # in their order
    through = sorted(int(a) for a, older, e in zip(iv.addr, ~iv.seen, iv.end, strict=True)
                     if older and e == n and a)
    assert through == sorted(b["address"] for b in end_blocks
                             if not any(e["action"] == ALLOC and e["addr"] == b["address"]
                                        for e in entries))
    # the columns read on first use, whole or for some intervals
    for name in ("cell", "addr", "requested"):
        rows = np.arange(0, len(iv), 3)
        assert iv.column_at(name, rows).tolist() == getattr(iv, name)[rows].tolist()


@pytest.mark.parametrize(("seed", "damaged", "requests"), CASES)
def test_a_free_has_the_stack_of_the_allocation_it_frees(seed: int, damaged: bool,
                                                         requests: bool) -> None:
    entries, _, tl = random_timeline(seed, damaged, requests)
    pairs, _ = reference_pairs(entries)
    owner = {f: a for a, f in pairs.items()}
    free = free_action(entries)
    for i, e in enumerate(entries):
        stack = int(tl.stack[i])
        if e["action"] in (ALLOC, "oom"):
            assert tl.stacks[stack] == e["frames"]
        elif e["action"] == free and i in owner:
            assert tl.stacks[stack] == entries[owner[i]]["frames"]
        else:
            assert stack == NO_STACK
        # recorded, else rounded where the bytes count (a completion's is not needed)
        recorded = e.get("block_size", 0) if e["action"] in (
            "free_requested", "free_completed") else 0
        assert int(tl.block_size[i]) == (block_bytes(e) if e["action"] in (ALLOC, free)
                                         else recorded)


@pytest.mark.parametrize(("seed", "damaged", "requests"), CASES)
def test_band_bytes_at_any_events_are_the_live_intervals_summed(seed: int, damaged: bool,
                                                                requests: bool) -> None:
    _, _, tl = random_timeline(seed, damaged, requests)
    iv = live_intervals(tl)
    n = len(tl)
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, 4, len(iv)).astype(np.int32)
    points = rng.choice(n, 25, replace=True).astype(np.int64)  # any order, repeats
    got = band_values(iv, groups, 4, n, points)
    for j, p in enumerate(points.tolist()):
        live = live_at(iv, p)
        assert np.flatnonzero(live).tolist() == live_rows(iv, p).tolist()
        for g in range(4):
            assert got[g, j] == int(iv.size[live & (groups == g)].sum())
    if not damaged:  # the bands add up to the allocated bytes
        every = np.arange(n, dtype=np.int64)
        assert np.array_equal(band_values(iv, groups, 4, n, every).sum(axis=0), tl.allocated)
    # one event a column of a level-of-detail series: the ranks by division
    width = 7
    starts = np.arange(0, n, width)
    peaks = column_extremes(tl.allocated, starts, n).argmax
    assert np.array_equal(band_values(iv, groups, 4, n, peaks, (0, width)),
                          band_values(iv, groups, 4, n, peaks))


@pytest.mark.parametrize(("seed", "width"), [(s, w) for s in range(6) for w in (1, 4, 33)])
def test_column_extremes_of_dense_and_step_series(seed: int, width: int) -> None:
    _, _, tl = random_timeline(seed, False, True, n=150)
    n = len(tl)
    first = seed * 3
    starts = np.arange(first, n - 5, width)
    stop = n - 5
    for got, y in ((column_extremes(tl.allocated, starts, stop), tl.allocated),
                   (step_extremes(tl.reserved_events, tl.reserved_levels, starts, stop),
                    tl.reserved)):
        bounds = [*starts.tolist(), stop]
        for c in range(len(starts)):
            part = y[bounds[c]:bounds[c + 1]]
            assert (got.min[c], got.max[c]) == (part.min(), part.max())
            assert got.argmin[c] == bounds[c] + int(part.argmin())
            assert got.argmax[c] == bounds[c] + int(part.argmax())


@pytest.mark.parametrize("max_points", [4, 10, 40, 1000])
def test_extreme_points_are_the_downsampled_series_together(max_points: int) -> None:
    _, _, tl = random_timeline(3, False, True, n=300)
    want = np.union1d(downsample(tl.allocated, max_points), downsample(tl.reserved, max_points))
    assert extreme_points(tl, max_points).tolist() == want.tolist()
    assert tl.reserved_max == int(tl.reserved.max())
    assert tl.reserved_after(np.arange(len(tl))).tolist() == tl.reserved.tolist()


def test_empty_and_one_event() -> None:
    tl = trace_columns([])
    iv = live_intervals(tl)
    assert len(iv) == 0 and band_values(iv, np.zeros(0, np.int32), 2, 0, []).shape == (2, 0)
    assert tl.reserved_max == 0 and len(tl.stack) == 0
    one = trace_columns([{"action": ALLOC, "addr": 4096, "size": 100, "stream": 0,
                          "time_us": 0, "frames": []}])
    iv = live_intervals(one)
    assert iv.start.tolist() == [0] and iv.end.tolist() == [1] and iv.size.tolist() == [512]
    assert band_values(iv, np.zeros(1, np.int32), 1, 1, np.array([0])).tolist() == [[512]]
    assert live_rows(iv, 0).tolist() == [0]


def test_frees_of_blocks_allocated_before_the_ring_started() -> None:
    entries = [{"action": a, "addr": x, "size": 1024, "stream": 0, "time_us": 0, "frames": []}
               for a, x in [("free_completed", 8192), ("free_requested", 4096),
                            ("free_completed", 4096), (ALLOC, 4096), ("free_requested", 4096),
                            ("free_completed", 4096)]]
    tl = trace_columns(entries)
    iv = live_intervals(tl)
    assert tl.start_allocated == 1024  # the block freed at event 1 was allocated before
    assert sorted(zip(iv.start.tolist(), iv.end.tolist(), iv.seen.tolist(), strict=True)) == [
        (0, 1, False), (3, 4, True)]
    assert tl.allocated.tolist() == [1024, 0, 0, 1024, 0, 0]


@pytest.mark.parametrize(("seed", "damaged"), [(s, d) for s in range(10) for d in (False, True)])
def test_sites_rank_by_bytes_live_then_bytes_over_the_trace(seed: int, damaged: bool) -> None:
    """The ranking, its ties settled by bytes × events, against a sort of every key; the bands
    and top sites take its order, whatever ties they leave out."""
    _, _, tl = random_timeline(seed, damaged, True)
    iv = live_intervals(tl)
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 6, len(iv)).astype(np.int32)  # many ties: few keys, any event
    for keys, index in ((iv.site, int(tl.allocated.argmax())), (cells, len(tl) // 2),
                        (cells, -1)):
        live = live_at(iv, index)
        rows = {}
        for k in np.unique(keys).tolist():
            mine = keys == k
            rows[k] = (-int(iv.size[mine & live].sum()),
                       -float((iv.size[mine] * (iv.end[mine] - iv.start[mine])).sum()), k)
        want = sorted(rows, key=rows.__getitem__)
        ids, nbytes, count = ranked_sites(iv, index, keys)
        assert ids.tolist() == want
        assert nbytes.tolist() == [-rows[k][0] for k in want]
        assert count.tolist() == [int((live & (keys == k)).sum()) for k in want]
        chosen, groups = band_groups(iv, index, 3, keys, missing=want[0])
        assert chosen == want[1:4]
        assert groups.tolist() == [chosen.index(k) if k in chosen else len(chosen)
                                   for k in keys.tolist()]
    top = top_sites(tl, iv, int(tl.allocated.argmax()), top=2)
    ids, _, count = ranked_sites(iv, int(tl.allocated.argmax()))
    assert [u.site for u in top] == [tl.site_label(int(k)) for k, c in zip(
        ids.tolist(), count.tolist(), strict=True) if c][:2]


@pytest.mark.parametrize(("seed", "tail"), [(1, None), (2, 150), (3, 40)])
def test_the_partners_our_core_names_are_the_matching(seed: int, tail: int | None) -> None:
    """A snapshot of ours names each event's partner (Note [Paired events]): the timeline reads
    them, and they are what the matching of the trace gives."""
    snap = random_snapshot(seed, 300, tail=tail)
    cols = snap["device_traces"][0]
    tl = build_timeline(snap)
    action, addr = cols.column("action"), cols.column("addr")
    free = action == (FREE_REQUESTED if np.any(action == FREE_REQUESTED) else FREE_COMPLETED)
    m = match_frees(addr, action == 0, free)
    assert tl.matched.end.tolist() == m.end.tolist()
    assert tl.matched.orphan.tolist() == m.orphan.tolist()
    assert tl.matched.at_once.tolist() == m.at_once.tolist()
    assert np.array_equal(cols.paired(), pair_events(action, addr))
