from __future__ import annotations

import json

import numpy as np
import pytest
from layout_workload import random_snapshot
from render_workload import MiB, recorded_snapshot

from jupyter_gpumem.data.codes import OOM
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.render.view_payload import (
    VIEW_SCHEMA,
    build_view,
    decode_column,
    encode,
    live_view,
)


def _layout(payload: dict, k: int) -> tuple[set, set]:
    b, s = payload["lives"]["blocks"], payload["lives"]["segments"]
    col = decode_column
    live = (col(b["start"]) <= k) & (k < col(b["end"]))
    blocks = set(zip(col(b["addr"])[live].astype(int).tolist(),
                     col(b["size"])[live].astype(int).tolist(), strict=True))
    live = (col(s["start"]) <= k) & (k < col(s["end"]))
    segs = set(zip(col(s["addr"])[live].astype(int).tolist(),
                   col(s["size"])[live].astype(int).tolist(), strict=True))
    return blocks, segs


def _replayed(snap: Snapshot, k: int) -> tuple[set, set]:
    segs = replay_segments(snap, k + 1)
    return ({(b["address"], b["size"]) for s in segs for b in s["blocks"]
             if b["state"] != "inactive"}, {(s["address"], s["total_size"]) for s in segs})


def test_payload_decodes_to_the_timeline_in_both_transports() -> None:
    snap = recorded_snapshot()
    tl = build_timeline(snap)
    text = build_view(snap, title="t")
    raw = build_view(snap, title="t", binary=True)
    assert json.loads(json.dumps(text)) == text  # JSON-able as it is
    assert encode(raw, "base64") == text and encode(text, "bytes") == raw
    assert text["schema"] == VIEW_SCHEMA == 2 and text["kind"] == "trace"
    assert text["n_events"] == len(tl) and text["device_name"] == "Simulated GPU"
    t = raw["timeline"]
    idx = decode_column(t["index"])
    assert idx[0] == 0 and idx[-1] == len(tl) - 1
    assert np.array_equal(decode_column(t["allocated"]), tl.allocated[idx])
    assert np.array_equal(decode_column(t["reserved"]), tl.reserved[idx])
    assert np.array_equal(decode_column(t["time_us"]), tl.time_us[idx])
    bands = np.array([decode_column(c) for c in t["bands"]])
    assert len(t["band_labels"]) == len(bands) == len(t["band_sites"]) + 1
    assert t["band_labels"][-1] == "other"
    assert np.array_equal(bands.sum(axis=0), tl.allocated[idx])  # the bands add up
    assert text["peak"]["index"] == int(tl.allocated.argmax())
    assert text["peak"]["allocated"] == int(tl.allocated.max())
    assert text["n_ooms"] == 1 and tl.action[text["ooms"][0]] == OOM
    assert [c for _, c in text["cells"]] == [1, 2, 3]


@pytest.mark.parametrize("tail", [None, 150])
@pytest.mark.parametrize("seed", [1, 2])
def test_lives_give_the_replayed_layout_at_every_event(seed: int, tail: int | None) -> None:
    snap = random_snapshot(seed, tail=tail)
    payload = build_view(snap, binary=True)
    n = payload["n_events"]
    assert payload["lives"]["checkpoints"] is None and payload["lives"]["dropped"] == 0
    if tail is not None:  # some blocks are older than the trace
        assert (decode_column(payload["lives"]["blocks"]["start"]) == -1).any()
    for k in range(-1, n):
        assert _layout(payload, k) == _replayed(snap, k), k


def test_lives_past_the_bound_are_exact_at_the_checkpoints() -> None:
    snap = random_snapshot(3, steps=600)
    full = build_view(snap, binary=True)
    n_lives = len(decode_column(full["lives"]["blocks"]["start"]))
    bound = n_lives // 3
    payload = build_view(snap, binary=True, max_lives=bound)
    lives = payload["lives"]
    kept = len(decode_column(lives["blocks"]["start"]))
    assert kept <= bound and lives["dropped"] == n_lives - kept > 0
    n, peak = payload["n_events"], payload["peak"]["index"]
    cps = lives["checkpoints"]
    assert {-1, peak, n - 1} <= set(cps) and len(cps) > 3 and cps == sorted(set(cps))
    for k in cps:
        assert _layout(payload, k) == _replayed(snap, k), k
    # away from the checkpoints some block is missing: the bound did cut something
    assert any(_layout(payload, k) != _replayed(snap, k) for k in range(n) if k not in cps)


