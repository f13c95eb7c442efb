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

from jupyter_gpumem.data.codes import (
    ACTIONS,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_STACK,
    OOM,
)
from jupyter_gpumem.data.codes import RECORDED_FRAMES as MAX_FRAMES
from jupyter_gpumem.data.schema import Frame, TraceEntry

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Below this frame there is only IPython's machinery: the walk stops there.
_IPYTHON_RUN_CODE = ("interactiveshell.py", "run_code")

#: One stored event: (action, addr, size, block_size, stream, time_ns, stack_id, cell, device_free)
Event = tuple[int, int, int, int, int, int, int, int, int]

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


class StackTable:
    """Interns Python stacks for the Python core: each distinct stack is stored once.

    A stack is keyed by ``(id(code), instruction offset)`` pairs, flat in one tuple of ints:
    hashing a code object rehashes its whole body, ints hash at once, and the offset is a plain
    attribute while the line number must be looked up. Every code object seen is kept alive in
    ``_codes``, so its id cannot be reused.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[int, ...], int] = {}
        self._stacks: list[tuple[int, ...]] = []
        self._codes: dict[int, tuple[int, CodeType]] = {}  # id(code) -> (kind, code)

    def capture(self) -> int:
        """Intern the caller's stack, leaving out frames of jupyter_gpumem itself."""
        codes = self._codes
        key: list[int] = []
        f = sys._getframe(1)
        depth = 0
        while f is not None and depth < MAX_FRAMES:
            code = f.f_code
            cid = id(code)
            entry = codes.get(cid)
            if entry is None:
                entry = codes[cid] = (classify_code(code), code)
            kind = entry[0]
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
            sid = self._ids[stack] = len(self._stacks)
            self._stacks.append(stack)
        return sid

    def pairs(self, sid: int) -> StackPairs:
        """The stack ``sid`` as ``(code, instruction offset)`` pairs, innermost first."""
        stack = self._stacks[sid]
        codes = self._codes
        return tuple((codes[stack[i]][1], stack[i + 1]) for i in range(0, len(stack), 2))

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

    def configure(self, max_entries: int, stacks: bool, clock: Callable[[], int] | None,
                  device_free: Callable[[], int] | None) -> None:
        if max_entries != self.max_entries:
            kept = list(self.events)[-max_entries:] if max_entries else []
            self.dropped += len(self.events) - len(kept)
            self.events = deque(kept, maxlen=max_entries)
        self.max_entries = max_entries
        self.stacks = stacks
        self._clock = clock or time.perf_counter_ns
        self._device_free = device_free
        self.on = True

    def clear(self) -> None:
        self.events.clear()
        self.dropped = 0

    def record(self, action: int, addr: int, size: int, block_size: int, stream: int) -> int:
        stack = self.table.capture() if self.stacks else NO_STACK
        now = self._clock()
        device_free = self._device_free() if action == OOM and self._device_free else 0
        self._push((action, addr, size, block_size, stream, now, stack, self.cell, device_free))
        if action == FREE_REQUESTED:  # Note [No pending frees] in _allocator
            self._push((FREE_COMPLETED, addr, size, block_size, stream, now, stack, self.cell, 0))
        return stack

    def _push(self, event: Event) -> None:
        if len(self.events) == self.max_entries:
            self.dropped += 1
        if self.max_entries:
            self.events.append(event)

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
    lists as read-only (copy one before changing it).
    """

    def __init__(self, stack: Callable[[int], StackPairs]) -> None:
        self._stack = stack
        self._frames: dict[tuple[int, int], Frame] = {}
        self._lists: dict[int, list[Frame]] = {}

    def frames(self, sid: int) -> list[Frame]:
        """The stack ``sid`` as frame dicts, innermost first ([] for no stack)."""
        if sid == NO_STACK:
            return []
        out = self._lists.get(sid)
        if out is not None:
            return out
        cache = self._frames
        out = []
        for code, offset in self._stack(sid):
            key = (id(code), offset)  # the core keeps every code object alive
            frame = cache.get(key)
            if frame is None:
                frame = cache[key] = {
                    "filename": code.co_filename,
                    "line": _line_of(code, offset),
                    "name": code.co_name,
                }
            out.append(frame)
        self._lists[sid] = out
        return out


def trace_entries(events: list[Event], frames: Callable[[int], list[Frame]]) -> list[TraceEntry]:
    """Events as PyTorch trace entries (plus our ``block_size`` and ``cell`` keys)."""
    out: list[TraceEntry] = []
    for action, addr, size, block_size, stream, t_ns, sid, cell, device_free in events:
        entry: dict[str, object] = {
            "action": ACTIONS[action],
            "addr": addr,
            "size": size,
            "stream": stream,
            "time_us": t_ns // 1000,
            "frames": frames(sid),
        }
        if block_size:
            entry["block_size"] = block_size
        if cell != NO_CELL:
            entry["cell"] = cell
        if action == OOM:
            entry["device_free"] = device_free
        out.append(entry)  # type: ignore[arg-type]
    return out


class HistoryView:
    """What is being recorded, as the notebook side reads it (a read-only view of the core)."""

    def __init__(self, core: object, table: FrameTable) -> None:
        self._core = core
        #: ``table.frames(stack_id)`` gives frame dicts.
        self.table = table
        _on, stacks, max_entries, dropped, count, _ = core.history_info()  # type: ignore[attr-defined]
        self.stacks = bool(stacks)
        self.max_entries = int(max_entries)
        self.dropped = int(dropped)
        #: Events recorded since recording started, dropped ones included.
        self.recorded = int(dropped) + int(count)

    @property
    def events(self) -> list[Event]:
        """The events kept now, oldest first (built on each access)."""
        events: list[Event] = self._core.events()  # type: ignore[attr-defined]
        return events
