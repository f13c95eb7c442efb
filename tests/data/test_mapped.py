"""Expandable segments in the replayed layout: ``data.mapped`` and ``data.replay``."""

from __future__ import annotations

import pytest
from expandable_workload import make, random_expandable

from jupyter_gpumem.data.columns import plain_snapshot
from jupyter_gpumem.data.mapped import MappedRanges, mapped_lives, pool_of_map
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.sizes import MiB
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.engine.allocator import native_core_available

CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not native_core_available(), reason="the C core is not built"))]


def test_ranges_merge_when_they_touch_and_split_when_unmapped_inside() -> None:
    r = MappedRanges()
    r.add(0, 20 * MiB, 0, False)
    merged, new = r.add(20 * MiB, 60 * MiB, 0)
    assert [(m.start, m.end) for m in merged] == [(0, 20 * MiB)]
    assert (new.start, new.end, new.small) == (0, 60 * MiB, False), "pool of what it touches"
    old, rest = r.remove(20 * MiB, 40 * MiB)
    assert (old.start, old.end) == (0, 60 * MiB)
    assert [(x.start, x.end) for x in r] == [(0, 20 * MiB), (40 * MiB, 60 * MiB)] == [
        (x.start, x.end) for x in rest]
    with pytest.raises(ValueError, match="overlaps"):
        r.add(10 * MiB, 30 * MiB, 0)
    with pytest.raises(ValueError, match="not inside"):
        r.remove(10 * MiB, 30 * MiB)
    assert pool_of_map(2 * MiB) and not pool_of_map(40 * MiB)


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_gives_the_snapshots_taken_along_the_way(native: bool, seed: int) -> None:
    snaps: list = []
    final = random_expandable(seed, native, snaps=snaps)
    actions = [e["action"] for e in final["device_traces"][0]]
    assert "segment_map" in actions and "segment_unmap" in actions
    assert any(s["is_expandable"] for s in final["segments"])
    n = len(actions)
    assert replay_segments(final, n) == final["segments"]
    assert replay_segments(final, 0) == []
    for k, snap in snaps:
        assert replay_segments(final, k) == snap["segments"], k


@pytest.mark.parametrize("native", CORES)
def test_a_trace_that_starts_late_replays_from_the_ranges_older_than_it(native: bool) -> None:
    snaps: list = []
    final = random_expandable(3, native, snaps=snaps, tail=120)
    n = len(final["device_traces"][0])
    assert n == 120 and replay_segments(final, 0), "ranges mapped before the trace"
    assert replay_segments(final, n) == final["segments"]
    dropped = final["jupyter_gpumem"]["history_dropped"]
    seen = 0
    for k, snap in snaps:  # frames older than the trace are not known: compare the rest
        if k >= dropped:
            assert _no_frames(replay_segments(final, k - dropped)) == _no_frames(
                snap["segments"]), k
            seen += 1
    assert seen >= 2


def _no_frames(segments: list) -> list:
    return [({k: v for k, v in s.items() if k not in ("frames", "blocks")},
             [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in segments]


def test_groups_are_one_per_stream_and_pool_until_released() -> None:
    a = make()
    a.record_history()
    big = a.malloc(30 * MiB)
    small = a.malloc(1000)
    other = a.malloc(30 * MiB, 1)
    a.free(big)
    a.empty_cache()  # the stream-0 large segment is released
    again = a.malloc(50 * MiB)
    snap = a.snapshot()
    lives = mapped_lives(snap["device_traces"][0], snap["segments"])
    groups = {(m.stream, m.small, m.group) for m in lives}
    assert len(groups) == 4 and len({m.group for m in lives}) == 4
    first, last = (min((m for m in lives if m.stream == 0 and not m.small),
                       key=lambda m: m.start),
                   max((m for m in lives if m.stream == 0 and not m.small),
                       key=lambda m: m.start))
    assert first.group != last.group, "a segment made again is a new row"
    assert last.frames, "the stack of the first map rests on the range at the base"
    for p in (small, other, again):
        a.free(p)


def test_reserved_follows_maps_and_unmaps() -> None:
    a = make()
    a.record_history()
    p = a.malloc(50 * MiB)  # three pages
    q = a.malloc(25 * MiB)
    a.free(p)
    a.empty_cache()  # unmaps the whole pages of the freed block
    snap = a.snapshot()
    tl = build_timeline(snap)
    trace = snap["device_traces"][0]
    reserved = 0
    for e, r in zip(trace, tl.reserved.tolist(), strict=True):
        reserved += {"segment_map": e["size"], "segment_unmap": -e["size"]}.get(e["action"], 0)
        assert r == reserved
    assert tl.reserved[-1] == a.memory_reserved() and tl.start_reserved == 0
    assert any(e["action"] == "segment_unmap" for e in trace)
    a.free(q)


def test_the_virtual_range_is_the_engines() -> None:
    from jupyter_gpumem.data.mapped import virtual_range
    from jupyter_gpumem.engine.expandable import address_space_size

    for total in (420 * MiB, 4 << 30, 141 * 1024 * MiB + 12345, 1 << 62, (1 << 63) - 1):
        for small in (False, True):
            assert virtual_range(total, small) == address_space_size(total, small)


def test_maps_and_unmaps_that_disagree_with_the_ranges_are_left_out() -> None:
    a = make()
    a.record_history()
    p = a.malloc(30 * MiB)
    snap = plain_snapshot(a.snapshot())  # the trace's dicts are edited below
    trace = snap["device_traces"][0]
    frames = trace[0]["frames"]
    n = len(trace)
    trace.insert(1, {"action": "segment_map", "addr": p, "size": 0, "stream": 0,
                     "time_us": 1, "frames": frames})  # no bytes
    trace.insert(2, {"action": "segment_unmap", "addr": p, "size": 2 * MiB, "stream": 0,
                     "time_us": 1, "frames": frames})  # mapped again at the end, never mapped
    assert replay_segments(snap, n + 2) == snap["segments"]
    assert [m.size for m in mapped_lives(trace, snap["segments"])] == [40 * MiB]
    a.free(p)
