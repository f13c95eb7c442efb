"""A device's trace as columns: one numpy array per field, stacks interned once.

A recorded trace of ten million events cannot be ten million dicts (a snapshot of 1 M dicts took
5.6 s and pickled to 64.5 MB). ``TraceColumns`` holds the events as arrays, the way the cores
record them (Note [Columns of a trace]), and the frames once per distinct stack. Every reader of
the package reads the arrays; a PyTorch trace entry (a dict) is built only when asked: an index,
an iteration, ``entries()`` for PyTorch's pickle.

It is a ``Sequence`` of trace entries, so code written for a list of dicts (``len``, ``t[i]``,
``for e in t``, ``t == [...]``) still reads it, at the dicts' cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from operator import eq, methodcaller
from typing import Any, overload

import numpy as np

from jupyter_gpumem.data.codes import (
    ACTION_CODES,
    ACTIONS,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_STACK,
    OOM,
    OTHER,
    RELEASE_REASONS,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    add_event_details,
)
from jupyter_gpumem.data.pairs import match_frees
from jupyter_gpumem.data.schema import Frame, TraceEntry

__all__ = ["FIELDS", "NO_TASK", "TraceColumns", "as_columns", "concat_traces", "pair_events",
           "plain_snapshot", "plain_trace", "without_snapshots"]

#: Task index of an event recorded outside any Dask task.
NO_TASK = -1

#: The columns and their dtypes, in this order everywhere (files, the C core's export).
FIELDS: dict[str, str] = {
    "action": "u1",  # data.codes.ACTIONS index
    "addr": "i8",  # block or segment address
    "size": "i8",  # requested bytes (alloc/free), segment bytes (segment events)
    "stream": "i8",
    "time_us": "i8",
    "stack": "i4",  # index into ``stacks``; NO_STACK: none
    "cell": "i4",  # NO_CELL: outside a cell
    "task": "i4",  # NO_TASK: outside a Dask task
    "extra": "i8",  # Note [Columns of a trace]
    "device_free": "i8",  # Note [Columns of a trace]
}

#: The keys of a trace entry that the columns hold; any other key is kept aside, by event.
_ENTRY_KEYS = frozenset({"action", "addr", "size", "stream", "time_us", "frames", "device_free",
                         "block_size", "cell", "task", "reason", "requested_size",
                         "virtual_address", "segment_type"})
_REASON_CODES = {name: code for code, name in enumerate(RELEASE_REASONS) if name}

# Note [Columns of a trace]: the two slots ``extra`` and ``device_free`` carry what only some
# actions have, as the cores' events do (Note [Recording empty_cache] in engine.history):
# - ``extra``: an alloc's or free's block bytes (``block_size``; 0: not recorded); an oom's bytes
#   asked for (``requested_size``); a segment_map's or segment_unmap's expandable base, plus 1 in
#   the small pool (``virtual_address``, ``segment_type``);
# - ``device_free``: an oom's bytes free on the device; a segment_free's or segment_unmap's
#   release reason, an index into ``RELEASE_REASONS`` (0: not recorded).
# Frames are interned: ``stack[i]`` indexes ``stacks``, a list of frame lists shared by every
# event with that stack (readers group by the index, never by the frames). Keys an entry had
# beyond these (a PyTorch trace's ``compile_context``, say) are kept in ``others``, by event.

# Note [Paired events]: an alloc and the free that gives its block back name each other, and so
# do a segment_alloc and its segment_free: ``TraceColumns.paired()[i]`` is the index of event
# i's partner, -1 for none (another action, an allocation still open at the end, a free whose
# alloc fell out of the ring). A free pairs with the last alloc (segment_alloc) of its address
# before it, when no other free of that address comes between: the events of one address in
# order, a free follows its alloc. The frees are the free_requested events, or free_completed
# in a trace with none (a ring too short to hold one) -- the matching ``data.timeline``'s lives
# make by sorting on the address. The C core works it out as it exports the ring (one pass,
# with a table of the allocations open so far: Note [Exporting ten million events] in
# ``engine/csrc/export.c``); any other trace, on first ask (``pair_events``, vectorised).


class TraceColumns(Sequence[TraceEntry]):
    """The events of one device's trace as columns (``FIELDS``), and their interned stacks."""

    __slots__ = ("_cols", "_paired", "others", "stacks")

    def __init__(self, columns: Mapping[str, Any] | None = None,
                 stacks: Sequence[list[Frame]] = (),
                 others: Mapping[int, dict[str, Any]] | None = None, *,
                 paired: Any = None) -> None:
        """``columns``: field -> array-like, all of one length (a missing field is all
        "none"); ``stacks``: the frame lists ``stack`` indexes; ``others``: event index -> the
        entry keys the columns do not hold; ``paired``: each event's partner, where the
        caller has it (Note [Paired events]; else worked out when first asked)."""
        columns = dict(columns or {})
        unknown = set(columns) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown trace columns {sorted(unknown)}; the columns are "
                             f"{', '.join(FIELDS)}")
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"trace columns of different lengths: "
                             f"{ {k: len(v) for k, v in columns.items()} }")
        n = lengths.pop() if lengths else 0
        cols: dict[str, np.ndarray] = {}
        for name, dtype in FIELDS.items():
            if name in columns:
                cols[name] = np.ascontiguousarray(columns[name], dtype=dtype)
            else:
                cols[name] = np.full(n, _NONE.get(name, 0), dtype=dtype)
        self._cols = cols
        self.stacks: list[list[Frame]] = list(stacks)
        self.others: dict[int, dict[str, Any]] = dict(others or {})
        self._paired: np.ndarray | None = None
        if paired is not None:
            self._paired = np.ascontiguousarray(paired, dtype=np.int64)
            if self._paired.shape != (n,):
                raise ValueError(f"paired: {self._paired.shape} for {n} events")

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, Any]]) -> TraceColumns:
        """Columns of trace entries (dicts: PyTorch's, or ours from an older file). Frames
        lists are interned by their content; an action this package does not know (a newer
        PyTorch's) gets the code ``OTHER`` and keeps its name in ``others``. Each field is
        pulled out of every dict in one C-level pass (``map``), not entry by entry."""
        if isinstance(entries, TraceColumns):
            return entries
        es = list(entries)
        n = len(es)

        present = set().union(*es) if es else set()  # one C-level pass over the keys

        def pull(key: str, default: Any = 0) -> list[Any]:
            if key not in present:  # most of ours and PyTorch's optional keys are rare
                return [default] * n
            return list(map(methodcaller("get", key, default), es))

        def ints(key: str, default: int = 0) -> np.ndarray:
            return np.array(pull(key, default), dtype=np.int64).reshape(n)

        names = pull("action", None)
        action = np.array(list(map(ACTION_CODES.get, names, repeat(OTHER, n))),
                          dtype=np.uint8).reshape(n)
        oom = action == OOM
        mapping = (action == SEGMENT_MAP) | (action == SEGMENT_UNMAP)
        released = (action == SEGMENT_FREE) | (action == SEGMENT_UNMAP)
        va = pull("virtual_address", None)
        has_va = np.array([v is not None for v in va], dtype=bool).reshape(n)
        base = np.array([v or 0 for v in va], dtype=np.int64).reshape(n)
        small = np.array(list(map(eq, pull("segment_type", None), repeat("small", n))),
                         dtype=bool).reshape(n)
        extra = np.where(oom, ints("requested_size"),
                         np.where(mapping, np.where(has_va, base | small, 0),
                                  ints("block_size")))
        reasons = np.array(list(map(_REASON_CODES.get, pull("reason", ""), repeat(0, n))),
                           dtype=np.int64).reshape(n)
        device_free = np.where(oom, ints("device_free"), np.where(released, reasons, 0))
        stacks: list[list[Frame]] = []
        stack_of: dict[int, int] = {}  # id of a frames list -> its index (lists are shared)
        by_content: dict[tuple[tuple[Any, ...], ...], int] = {}
        sids = []
        for frames in pull("frames", None):
            if not frames:
                sids.append(NO_STACK)
                continue
            sid = stack_of.get(id(frames))
            if sid is None:
                key = tuple(tuple(sorted(f.items())) for f in frames)
                sid = by_content.setdefault(key, len(stacks))
                if sid == len(stacks):
                    stacks.append(list(frames))
                stack_of[id(frames)] = sid
            sids.append(sid)
        others: dict[int, dict[str, Any]] = {}
        for i in np.flatnonzero(action == OTHER).tolist():
            others[i] = {"action": names[i]}
        if not _ENTRY_KEYS.issuperset(present):
            for i, e in enumerate(es):
                if not _ENTRY_KEYS.issuperset(e):
                    others.setdefault(i, {}).update(
                        (k, v) for k, v in e.items() if k not in _ENTRY_KEYS)
        cols = {"action": action, "addr": ints("addr"), "size": ints("size"),
                "stream": ints("stream"), "time_us": ints("time_us"),
                "stack": np.array(sids, dtype=np.int32).reshape(n),
                "cell": ints("cell", NO_CELL), "task": ints("task", NO_TASK),
                "extra": extra, "device_free": device_free}
        return cls(cols, stacks, others)

    # -- reading -------------------------------------------------------------------------------

    def column(self, name: str) -> np.ndarray:
        """The array of field ``name`` (read-only by convention: shared, never copied)."""
        try:
            return self._cols[name]
        except KeyError:
            raise ValueError(f"no trace column {name!r}; the columns are "
                             f"{', '.join(FIELDS)}") from None

    @property
    def columns(self) -> Mapping[str, np.ndarray]:
        """Every field's array, in ``FIELDS`` order."""
        return self._cols

    @property
    def nbytes(self) -> int:
        """Bytes the arrays take (not the frames)."""
        return sum(int(a.nbytes) for a in self._cols.values())

    def paired(self) -> np.ndarray:
        """Each event's partner, an index (-1: none): an alloc's free, a free's alloc, and so
        for segments (Note [Paired events]). Worked out once; read-only."""
        paired: np.ndarray | None = getattr(self, "_paired", None)  # None: not worked out yet
        if paired is None:
            paired = self._paired = pair_events(self._cols["action"], self._cols["addr"])
        paired.flags.writeable = False
        return paired

    def frames_of(self, index: int) -> list[Frame]:
        """The frames of event ``index`` (the shared list: do not change it)."""
        sid = int(self._cols["stack"][index])
        return self.stacks[sid] if 0 <= sid < len(self.stacks) else []

    def take(self, index: Any) -> TraceColumns:
        """The events at ``index`` (a slice, a boolean mask or an array of indices), in that
        order, sharing the stacks (and, for a slice, the arrays: no event is copied)."""
        if isinstance(index, slice):
            picked = range(len(self))[index]
            cols = {name: a[index] for name, a in self._cols.items()}
            positions = range(picked.start, picked.stop, picked.step)
        else:
            positions = np.arange(len(self), dtype=np.int64)[np.asarray(index)]
            cols = {name: a[positions] for name, a in self._cols.items()}
        others = {}
        if self.others:
            where = {int(p): j for j, p in enumerate(positions)}
            others = {where[i]: v for i, v in self.others.items() if i in where}
        return TraceColumns(cols, self.stacks, others)

    def with_columns(self, **arrays: Any) -> TraceColumns:
        """These events with the named columns replaced (same length), sharing the rest."""
        cols = dict(self._cols)
        cols.update(arrays)
        return TraceColumns(cols, self.stacks, self.others)

    def entry(self, index: int) -> TraceEntry:
        """Event ``index`` as a PyTorch trace entry (plus our keys)."""
        c = self._cols
        action = int(c["action"][index])
        out: dict[str, Any] = {
            "action": ACTIONS[action] if action < OTHER else "other",  # others: the real name
            "addr": int(c["addr"][index]),
            "size": int(c["size"][index]),
            "stream": int(c["stream"][index]),
            "time_us": int(c["time_us"][index]),
            "frames": self.frames_of(index),
        }
        extra = int(c["extra"][index])
        device_free = int(c["device_free"][index])
        add_event_details(out, action, extra, device_free)
        cell = int(c["cell"][index])
        if cell != NO_CELL:
            out["cell"] = cell
        task = int(c["task"][index])
        if task != NO_TASK:
            out["task"] = task
        if self.others:
            out.update(self.others.get(index, {}))
        return out  # type: ignore[return-value]

    def entries(self) -> list[TraceEntry]:
        """Every event as a trace entry: the dicts PyTorch's pickle and viewer want."""
        return [self.entry(i) for i in range(len(self))]

    # -- Sequence ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._cols["action"].shape[0])

    @overload
    def __getitem__(self, index: int) -> TraceEntry: ...

    @overload
    def __getitem__(self, index: slice) -> TraceColumns: ...

    def __getitem__(self, index: int | slice) -> TraceEntry | TraceColumns:
        if isinstance(index, slice):
            return self.take(index)
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"trace index {index} out of range for {n} events")
        return self.entry(i)

    def __iter__(self) -> Iterator[TraceEntry]:
        for i in range(len(self)):
            yield self.entry(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TraceColumns):
            return (len(self) == len(other) and self.entries() == other.entries())
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<TraceColumns of {len(self):,} events, {len(self.stacks):,} stacks>"


