"""Which tasks hold the memory at a point of a trace: "top sites" grouped by task or prefix.

The same ranking as the line view (``data.ranking.ranked_sites``: bytes live after the event,
ties to bytes × events over the trace), with each allocation keyed by the task label of the
event that allocated it (Note [Task labels]) instead of by its line. ``by="prefix"`` groups
keys by Dask's ``key_split`` (``random_sample``, ``matmul``), ``by="key"`` keeps each key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from dask.utils import key_split

from jupyter_gpumem.data.devices import device_trace, snapshot_device
from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.ranking import ranked_sites
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.timeline import build_timeline, peak_index

#: How an allocation made outside any task (or before the trace) reads.
NO_TASK_LABEL = "(no task)"


@dataclass(frozen=True)
class TaskUse:
    """Bytes and blocks live at one point that one task (or task prefix) allocated."""

    task: str  # a key or prefix; "a | b" when overlapping tasks share a label; NO_TASK_LABEL
    bytes: int
    count: int


def label_text(keys: list[str], by: Literal["prefix", "key"]) -> str:
    """A label's text: its keys (or their distinct prefixes), joined by " | "."""
    if by == "key":
        return " | ".join(keys)
    return " | ".join(dict.fromkeys(key_split(k) for k in keys))


def top_tasks(snapshot: Snapshot, device: int | None = None, index: int | None = None,
              top: int = 10, by: Literal["prefix", "key"] = "prefix") -> list[TaskUse]:
    """The ``top`` tasks (or prefixes) by bytes live after event ``index`` of ``device``'s trace
    (default: the peak), for a worker's or a cluster snapshot."""
    if by not in ("prefix", "key"):
        raise ValueError(f"by must be 'prefix' or 'key', got {by!r}")
    device = snapshot_device(snapshot, device)
    labels = (snapshot.get("jupyter_gpumem") or {}).get("tasks") or []
    assert isinstance(labels, list)
    texts = [label_text(list(label), by) for label in labels]
    names = [*dict.fromkeys(texts), NO_TASK_LABEL]
    group_of_label = np.array([names.index(t) for t in texts] + [len(names) - 1], np.int32)
    trace = device_trace(snapshot, device)
    tl = build_timeline(snapshot, device)
    iv = live_intervals(tl)
    if index is None:
        index = peak_index(tl)
    event_label = np.fromiter((e.get("task", -1) for e in trace), np.int64, len(trace))
    event_label[(event_label < 0) | (event_label >= len(texts))] = -1  # unknown: no task
    event_group = group_of_label[event_label]  # -1 (no task) picks the last entry
    keys = np.where(iv.seen, event_group[np.minimum(iv.start, max(len(trace) - 1, 0))]
                    if len(trace) else len(names) - 1, len(names) - 1).astype(np.int32)
    ids, nbytes, count = ranked_sites(iv, index, keys)
    return [TaskUse(names[int(g)], int(b), int(c))
            for g, b, c in zip(ids, nbytes, count, strict=True) if c][:top]