def test_timeline_and_samples_stay_within_their_bounds() -> None:
    snap = random_snapshot(4, steps=1500)
    tl = build_timeline(snap)
    payload = build_view(snap, binary=True, columns=100)
    t = payload["timeline"]
    idx = decode_column(t["index"])
    assert len(tl) > 100 >= len(idx) and t["window"] == [0, len(tl)]
    assert t["per_column"] == idx[1] - idx[0] > 1
    top, low = decode_column(t["allocated"]), decode_column(t["allocated_min"])
    bounds = [*idx.tolist(), len(tl)]
    for c in range(len(idx)):  # each column: the highest and lowest of its events
        assert top[c] == tl.allocated[bounds[c]:bounds[c + 1]].max()
        assert low[c] == tl.allocated[bounds[c]:bounds[c + 1]].min()
    assert tl.allocated.max() in top  # the peak kept
    peak_at = decode_column(t["peak_at"])
    bands = np.array([decode_column(c) for c in t["bands"]])
    assert np.array_equal(bands.sum(axis=0), tl.allocated[peak_at])  # bands at peak_at
    rng = np.random.default_rng(0)
    rows = [(i * 0.1, int(v), int(v) + 5, None) for i, v in enumerate(rng.integers(0, 1e9, 5000))]
    live = live_view(rows, title="x", max_points=100, binary=True)
    data = decode_column(live["samples"]["data"]).reshape(-1, 4)
    assert live["kind"] == "live" and live["n_events"] == 0
    assert live["samples"]["n"] == len(data) <= 100
    assert data[:, 1].max() == max(r[1] for r in rows)
    assert np.isnan(data[:, 3]).all() and data[0, 0] == 0.0


def test_surviving_blocks_point_at_their_stacks() -> None:
    snap = recorded_snapshot()
    seg = snap["segments"][0]
    block = next(b for b in seg["blocks"] if b["state"] == "active_allocated")

    class B:
        address, size, requested = block["address"], block["size"], block["requested_size"]
        site, holders, frames = "x.py:1", ("x",), block["frames"]

    payload = build_view(snap, surviving=[B()])
    (s,) = payload["surviving"]
    assert s["holders"] == ["x"] and s["address"] == block["address"]
    assert payload["stacks"][s["stack"]][0][:2] == [block["frames"][0]["filename"],
                                                   block["frames"][0]["line"]]


def test_bad_bounds_raise() -> None:
    with pytest.raises(ValueError, match="max_points"):
        build_view(recorded_snapshot(), max_points=0)
    with pytest.raises(ValueError, match="columns"):
        build_view(recorded_snapshot(), columns=1)


@pytest.mark.parametrize("tail", [None, 120])
def test_lives_of_expandable_segments_give_the_replayed_layout(tail: int | None) -> None:
    from expandable_workload import random_expandable

    snap = random_expandable(4, tail=tail)
    payload = build_view(snap, binary=True)
    segs = payload["lives"]["segments"]
    expandable = decode_column(segs["expandable"]).astype(bool)
    group = decode_column(segs["group"])
    assert expandable.any() and (group[expandable] >= 0).all() and (group[~expandable] == -1).all()
    for k in range(-1, payload["n_events"]):
        assert _layout(payload, k) == _replayed(snap, k), k


def test_a_snapshot_alone_groups_expandable_segments_by_stream_and_pool() -> None:
    from expandable_workload import make

    a = make()
    x = a.malloc(20 * MiB)
    p = a.malloc(40 * MiB)
    q = a.malloc(20 * MiB)
    r = a.malloc(30 * MiB, 1)
    a.free(p)
    a.empty_cache()  # a hole: stream 0 has two mapped ranges
    snap = a.snapshot()
    assert sum(s["stream"] == 0 for s in snap["segments"]) == 2
    segs = build_view(snap, kind="snapshot", binary=True)["lives"]["segments"]
    group = decode_column(segs["group"]).tolist()
    stream = decode_column(segs["stream"]).tolist()
    assert len(group) == 3 and len(set(group)) == 2
    assert {g for g, s in zip(group, stream, strict=True) if s == 0} != {
        g for g, s in zip(group, stream, strict=True) if s == 1}
    for ptr in (x, q, r):
        a.free(ptr)


def test_expandable_segment_lives_carry_the_range_they_reserve() -> None:
    from expandable_workload import make

    from jupyter_gpumem.data.mapped import virtual_range

    a = make()  # 4 GiB
    p = a.malloc(30 * MiB)
    q = a.malloc(1000)
    segs = build_view(a.snapshot(), kind="snapshot", binary=True)["lives"]["segments"]
    small = decode_column(segs["small"]).astype(bool)
    ranges = decode_column(segs["range"])
    assert ranges[~small].tolist() == [virtual_range(4 << 30, small=False)]
    assert ranges[small].tolist() == [virtual_range(4 << 30, small=True)]
    snap = a.snapshot()
    del snap["jupyter_gpumem"]["device_total"]  # not known (a PyTorch snapshot): 0
    segs = build_view(snap, kind="snapshot", binary=True)["lives"]["segments"]
    assert decode_column(segs["range"]).tolist() == [0.0, 0.0]
    a.free(p)
    a.free(q)


def test_a_payload_built_on_threads_is_the_one_built_in_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_gpumem.data import together

    snaps = [random_snapshot(3, steps=600, tail=300), recorded_snapshot()]  # (an oom, cells)
    alone = [build_view(snap, binary=True) for snap in snaps]
    monkeypatch.setattr(together, "MIN_EVENTS", 0)  # every trace's passes on threads
    assert [build_view(snap, binary=True) for snap in snaps] == alone
