"""Allocation history: a ring buffer of events, with interned Python stacks.

Recording must cost little, since it runs inside every malloc and free. Each allocator core keeps
its own history (the C core in C, see Note [History in C] in ``csrc/core.h``; the Python core with
``PyHistory`` below), with one interface: ``history_configure``, ``history_stop``,
``history_clear``, ``history_info``, ``events``, ``stack``, ``set_cell`` and
``record_snapshot``. An event is a plain tuple; a stack is interned once as ``(code, instruction
offset)`` pairs. Strings, line numbers and ``Frame`` dicts are built only when a snapshot asks.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.codes import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_STACK,
    OOM,
    RECORDED_FRAMES,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from jupyter_gpumem.data.schema import Frame

if TYPE_CHECKING:
    from jupyter_gpumem.data.columns import TraceColumns

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Below this frame there is only IPython's machinery: the walk stops there.
_IPYTHON_RUN_CODE = ("interactiveshell.py", "run_code")

#: One stored event: (action, addr, size, block_size, stream, time_ns, stack_id, cell, device_free)
#: Note [Recording empty_cache]: two slots carry more for some actions.
Event = tuple[int, int, int, int, int, int, int, int, int]

# Note [Recording empty_cache]: a faithful replay of a trace (``whatif``) must know where the
# user called ``empty_cache()``, including calls that released nothing (they leave no event),
# and which segment_free events they caused, as opposed to the retry ladder or garbage
# collection. So, in both cores:
# - ``empty_cache()`` notes the position of the next event (events recorded since recording
#   started, dropped ones included) in a list beside the ring; a snapshot gives the positions
#   inside the kept events (0 = before the first kept event, len = after the last). Two calls
#   with no event between them are one position: the second can release nothing.
# - a segment_free event carries a ``FREED_BY_*`` code (``data.codes``) in its device_free
#   slot: who released the segment;
# - an oom event carries the bytes asked for in its block_size slot (its size is the rounded
#   request, as PyTorch records it);
# - a segment_map or segment_unmap event carries its expandable segment's base, plus 1 in the
#   small pool, in its block_size slot (bases are page-aligned): a replay rebuilds a segment
#   from its base and pool, even one released before the snapshot (Note [The virtual range]
#   in ``whatif.program``).
# ``trace_columns`` keeps the slots as the trace's ``extra`` and ``device_free`` columns, which
# ``data.codes.add_event_details`` turns into the ``reason``, ``requested_size``,
# ``virtual_address`` and ``segment_type`` keys; the allocator's snapshot puts the positions
# in ``snapshot["jupyter_gpumem"]["empty_cache"]``.

_KEEP, _SKIP, _STOP = 0, 1, 2
StackPairs = tuple[tuple[CodeType, int], ...]


def classify_code(code: CodeType) -> int:
    """What a stack walk does at a frame of ``code``: keep it, skip it (ours), or stop (IPython)."""
    filename = code.co_filename
    if filename.startswith(_PACKAGE_DIR):
        return _SKIP
    if code.co_name == _IPYTHON_RUN_CODE[1] and filename.endswith(_IPYTHON_RUN_CODE[0]):
        return _STOP
    return _KEEP


#: Code objects no stack refers to any more stay cached (classified, kept alive) until there are
#: more of them than this and than the referenced ones; then they are all let go. A loop that
#: frees its last block and allocates again keeps its code classified; 200k distinct functions
#: do not keep 200k code objects. Note [Interned stacks are reference-counted].
CODE_CACHE_SLACK = 256

# Note [Interned stacks are reference-counted]: a stack is interned while something refers to
# it: each event in the ring buffer that carries it, each live block and each live segment that
# was allocated under it. When the last of them goes (the event falls out of the ring, the block
# is freed, the history is cleared or stopped) the stack is released, and with it its references
# to code objects. A stack id is never reused, so a cache keyed by stack id (FrameTable, the
# ledger's sites) cannot see another stack under an old id. Both cores implement this: the C
# core in csrc/history.c, the Python core with StackTable below.


class _Interned:
    """A stack of the Python core: its key and how many holders it has."""

    __slots__ = ("key", "refs")

    def __init__(self, key: tuple[int, ...]) -> None:
        self.key = key
        self.refs = 0


class _Code:
    """A code object seen by a stack walk: its kind, and how many interned stacks hold it."""

    __slots__ = ("code", "kind", "refs")

    def __init__(self, code: CodeType, kind: int) -> None:
        self.code = code
        self.kind = kind
        self.refs = 0


class StackTable:
    """Interns Python stacks for the Python core: each distinct stack is stored once.

    A stack is keyed by ``(id(code), instruction offset)`` pairs, flat in one tuple of ints:
    hashing a code object rehashes its whole body, ints hash at once, and the offset is a plain
    attribute while the line number must be looked up. A code object in a stack is kept alive
    in ``_codes``, so its id cannot be reused while the stack exists. Stacks are counted by
    their holders (``retain``/``release``); see Note [Interned stacks are reference-counted].
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[int, ...], int] = {}
        self._stacks: dict[int, _Interned] = {}
        self._codes: dict[int, _Code] = {}  # id(code) -> its entry
        self._next = 0
        self._unused = 0  # kept code objects of kind _KEEP that no stack refers to

    def capture(self) -> int:
        """Intern the caller's stack, leaving out frames of jupyter_gpumem itself.

        The id carries no reference: the caller ``retain``s it at once."""
        if self._unused > CODE_CACHE_SLACK and self._unused > len(self._codes) - self._unused:
            self._purge_codes()
        codes = self._codes
        key: list[int] = []
        f = sys._getframe(1)
        depth = 0
        while f is not None and depth < RECORDED_FRAMES:
            code = f.f_code
            cid = id(code)
            entry = codes.get(cid)
            if entry is None:
                entry = codes[cid] = _Code(code, classify_code(code))
                if entry.kind == _KEEP:
                    self._unused += 1
            kind = entry.kind
            if kind == _KEEP:
                key.append(cid)
                key.append(f.f_lasti)
                depth += 1
            elif kind == _STOP:
                break
            f = f.f_back  # type: ignore[assignment]
        stack = tuple(key)
        sid = self._ids.get(stack)
        if sid is None:
            sid = self._ids[stack] = self._next
            self._next += 1
            self._stacks[sid] = _Interned(stack)
            for i in range(0, len(stack), 2):
                entry = codes[stack[i]]
                if entry.refs == 0:
                    self._unused -= 1
                entry.refs += 1
        return sid

    def retain(self, sid: int) -> None:
        """One more holder of the stack ``sid`` (an id from ``capture``)."""
        self._stacks[sid].refs += 1

    def release(self, sid: int) -> None:
        """One holder fewer; the last one releases the stack. Ids not interned are ignored."""
        entry = self._stacks.get(sid)
        if entry is None:
            return
        entry.refs -= 1
        if entry.refs <= 0:
            del self._stacks[sid]
            del self._ids[entry.key]
            codes = self._codes
            stack = entry.key
            for i in range(0, len(stack), 2):
                code = codes[stack[i]]
                code.refs -= 1
                if code.refs == 0:
                    self._unused += 1

    def _purge_codes(self) -> None:
        """Let go of every kept code object that no stack refers to."""
        self._codes = {cid: e for cid, e in self._codes.items() if e.kind != _KEEP or e.refs}
        self._unused = 0

    def release_unreferenced(self) -> None:
        """Let go now of the code objects no stack refers to (history stopped or cleared)."""
        self._purge_codes()

    def pairs(self, sid: int) -> StackPairs:
        """The stack ``sid`` as ``(code, instruction offset)`` pairs, innermost first; KeyError
        when it is not interned (any more)."""
        stack = self._stacks[sid].key
        codes = self._codes
        return tuple((codes[stack[i]].code, stack[i + 1]) for i in range(0, len(stack), 2))

    def has(self, sid: int) -> bool:
        return sid in self._stacks

    def counts(self) -> tuple[int, int]:
        """(stacks interned, code objects kept alive)."""
        return len(self._stacks), len(self._codes)

    def __len__(self) -> int:
        return len(self._stacks)