#: The "none" of each field that has one (others default to 0).
_NONE = {"stack": NO_STACK, "cell": NO_CELL, "task": NO_TASK}


def pair_events(action: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Each event's partner (-1: none), from its action and address columns (Note [Paired
    events]): the frees matched with their allocations (and segment_frees with their
    segment_allocs) as ``data.pairs.match_frees`` does, in one sort."""
    out = np.full(len(action), -1, dtype=np.int64)
    free = FREE_REQUESTED if np.any(action == FREE_REQUESTED) else FREE_COMPLETED
    for opens, closes in ((ALLOC, free), (SEGMENT_ALLOC, SEGMENT_FREE)):
        m = match_frees(addr, action == opens, action == closes)
        done = m.alloc[m.freed]
        frees = m.end[m.freed]
        out[done] = frees
        out[frees] = done
    return out


def plain_trace(trace: Sequence[TraceEntry] | TraceColumns) -> list[TraceEntry]:
    """``trace`` as a list of dicts (for PyTorch's pickle, JSON, and PyTorch's viewer)."""
    return trace.entries() if isinstance(trace, TraceColumns) else list(trace)


def plain_snapshot(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """``snapshot`` (shallow-copied) with every device trace a list of dicts."""
    snap = dict(snapshot)
    if "device_traces" in snap:
        snap["device_traces"] = [plain_trace(t) for t in snap["device_traces"]]
    return snap


def without_snapshots(trace: Sequence[TraceEntry] | TraceColumns) -> TraceColumns:
    """``trace``'s events but its "snapshot" marks, as columns."""
    cols = as_columns(trace)
    keep = cols.column("action") != SNAPSHOT
    return cols if keep.all() else cols.take(keep)


