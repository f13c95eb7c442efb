"""Allocation history: a ring buffer of events, with interned Python stacks.

Recording must cost little, since it runs inside every malloc and free. An event is stored as a
plain tuple; a stack is stored once, as a tuple of ``(code, lineno)`` pairs interned to an int.
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
MAX_FRAMES = 32
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

#: One stored event: (action, addr, size, block_size, stream, time_ns, stack_id, cell, device_free)
Event = tuple[int, int, int, int, int, int, int, int, int]
NO_STACK = -1
NO_CELL = -1


class StackTable:
    """Interns Python stacks: each distinct stack is stored once and named by an int."""

    def __init__(self) -> None:
        self._ids: dict[tuple[tuple[CodeType, int], ...], int] = {}
        self._stacks: list[tuple[tuple[CodeType, int], ...]] = []
        self._ours: dict[CodeType, bool] = {}
        self._frames: dict[tuple[CodeType, int], Frame] = {}

    def capture(self) -> int:
        """Intern the caller's stack, leaving out frames of jupyter_gpumem itself."""
        ours = self._ours
        pairs: list[tuple[CodeType, int]] = []
        f = sys._getframe(1)
        while f is not None and len(pairs) < MAX_FRAMES:
            code = f.f_code
            mine = ours.get(code)
            if mine is None:
                mine = ours[code] = code.co_filename.startswith(_PACKAGE_DIR)
            if not mine:
                pairs.append((code, f.f_lineno or 0))
            f = f.f_back  # type: ignore[assignment]
        stack = tuple(pairs)
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
        out = []
        for pair in self._stacks[sid]:
            frame = cache.get(pair)
            if frame is None:
                code, line = pair
                frame = cache[pair] = {
                    "filename": code.co_filename,
                    "line": line,
                    "name": code.co_name,
                }
            out.append(dict(frame))  # a copy: callers may change what they get
        return out  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._stacks)


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
