"""The what-if replay reads a trace's columns: a ``TraceColumns`` trace and the same trace as a
list of dicts give the same program and the same tables."""

from __future__ import annotations

import numpy as np
import pytest
from columnar_inputs import both, snapshots

import jupyter_gpumem as gm
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.whatif.program import build_program

SNAPSHOTS = snapshots()


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_program_of_columns_is_the_program_of_dicts(name: str) -> None:
    dicts, cols = both(SNAPSHOTS[name])
    a = build_program(dicts, None, AllocatorConfig(), None)
    b = build_program(cols, None, AllocatorConfig(), None)
    for field in ("ops", "addrs", "sizes", "streams"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert a.initial == b.initial
    assert (a.capacity, a.outside, a.notes, a.recorded_ooms, a.empty_cache_calls) == (
        b.capacity, b.outside, b.notes, b.recorded_ooms, b.empty_cache_calls)
    assert a.course is not None and b.course is not None
    assert np.array_equal(a.course.reserved, b.course.reserved)
    assert np.array_equal(a.course.ladder, b.course.ladder)


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_compare_of_columns_is_the_compare_of_dicts(name: str) -> None:
    dicts, cols = both(SNAPSHOTS[name])
    configs = [None, "expandable_segments:True", "roundup_power2_divisions:4"]
    a = gm.compare(dicts, configs)
    b = gm.compare(cols, configs)
    assert str(a) == str(b)
    assert len(a.rows()) == len(b.rows())
    for ra, rb in zip(a.rows(), b.rows(), strict=True):
        fa, fb = vars(ra), vars(rb)
        assert fa.keys() == fb.keys()
        for key, value in fa.items():
            if isinstance(value, np.ndarray):
                assert np.array_equal(value, fb[key]), key
            else:
                assert value == fb[key], key
    assert a.table().text() == b.table().text()


def test_the_oom_snapshot_has_what_it_covers() -> None:
    actions = {e["action"] for e in SNAPSHOTS["oom"]["device_traces"][0]}
    assert {"oom", "segment_free", "alloc", "free_completed"} <= actions
    actions = {e["action"] for e in SNAPSHOTS["expandable_unknown"]["device_traces"][0]}
    assert {"segment_map", "segment_unmap", "future_event"} <= actions
