"""What a kernel answers a view with: a window's timeline and lives, the layout at any event."""

from __future__ import annotations

import json

import numpy as np
import pytest
from layout_workload import blocks_at, random_snapshot, replayed, segments_at

from jupyter_gpumem.render.payload_columns import decode_column, encode, split_buffers
from jupyter_gpumem.render.view_lives import STACK_LEFT_OUT
from jupyter_gpumem.render.view_payload import build_view, trace_detail


@pytest.mark.parametrize(("seed", "tail"), [(1, None), (2, 150), (5, None)])
def test_the_layout_at_any_event_is_the_replayed_one(seed: int, tail: int | None) -> None:
    snap = random_snapshot(seed, tail=tail)
    detail = trace_detail(snap)
    for k in range(-1, detail.n):
        lives = detail.layout(k)["lives"]
        assert lives["exact"] == [k, k + 1] and lives["dropped"] == 0
        assert (blocks_at(lives, k), segments_at(lives, k)) == replayed(snap, k), k


def test_a_window_carries_the_lives_of_every_event_in_it() -> None:
    snap = random_snapshot(3, steps=600)
    detail = trace_detail(snap)
    n = detail.n
    i0, i1 = n // 3, n // 3 + 90
    answer = detail.window(i0, i1, 40)
    t = answer["timeline"]
    idx = decode_column(t["index"])
    assert t["window"] == [i0, i1] and idx[0] == i0 and len(idx) <= 40
    bounds = [*idx.tolist(), i1]
    tl = detail.timeline
    top, low = decode_column(t["allocated"]), decode_column(t["allocated_min"])
    rtop, rlow = decode_column(t["reserved"]), decode_column(t["reserved_min"])
    for c in range(len(idx)):
        part = slice(bounds[c], bounds[c + 1])
        assert (top[c], low[c]) == (tl.allocated[part].max(), tl.allocated[part].min())
        assert (rtop[c], rlow[c]) == (tl.reserved[part].max(), tl.reserved[part].min())
    lives = answer["lives"]
    assert lives["exact"] == [i0, i1]
    for k in range(i0, i1):
        assert (blocks_at(lives, k), segments_at(lives, k)) == replayed(snap, k), k


def test_a_window_with_too_many_lives_sends_the_timeline_alone() -> None:
    detail = trace_detail(random_snapshot(3, steps=600))
    answer = detail.window(0, detail.n, 100, max_lives=10)
    assert answer["lives"] is None
    assert len(decode_column(answer["timeline"]["index"])) <= 100


def test_a_layout_with_too_many_blocks_keeps_the_largest() -> None:
    detail = trace_detail(random_snapshot(3, steps=600))
    k = detail.peak
    full = detail.layout(k)["lives"]
    sizes = sorted(decode_column(full["blocks"]["size"]).tolist(), reverse=True)
    cut = detail.layout(k, max_blocks=5)["lives"]
    assert cut["dropped"] == len(sizes) - 5
    assert sorted(decode_column(cut["blocks"]["size"]).tolist(), reverse=True) == sizes[:5]


def test_bad_questions_are_refused() -> None:
    detail = trace_detail(random_snapshot(1))
    n = detail.n
    for i0, i1 in ((-1, 5), (5, 5), (0, n + 1)):
        with pytest.raises(ValueError, match="window"):
            detail.window(i0, i1, 10)
    for k in (-2, n):
        with pytest.raises(ValueError, match="event"):
            detail.layout(k)


def test_stacks_past_the_budget_are_left_out_by_name() -> None:
    detail = trace_detail(random_snapshot(1))
    names = detail.names(budget=10)
    ids = names.stack_ids(detail.lives["stack"])
    assert names.stacks == [] and set(ids.tolist()) <= {STACK_LEFT_OUT, -1}
    assert (ids == STACK_LEFT_OUT).any()


def test_an_answer_goes_as_json_and_buffers() -> None:
    detail = trace_detail(random_snapshot(1))
    answer = detail.window(0, detail.n, 50)
    content, buffers = split_buffers(answer)
    json.dumps(content)  # JSON-able: every column's bytes are a buffer
    assert buffers and content["timeline"]["index"] == {"dtype": "i4", "buffer": 0}
    assert encode(answer, "base64")["timeline"]["index"]["data"]  # and still base64-able


def test_the_saved_view_is_the_detail_at_zoom_one() -> None:
    snap = random_snapshot(4, steps=1500)
    detail = trace_detail(snap)
    payload = build_view(snap, detail=detail, binary=True, columns=200)
    whole = detail.window(0, detail.n, 200)
    for name in ("index", "allocated", "allocated_min", "reserved", "reserved_min", "peak_at"):
        assert np.array_equal(decode_column(payload["timeline"][name]),
                              decode_column(whole["timeline"][name]))