def concat_traces(traces: Sequence[Sequence[TraceEntry] | TraceColumns]) -> TraceColumns:
    """One trace of ``traces`` in order: their columns joined, their stacks merged (a frames
    list shared by two of them, or equal frames, one index: Note [One stack, two ids])."""
    parts = [as_columns(t) for t in traces]
    if len(parts) == 1:
        return parts[0]
    stacks: list[list[Frame]] = []
    by_content: dict[tuple[tuple[Any, ...], ...], int] = {}
    stack_cols, others = [], {}
    offset = 0
    for part in parts:
        remap = np.empty(len(part.stacks) + 1, dtype=np.int32)
        remap[-1] = NO_STACK
        for j, fr in enumerate(part.stacks):
            key = tuple(tuple(sorted(f.items())) for f in fr)
            remap[j] = by_content.setdefault(key, len(stacks))
            if remap[j] == len(stacks):
                stacks.append(fr)
        stack_cols.append(remap[part.column("stack")])
        others.update({offset + i: v for i, v in part.others.items()})
        offset += len(part)
    cols: dict[str, Any] = {name: np.concatenate([p.column(name) for p in parts])
                            if parts else np.zeros(0, dtype=dtype)
                            for name, dtype in FIELDS.items()}
    cols["stack"] = np.concatenate(stack_cols) if parts else cols["stack"]
    return TraceColumns(cols, stacks, others)


def as_columns(trace: Sequence[TraceEntry] | TraceColumns) -> TraceColumns:
    """``trace`` as columns: itself when it is already, else its entries read once."""
    return trace if isinstance(trace, TraceColumns) else TraceColumns.from_entries(trace)


# Note [One stack, two ids]: a core interns a stack by its (code, instruction offset) pairs, so
# two calls from one line (``a = f(x) + f(y)``) are two stacks with the same frames. Readers
# group by stack index (sites, bands, holders): one index per distinct list of frames keeps a
# line one site.
