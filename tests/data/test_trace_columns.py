"""``TraceColumns``: a trace as columns reads back as the entries it was made of."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_gpumem.data.columns import FIELDS, NO_TASK, TraceColumns, as_columns

FRAMES = [{"filename": "train.py", "line": 12, "name": "step"}]
ENTRIES = [
    {"action": "segment_alloc", "addr": 4096, "size": 2 << 20, "stream": 0, "time_us": 1,
     "frames": FRAMES},
    {"action": "alloc", "addr": 4096, "size": 1000, "stream": 0, "time_us": 2, "frames": FRAMES,
     "block_size": 1024, "cell": 3},
    {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 7, "time_us": 3, "frames": [],
     "device_free": 512, "requested_size": 1 << 29, "task": 2},
    {"action": "segment_map", "addr": 8192, "size": 2 << 20, "stream": 0, "time_us": 4,
     "frames": [], "virtual_address": 1 << 40, "segment_type": "small"},
    {"action": "segment_free", "addr": 4096, "size": 2 << 20, "stream": 0, "time_us": 5,
     "frames": [dict(FRAMES[0])], "reason": "empty_cache", "compile_context": "N/A"},
]


def test_entries_read_back_as_they_were_with_stacks_interned_by_content() -> None:
    cols = TraceColumns.from_entries(ENTRIES)
    assert len(cols) == 5 and list(cols.columns) == list(FIELDS)
    assert cols.entries() == ENTRIES and cols == ENTRIES and list(cols) == ENTRIES
    assert cols[-1] == ENTRIES[-1] and cols[1]["block_size"] == 1024
    assert len(cols.stacks) == 1  # the same frames, in two lists, are one stack
    assert cols.column("stack").tolist() == [0, 0, -1, -1, 0]
    assert cols.column("task").tolist() == [NO_TASK, NO_TASK, 2, NO_TASK, NO_TASK]
    assert cols.others == {4: {"compile_context": "N/A"}}


def test_take_keeps_order_stacks_and_the_keys_put_aside() -> None:
    cols = TraceColumns.from_entries(ENTRIES)
    picked = cols.take(cols.column("action") != cols.column("action")[0])
    assert picked.entries() == ENTRIES[1:]
    assert cols[3:].entries() == ENTRIES[3:] and cols[::2].entries() == ENTRIES[::2]
    assert picked.frames_of(0) is cols.frames_of(1)  # shared, not copied


def test_as_columns_reads_a_list_once_and_leaves_columns_alone() -> None:
    cols = as_columns(ENTRIES)
    assert as_columns(cols) is cols
    assert as_columns([]) == [] and len(as_columns([])) == 0


def test_bad_columns_and_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown trace columns"):
        TraceColumns({"action": [0], "colour": [1]})
    with pytest.raises(ValueError, match="different lengths"):
        TraceColumns({"action": [0, 0], "addr": [1]})
    with pytest.raises(ValueError, match="no trace column"):
        TraceColumns().column("colour")
    with pytest.raises(IndexError):
        TraceColumns.from_entries(ENTRIES)[5]


def test_missing_columns_read_as_none() -> None:
    cols = TraceColumns({"action": np.zeros(2, dtype=np.uint8), "addr": [1, 2]})
    assert cols[0] == {"action": "alloc", "addr": 1, "size": 0, "stream": 0, "time_us": 0,
                       "frames": []}


def test_an_unknown_action_is_kept_by_name_and_plain_traces_are_lists() -> None:
    from jupyter_gpumem.data.codes import OTHER
    from jupyter_gpumem.data.columns import plain_snapshot

    newer = [*ENTRIES, {"action": "teleport", "addr": 5, "size": 0, "stream": 0, "time_us": 9,
                        "frames": []}]
    cols = TraceColumns.from_entries(newer)
    assert cols.column("action")[-1] == OTHER
    assert cols[-1]["action"] == "teleport" and cols.entries() == newer
    snap = plain_snapshot({"segments": [], "device_traces": [cols]})
    assert type(snap["device_traces"][0]) is list and snap["device_traces"][0] == newer
