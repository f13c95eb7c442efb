"""Readers of a trace read its columns: a ``TraceColumns`` trace and the same trace as a list of
dicts give the same timeline (array for array) and the same replayed layouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from columnar_inputs import both, snapshots

from jupyter_gpumem.data.codes import OTHER
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.timeline import build_timeline

SNAPSHOTS = snapshots()


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, where
        assert np.array_equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            if not f.compare:  # worked out from the rest (a timeline's memo)
                continue
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    else:
        assert a == b, where


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_timeline_of_columns_is_the_timeline_of_dicts(name: str) -> None:
    dicts, cols = both(SNAPSHOTS[name])
    a, b = build_timeline(dicts), build_timeline(cols)
    _same(a, b, "timeline")
    assert len(a.stacks) > 0 and len(a.sites) > 0


def test_an_unknown_action_is_other_in_the_timeline() -> None:
    _, cols = both(SNAPSHOTS["unknown_action"])
    tl = build_timeline(cols)
    trace = SNAPSHOTS["unknown_action"]["device_traces"][0]
    at = next(i for i, e in enumerate(trace) if e["action"] == "future_event")
    assert tl.action[at] == OTHER and tl.block_size[at] == 0


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_replayed_layouts_of_columns_are_those_of_dicts(name: str) -> None:
    dicts, cols = both(SNAPSHOTS[name])
    n = len(dicts["device_traces"][0])
    for index in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        assert replay_segments(cols, index) == replay_segments(dicts, index), index


def test_a_block_freed_later_gets_the_frames_of_its_alloc() -> None:
    _, cols = both(SNAPSHOTS["oom"])
    trace = cols["device_traces"][0]
    free = next(i for i, e in enumerate(trace) if e["action"] == "free_completed")
    alloc = max(i for i in range(free) if trace[i]["action"] == "alloc"
                and trace[i]["addr"] == trace[free]["addr"])
    blocks = [b for seg in replay_segments(cols, free) for b in seg["blocks"]
              if b["address"] == trace[free]["addr"]]
    assert blocks[0]["state"] == "active_allocated"
    assert blocks[0]["frames"] == trace[alloc]["frames"] != []
