"""``check_snapshot`` on a trace held as columns: the check by each column's least and greatest
value settles most traces; whatever it cannot settle is looked at event by event, so a trace
is refused at its first bad event, and only then."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from trace_cases import random_trace

from jupyter_gpumem.data.codes import OOM
from jupyter_gpumem.data.columns import TraceColumns
from jupyter_gpumem.data.schema import LimitExceeded, LoadLimits, SchemaError, check_snapshot
from jupyter_gpumem.data.sizes import ADDRESS_LIMIT, MAX_ALLOC_SIZE

N = 200_000  # several blocks of the frames' count
SMALL = 5_000


def _checked(trace: TraceColumns, limits: LoadLimits | None = None) -> dict[str, Any]:
    return dict(check_snapshot({"segments": [], "device_traces": [trace]},
                               limits or LoadLimits(max_events=N)))


def _with(trace: TraceColumns, **changes: tuple[int, int]) -> TraceColumns:
    """The trace with ``column=(event, value)`` changed."""
    cols = {k: v.copy() for k, v in trace.columns.items()}
    for name, (j, value) in changes.items():
        cols[name][j] = value
    return TraceColumns(cols, trace.stacks, trace.others)


def test_frames_are_counted_exactly() -> None:
    trace = random_trace(3, N)
    lengths = [len(f) for f in trace.stacks]
    frames = sum(lengths[s] for s in trace.column("stack").tolist() if s >= 0)
    with pytest.raises(LimitExceeded, match="max_frames"):
        _checked(trace, LoadLimits(max_events=N, max_frames=frames - 1))
    _checked(trace, LoadLimits(max_events=N, max_frames=frames))


@pytest.mark.parametrize(("column", "value"), [
    ("addr", -1), ("size", -1), ("size", MAX_ALLOC_SIZE + 1), ("addr", ADDRESS_LIMIT - 100),
    ("cell", -2), ("task", -2), ("extra", -1), ("extra", MAX_ALLOC_SIZE + 1),
    ("device_free", -1), ("stack", -2), ("stack", 3),
])
def test_the_first_bad_event_is_named(column: str, value: int) -> None:
    trace = _with(random_trace(4, SMALL), action=(0, 0), size=(0, 512))
    j = int(np.random.default_rng(len(column) + value % 97).integers(1, SMALL))
    bad = _with(trace, **{column: (j, value)}, action=(j, 0))
    with pytest.raises(SchemaError, match=f"^device_traces\\[0\\]\\[{j}\\]"):
        _checked(bad)
    # and the same event of a list of dicts is refused by the same name (a dict has no stack
    # index, and a device_free only where the action has one)
    if column not in ("stack", "device_free"):
        with pytest.raises(SchemaError, match=f"^device_traces\\[0\\]\\[{j}\\]"):
            check_snapshot({"segments": [], "device_traces": [bad.entries()]},
                           LoadLimits(max_events=N))


def test_what_the_bounds_cannot_settle_is_checked_event_by_event() -> None:
    trace = random_trace(5, N)
    # an oom may ask for more than the largest block: not counted among the bytes
    oom = _with(trace, action=(9, OOM), size=(9, MAX_ALLOC_SIZE + 5), extra=(9, 1 << 62))
    _checked(oom)
    # a high address and a large size, of different events
    high = _with(trace, addr=(7, ADDRESS_LIMIT - 4096), size=(7, 512),
                 action=(7, 0), extra=(7, 512))
    high = _with(high, size=(8, 1 << 40), action=(8, 0))
    _checked(high)
    # the sizes of the events add up past 2**62
    many = TraceColumns({"action": np.zeros(8), "size": np.full(8, MAX_ALLOC_SIZE // 4),
                         "addr": np.zeros(8)})
    with pytest.raises(SchemaError, match="add up to more than 2\\*\\*62"):
        _checked(many)