class PyHistory:
    """The Python core's history: the same interface and events as the C core's."""

    def __init__(self) -> None:
        self.on = False
        self.stacks = False
        self.max_entries = 0
        self.events: deque[Event] = deque(maxlen=0)
        self.dropped = 0
        self.table = StackTable()
        self.cell = NO_CELL
        self._clock: Callable[[], int] = time.perf_counter_ns
        self._device_free: Callable[[], int] | None = None
        #: the FREED_BY_* code of the next segment_free event, set by the core
        self.reason = 0
        #: Note [Recording empty_cache]: positions of empty_cache() calls, counted from the
        #: start of recording (dropped events included), increasing
        self.empty_cache_at: deque[int] = deque()

    def mark_empty_cache(self) -> None:
        """Note that ``empty_cache()`` is called now, before the next event."""
        if not self.on or not self.max_entries:
            return
        at = self.dropped + len(self.events)
        marks = self.empty_cache_at
        while marks and marks[0] < self.dropped:
            marks.popleft()
        if not marks or marks[-1] != at:
            marks.append(at)

    def empty_cache_positions(self) -> list[int]:
        """Where ``empty_cache()`` was called, as indexes into the kept events."""
        return [at - self.dropped for at in self.empty_cache_at if at >= self.dropped]

    def configure(self, max_entries: int, stacks: bool, clock: Callable[[], int] | None,
                  device_free: Callable[[], int] | None) -> None:
        if max_entries != self.max_entries:
            events = list(self.events)
            cut = len(events) - max_entries if max_entries else len(events)
            for event in events[:max(cut, 0)]:
                self.table.release(event[6])
            kept = events[max(cut, 0):]
            self.dropped += len(events) - len(kept)
            self.events = deque(kept, maxlen=max_entries)
        self.max_entries = max_entries
        self.stacks = stacks
        self._clock = clock or time.perf_counter_ns
        self._device_free = device_free
        self.on = True

    def clear(self) -> None:
        """Drop the events, and with them every stack only they held."""
        release = self.table.release
        for event in self.events:
            release(event[6])
        self.events.clear()
        self.dropped = 0
        self.empty_cache_at.clear()
        self.table.release_unreferenced()

    def record(self, action: int, addr: int, size: int, block_size: int, stream: int) -> int:
        """Log an event; the stack id returned carries a reference for an alloc or a
        segment_alloc (the block or segment holds it, and releases it when it goes)."""
        if not self.stacks:
            self._record(action, addr, size, block_size, stream, NO_STACK)
            return NO_STACK
        table = self.table
        stack = table.capture()
        table.retain(stack)  # ours while we log; handed to the caller below, or released
        try:
            self._record(action, addr, size, block_size, stream, stack)
        except BaseException:
            table.release(stack)
            raise
        if action != ALLOC and action != SEGMENT_ALLOC and action != SEGMENT_MAP:
            table.release(stack)
        return stack

    def _record(self, action: int, addr: int, size: int, block_size: int, stream: int,
                stack: int) -> None:
        now = self._clock()
        device_free = self._device_free() if action == OOM and self._device_free else 0
        if action in (SEGMENT_FREE, SEGMENT_UNMAP):
            device_free = self.reason  # Note [Recording empty_cache]
        self._push((action, addr, size, block_size, stream, now, stack, self.cell, device_free))
        if action == FREE_REQUESTED:  # Note [No pending frees] in _allocator
            self._push((FREE_COMPLETED, addr, size, block_size, stream, now, stack, self.cell, 0))

    def _push(self, event: Event) -> None:
        events = self.events
        if len(events) == self.max_entries:
            self.dropped += 1
            if not self.max_entries:
                return
            self.table.release(events[0][6])  # append() drops it
        if event[6] != NO_STACK:
            self.table.retain(event[6])
        events.append(event)

    def info(self) -> tuple[bool, bool, int, int, int, int]:
        return (self.on, self.stacks, self.max_entries, self.dropped, len(self.events),
                len(self.table))


