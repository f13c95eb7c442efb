"""Which Dask task an allocation belongs to: task labels carried in the events' cell slot.

Note [Task labels]: a worker runs no notebook cells, so while a task runs the plugin puts a
*task label* in the slot each allocator core already tags onto every history event (the cell
number, ``CachingAllocator.current_cell``), and takes it out when the task ends. A label is an
index into this process's table of labels, offset by ``TASK_BASE`` so that it never looks like a
cell a notebook could run (cell numbers are execution counts, far below it) and still passes the
schema's cell bounds. Gathering (``worker.py``) turns the slot back into a ``task`` index on each
trace entry and a ``tasks`` list in ``snapshot["jupyter_gpumem"]``; the raw slot never leaves
the worker.

Why the cell slot and not a column of its own, or a Python-side map of event ranges: the slot is
already in both cores' ring buffer, costs one integer store per task start and end, survives
events falling out of the ring, and needs no change to either core. An event-range map would
have to read the ring's position at every transition and be trimmed with the ring.

What is exact. The label is the set of tasks the worker process runs at the moment of the
event (from ``executing`` until it leaves ``executing``/``long-running``; the transition hooks run
on the worker's event loop before the task is handed to its thread and after it returns, so the
window covers the task's whole run):

- one thread per worker (``threads_per_worker=1``, dask-cuda's default): at most one task runs,
  and every allocation a task's thread makes carries exactly that task's key;
- several threads: tasks that overlap share one label naming all of them; the allocation is one
  of theirs, but which one is not known (the core keeps no thread per event). When they share
  a prefix (chunks of one array, the common case) the prefix is still exact;
- an allocation made meanwhile by another thread of the process (the event loop deserializing
  a CuPy chunk fetched from a peer, a user's thread) carries the running task's label too;
- workers of one process (``LocalCluster(processes=False)``) share one allocator per device, so
  their tasks overlap as threads do.

The table grows by one entry per distinct label while some allocator records history (labels
are made only then) and is cleared when a cluster trace starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.codes import NO_CELL

if TYPE_CHECKING:
    from jupyter_gpumem.data.columns import TraceColumns
    from jupyter_gpumem.data.schema import TraceEntry


#: Cell values from here up are task labels (label index = cell - TASK_BASE). Below the
#: schema's cell bound (2**31) and far above any notebook's execution count.
TASK_BASE = 1 << 30

#: Task states in which a task's code runs (a seceded task is "long-running").
RUNNING = frozenset({"executing", "long-running"})


def key_text(key: object) -> str:
    """A Dask key as text: a string stays itself, a tuple key reads as Python writes it."""
    return key if isinstance(key, str) else repr(key)


class TaskLabels:
    """The tasks running in this process, and the label each allocator's events get.

    ``allocators`` gives the allocators to label now (the current backend's, by device). Every
    method is called on a worker's event loop; a lock guards the table anyway, since several
    in-process workers have several loops.
    """

    def __init__(self, allocators: Callable[[], Iterable[Any]]) -> None:
        self._allocators = allocators
        self._lock = threading.Lock()
        self._running: dict[str, None] = {}  # keys in start order
        self._saved: dict[int, tuple[Any, int]] = {}  # id(allocator) -> (allocator, its cell)
        self.labels: list[tuple[str, ...]] = []
        self._index: dict[tuple[str, ...], int] = {}

    def transition(self, key: object, start: str, finish: str) -> None:
        """Follow one task transition: a task enters or leaves the running set."""
        was, now = start in RUNNING, finish in RUNNING
        if was == now:
            return
        text = key_text(key)
        with self._lock:
            if now:
                self._running[text] = None
            else:
                self._running.pop(text, None)
            self._apply()

    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def clear(self) -> None:
        """Forget every label (a new trace starts); tasks running now are labelled afresh."""
        with self._lock:
            self.labels.clear()
            self._index.clear()
            self._apply()

    def _apply(self) -> None:
        allocators = list(self._allocators())
        if not self._running:
            for allocator, cell in self._saved.values():
                allocator.current_cell = cell
            self._saved.clear()
            return
        recording = [a for a in allocators if a.recording]
        if not recording:
            return
        label = tuple(sorted(self._running))
        index = self._index.get(label)
        if index is None:
            index = self._index[label] = len(self.labels)
            self.labels.append(label)
        for allocator in recording:
            if id(allocator) not in self._saved:
                cell = allocator.current_cell
                self._saved[id(allocator)] = (allocator, NO_CELL if is_task_cell(cell) else cell)
            allocator.current_cell = TASK_BASE + index

    def label_of(self, cell: int) -> tuple[str, ...] | None:
        """The tasks of a cell value, None when it is no task label of this table."""
        index = cell - TASK_BASE
        with self._lock:
            return self.labels[index] if 0 <= index < len(self.labels) else None


def is_task_cell(cell: int) -> bool:
    return cell >= TASK_BASE


def relabel_trace(trace: Sequence[TraceEntry], label_of: Callable[[int], tuple[str, ...] | None],
                  labels: list[list[str]], index: dict[tuple[str, ...], int]) -> TraceColumns:
    """``trace`` with the task labels in its cell column turned into ``task`` indexes into
    ``labels`` (appending to it and to ``index``, label -> position). A cell that is no task
    label stays a cell; a task label this table no longer knows becomes no cell and no task."""
    import numpy as np

    from jupyter_gpumem.data.columns import NO_TASK, as_columns

    cols = as_columns(trace)
    cell = cols.column("cell")
    is_task = cell >= TASK_BASE
    if not is_task.any():
        return cols
    values, inverse = np.unique(cell[is_task], return_inverse=True)
    at = np.full(len(values), NO_TASK, dtype=np.int32)
    for j, value in enumerate(values.tolist()):
        label = label_of(value)
        if label is not None:
            if label not in index:
                index[label] = len(labels)
                labels.append(list(label))
            at[j] = index[label]
    task = cols.column("task").copy()
    task[is_task] = at[inverse]
    return cols.with_columns(cell=np.where(is_task, NO_CELL, cell), task=task)
