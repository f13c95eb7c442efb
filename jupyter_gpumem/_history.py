"""Allocation history: a ring buffer of events, with interned Python stacks.

Recording must cost little, since it runs inside every malloc and free. An event is stored as a
plain tuple; a stack is stored once, as a tuple of code ids and instruction offsets interned to an
int.
Strings and ``Frame`` dicts are built only when a snapshot asks for them.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from types import CodeType

from ._schema import Frame, TraceAction, TraceEntry

ACTIONS: tuple[TraceAction, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "oom",
    "snapshot",
)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, OOM, SNAPSHOT = range(7)

#: Frames kept per event, innermost first.
MAX_FRAMES = 24
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: Below this frame there is only IPython's machinery: the walk stops there.
_IPYTHON_RUN_CODE = ("interactiveshell.py", "run_code")

#: One stored event: (action, addr, size, block_size, stream, time_ns, stack_id, cell, device_free)
Event = tuple[int, int, int, int, int, int, int, int, int]
NO_STACK = -1
NO_CELL = -1

_KEEP, _SKIP, _STOP = 0, 1, 2


class StackTable:
    """Interns Python stacks: each distinct stack is stored once and named by an int.

    A stack is keyed by ``(id(code), instruction offset)`` pairs, flat in one tuple of ints:
    hashing a code object recomputes a hash of its whole body, ints hash at once, and the
    offset is a plain attribute while the line number must be looked up. Every code object seen
    is kept alive in ``_codes``, so its id cannot be reused; lines are found only when a
    snapshot asks for frames.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[int, ...], int] = {}
        self._stacks: list[tuple[int, ...]] = []
        self._codes: dict[int, tuple[int, CodeType]] = {}  # id(code) -> (kind, code)
        self._frames: dict[tuple[int, int], Frame] = {}

    def _kind(self, code: CodeType) -> int:
        filename = code.co_filename
        if filename.startswith(_PACKAGE_DIR):
            return _SKIP
        if code.co_name == _IPYTHON_RUN_CODE[1] and filename.endswith(_IPYTHON_RUN_CODE[0]):
            return _STOP
        return _KEEP

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
                entry = codes[cid] = (self._kind(code), code)
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

    def frames(self, sid: int) -> list[Frame]:
        """The stack ``sid`` as PyTorch's frame dicts, innermost first."""
        if sid == NO_STACK:
            return []
        cache = self._frames
        stack = self._stacks[sid]
        out = []
        for i in range(0, len(stack), 2):
            pair = (stack[i], stack[i + 1])
            frame = cache.get(pair)
            if frame is None:
                code = self._codes[pair[0]][1]
                frame = cache[pair] = {
                    "filename": code.co_filename,
                    "line": _line_of(code, pair[1]),
                    "name": code.co_name,
                }
            out.append(dict(frame))  # a copy: callers may change what they get
        return out  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._stacks)


def _line_of(code: CodeType, offset: int) -> int:
    """The source line of the instruction at byte ``offset`` of ``code``."""
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if start <= offset < end:
            return lineno if lineno is not None else line
        if lineno is not None and start <= offset:
            line = lineno
    return line


class History:
    """The recorded events of one allocator, oldest first, at most ``max_entries`` of them."""

    def __init__(self, *, stacks: bool, max_entries: int) -> None:
        self.stacks = stacks
        self.max_entries = max_entries
        self.events: deque[Event] = deque(maxlen=max_entries)
        self.table = StackTable()
        self.dropped = 0  # events pushed out of the ring

    def to_entries(self) -> list[TraceEntry]:
        """The events as PyTorch trace entries (plus our ``block_size`` and ``cell`` keys)."""
        frames = self.table.frames
        out: list[TraceEntry] = []
        for action, addr, size, block_size, stream, t_ns, sid, cell, device_free in self.events:
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