def _line_of(code: CodeType, offset: int) -> int:
    """The source line of the instruction at byte ``offset`` of ``code``."""
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if start <= offset < end:
            return lineno if lineno is not None else line
        if lineno is not None and start <= offset:
            line = lineno
    return line


class FrameTable:
    """Stack ids of one core as PyTorch's frame dicts, lines looked up once per frame.

    Every event and block with the same stack shares one list of frames: a snapshot of a long
    trace then costs one list per distinct stack, and readers can group by identity. Treat the
    lists as read-only (copy one before changing it). Stack ids are never reused (Note
    [Interned stacks are reference-counted]), so a cached list never goes stale; ``trim`` lets
    go of the cache when it has grown well past what the core still interns.
    """

    def __init__(self, stack: Callable[[int], StackPairs]) -> None:
        self._stack = stack
        # (id(code), offset) -> (code, frame): the code is held so that its id stays its own
        self._frames: dict[tuple[int, int], tuple[CodeType, Frame]] = {}
        self._lists: dict[int, list[Frame]] = {}

    def frames(self, sid: int, pairs: StackPairs | None = None) -> list[Frame]:
        """The stack ``sid`` as frame dicts, innermost first ([] for no stack, or for a stack
        the core no longer interns). ``pairs``, when given, are the stack's pairs as the core
        read them with the rest of a snapshot."""
        if sid == NO_STACK:
            return []
        out = self._lists.get(sid)
        if out is not None:
            return out
        if pairs is None:
            try:
                pairs = self._stack(sid)
            except (IndexError, KeyError):  # released since the caller read the id
                return []
        cache = self._frames
        out = []
        for code, offset in pairs:
            key = (id(code), offset)
            hit = cache.get(key)
            if hit is None:
                frame: Frame = {
                    "filename": code.co_filename,
                    "line": _line_of(code, offset),
                    "name": code.co_name,
                }
                cache[key] = (code, frame)
            else:
                frame = hit[1]
            out.append(frame)
        self._lists[sid] = out
        return out

    def trim(self, interned: int) -> None:
        """Forget every cached list when there are many more than the ``interned`` stacks the
        core holds now (call it between snapshots, never while one is being built)."""
        if len(self._lists) > 2 * interned + 1024:
            self.clear()

    def clear(self) -> None:
        self._frames.clear()
        self._lists.clear()


#: An event export (both cores' snapshots give one): the columns of ``data.columns.FIELDS``, in
#: that order and dtype, each a buffer (bytes, or the C core's writable ``Column``); then each
#: event's partner (Note [Paired events] in ``data.columns``: an int64 buffer, or None where the
#: core leaves it to be worked out when asked); then the stack id of each value of the ``stack``
#: column (-1: a value no event uses). Note [Exporting ten million events] in ``csrc/export.c``.
ExportedEvents = tuple[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any, Any, list[int]]
_EXPORTED = (("action", "B"), ("addr", "q"), ("size", "q"), ("stream", "q"), ("time_us", "q"),
             ("stack", "i"), ("cell", "i"), ("task", "i"), ("extra", "q"),
             ("device_free", "q"))


def event_bytes(event: tuple[int, ...]) -> int:
    """Bytes the Python core's event takes: the tuple and its ints (small ones are shared)."""
    return sys.getsizeof(event) + sum(sys.getsizeof(v) for v in event if not -5 <= v <= 256)


def event_columns(events: list[Event]) -> ExportedEvents:
    """Events as the C core exports them (the Python core's snapshot gives this too)."""
    from array import array

    from jupyter_gpumem.data.columns import NO_TASK

    sids = sorted({e[6] for e in events} - {NO_STACK})
    local = {sid: i for i, sid in enumerate(sids)}
    local[NO_STACK] = -1
    rows = {"action": [e[0] for e in events], "addr": [e[1] for e in events],
            "size": [e[2] for e in events], "stream": [e[4] for e in events],
            "time_us": [e[5] // 1000 for e in events], "stack": [local[e[6]] for e in events],
            "cell": [e[7] for e in events], "task": [NO_TASK] * len(events),
            "extra": [e[3] for e in events], "device_free": [e[8] for e in events]}
    cols = tuple(array(code, rows[name]).tobytes() for name, code in _EXPORTED)
    return (*cols, None, sids)  # type: ignore[return-value]


def trace_columns(events: ExportedEvents, frames: Callable[[int], list[Frame]]
                  ) -> TraceColumns:
    """Exported events as a trace: ``TraceColumns`` read straight from the core's buffers (no
    copy), with our ``extra`` and ``device_free`` slots (Note [Recording empty_cache]). Stack
    ids with equal frames share one index (Note [One stack, two ids] in ``data.columns``): the
    stack column is renumbered so, in place where the core's buffer allows it."""
    import numpy as np

    from jupyter_gpumem.data.columns import FIELDS, TraceColumns

    cols = {name: np.frombuffer(buf, dtype=FIELDS[name])
            for (name, _), buf in zip(_EXPORTED, events[:-2], strict=True)}
    paired = None if events[-2] is None else np.frombuffer(events[-2], dtype=np.int64)
    sids: list[int] = events[-1]
    remap = np.full(len(sids) + 1, NO_STACK, dtype=np.int32)  # the last entry: NO_STACK's
    stacks: list[list[Frame]] = []
    by_content: dict[tuple[tuple[object, ...], ...], int] = {}
    same = True  # whether every value used keeps its number
    for value, sid in enumerate(sids):
        if sid < 0:  # no event names it
            continue
        fr = frames(sid)
        key = tuple((f["filename"], f["line"], f["name"]) for f in fr)
        index = by_content.setdefault(key, len(stacks))
        if index == len(stacks):
            stacks.append(fr)
        remap[value] = index
        same = same and index == value
    if not same:
        cols["stack"] = _renumbered(cols["stack"], remap)
    for column in (*cols.values(), *([] if paired is None else [paired])):
        column.flags.writeable = False  # shared by every reader
    return TraceColumns(cols, stacks, paired=paired)


def _renumbered(column: Any, remap: Any) -> Any:
    """``remap[column]`` (-1 stays -1): in place when the column is writable and the C core
    is built (no copy of ten million values), else a new array."""
    if column.flags.writeable:
        try:
            from jupyter_gpumem.engine import _native
        except ImportError:
            pass
        else:
            _native.renumber(column, remap[:-1])
            return column
    return remap[column]


class HistoryView:
    """What is being recorded, as the notebook side reads it (a read-only view of the core)."""

    def __init__(self, core: object, table: FrameTable) -> None:
        self._core = core
        #: ``table.frames(stack_id)`` gives frame dicts.
        self.table = table
        _on, stacks, max_entries, dropped, count, interned = core.history_info()  # type: ignore[attr-defined]
        self.stacks = bool(stacks)
        self.max_entries = int(max_entries)
        self.dropped = int(dropped)
        #: Events recorded since recording started, dropped ones included.
        self.recorded = int(dropped) + int(count)
        #: Events kept now, and the stacks interned (each once, however many events share it).
        self.kept = int(count)
        self.stacks_interned = int(interned)
        one, total = core.history_bytes()  # type: ignore[attr-defined]
        #: Bytes of one event in the core's ring, and of the ring now (its side lists too).
        self.event_bytes, self.ring_bytes = int(one), int(total)

    @property
    def events(self) -> list[Event]:
        """The events kept now, oldest first (built on each access)."""
        events: list[Event] = self._core.events()  # type: ignore[attr-defined]
        return events
