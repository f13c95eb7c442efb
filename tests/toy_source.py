"""A third party's memory source, written only through the public protocol.

``ToyLib`` is a small array library with a device of its own: ``lib.empty(n)`` hands out a
``ToyArray`` from a first-fit free list of one segment per ``SEGMENT`` bytes, ``del`` gives it
back (``weakref.finalize``), a request past the device raises ``ToyOutOfMemory``. ``ToySource``
reads it as a ``jupyter_gpumem.sources.MemorySource``: every member is written here, nothing is
inherited from our code, so the views that work on it work on any source. It records events
with the user's stacks (innermost first), as PyTorch's history does.
"""

from __future__ import annotations

import sys
import time
import weakref
from types import MappingProxyType
from typing import Any

from jupyter_gpumem.sources import CellEnd, CellMark, CellPeak, LiveBlocks, Owner, Status

MiB = 1 << 20
SEGMENT = 8 * MiB
ALIGN = 512


class ToyOutOfMemory(MemoryError):
    """The toy device is full."""

    def __init__(self, requested: int, free: int) -> None:
        self.requested = requested
        self.free = free
        super().__init__(f"toy device out of memory: asked for {requested} bytes, {free} free")


class ToyArray:
    """An array of the toy library: its memory is ``[addr, addr + nbytes)``."""

    def __init__(self, lib: ToyLib, addr: int, nbytes: int) -> None:
        self.addr = addr
        self.nbytes = nbytes
        weakref.finalize(self, lib.release, addr)


def _frames(depth: int = 2) -> list[dict[str, Any]]:
    out = []
    frame = sys._getframe(depth)
    while frame is not None and len(out) < 32:
        out.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno,
                    "name": frame.f_code.co_name})
        frame = frame.f_back
    return out


class ToyLib:
    """The toy library's device and pool (see the module docstring)."""

    def __init__(self, capacity: int = 64 * MiB, base: int = 0x7000_0000_0000) -> None:
        self.capacity = capacity
        self.base = base
        self.segments: list[tuple[int, int]] = []  # (address, size)
        self.live: dict[int, tuple[int, int, list[dict[str, Any]]]] = {}  # addr -> size, req, st
        self.events: list[dict[str, Any]] | None = None  # None: not recording
        self.peak = 0
        self.allocs = 0
        self.frees = 0
        self.ooms = 0

    @property
    def allocated(self) -> int:
        return sum(size for size, _, _ in self.live.values())

    @property
    def reserved(self) -> int:
        return sum(size for _, size in self.segments)

    def _event(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        if self.events is not None:
            self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                                "time_us": time.time_ns() // 1000, "frames": frames})

    def _fit(self, size: int) -> int | None:
        for seg_addr, seg_size in self.segments:
            cursor = seg_addr
            for addr in sorted(a for a in self.live if seg_addr <= a < seg_addr + seg_size):
                if addr - cursor >= size:
                    return cursor
                cursor = addr + self.live[addr][0]
            if seg_addr + seg_size - cursor >= size:
                return cursor
        return None

    def empty(self, nbytes: int) -> ToyArray:
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        frames = _frames()
        addr = self._fit(size)
        if addr is None:
            seg_size = max(SEGMENT, -(-size // SEGMENT) * SEGMENT)
            if self.reserved + seg_size > self.capacity:
                self.ooms += 1
                self._event("oom", 0, size, frames)
                raise ToyOutOfMemory(nbytes, self.capacity - self.reserved)
            seg_addr = self.base + sum(s for _, s in self.segments)
            self.segments.append((seg_addr, seg_size))
            self._event("segment_alloc", seg_addr, seg_size, frames)
            addr = seg_addr
        self.live[addr] = (size, nbytes, frames)
        self.allocs += 1
        self.peak = max(self.peak, self.allocated)
        self._event("alloc", addr, size, frames)
        return ToyArray(self, addr, nbytes)

    def release(self, addr: int) -> None:
        size, _, frames = self.live.pop(addr)
        self.frees += 1
        self._event("free_requested", addr, size, frames)
        self._event("free_completed", addr, size, frames)


class ToySource:
    """``ToyLib`` as a ``MemorySource``, member by member (see the module docstring)."""

    name = "toy"
    title = "the toy library's pool"
    shows = MappingProxyType({"stats": "yes", "blocks": "yes", "stacks": "yes", "history": "yes",
             "cell_peak": "yes, from its peak counter", "oom": "yes", "holders": "yes",
             "replay": "no: not PyTorch's policy"})
    owners = (Owner("toy array", lambda t: t is ToyArray, lambda a: (a.addr, a.nbytes)),)
    library_files = ("toy_source.py",)

    def __init__(self, lib: ToyLib | None = None) -> None:
        self.lib = lib if lib is not None else ToyLib()
        self.readable = True

    def unavailable(self) -> str | None:
        return None if self.readable else "the toy device is switched off"

    @property
    def device_index(self) -> int:
        return 0

    @property
    def device_name(self) -> str:
        return "Toy GPU"

    def memory_stats(self) -> dict[str, int]:
        lib = self.lib
        return {"allocated_bytes.all.current": lib.allocated,
                "allocated_bytes.all.peak": lib.peak,
                "reserved_bytes.all.current": lib.reserved,
                "reserved_bytes.all.peak": lib.reserved,
                "allocation.all.current": len(lib.live),
                "allocation.all.allocated": lib.allocs, "allocation.all.freed": lib.frees,
                "segment.all.current": len(lib.segments),
                "segment.all.allocated": len(lib.segments), "num_ooms": lib.ooms}

    def memory_allocated(self) -> int:
        return self.lib.allocated

    def memory_reserved(self) -> int:
        return self.lib.reserved

    def mem_get_info(self) -> tuple[int, int]:
        return self.lib.capacity - self.lib.reserved, self.lib.capacity

    def _blocks(self, seg_addr: int, seg_size: int) -> list[dict[str, Any]]:
        blocks, cursor = [], seg_addr
        for addr in sorted(a for a in self.lib.live if seg_addr <= a < seg_addr + seg_size):
            if addr > cursor:
                blocks.append({"address": cursor, "size": addr - cursor, "requested_size": 0,
                               "state": "inactive", "frames": []})
            size, requested, frames = self.lib.live[addr]
            blocks.append({"address": addr, "size": size, "requested_size": requested,
                           "state": "active_allocated", "frames": frames})
            cursor = addr + size
        if cursor < seg_addr + seg_size:
            blocks.append({"address": cursor, "size": seg_addr + seg_size - cursor,
                           "requested_size": 0, "state": "inactive", "frames": []})
        return blocks

    def snapshot(self) -> Any:
        segments = []
        for seg_addr, seg_size in self.lib.segments:
            blocks = self._blocks(seg_addr, seg_size)
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            segments.append({"device": 0, "address": seg_addr, "total_size": seg_size,
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": sum(b["requested_size"] for b in blocks),
                             "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                             "is_expandable": False, "frames": [], "blocks": blocks})
        return {"segments": segments, "device_traces": [list(self.lib.events or [])]}

    def live_blocks(self) -> LiveBlocks:
        stacks = _Stacks()
        rows = [(addr, size, requested, stacks.add(frames))
                for addr, (size, requested, frames) in self.lib.live.items()]
        return LiveBlocks(rows, stacks, owner=self.lib)

    def memory_summary(self, abbreviated: bool = False) -> str:
        return (f"toy pool: {self.lib.allocated} bytes allocated, {self.lib.reserved} reserved, "
                f"{len(self.lib.live)} arrays\n")

    def status(self) -> Status:
        free, total = self.mem_get_info()
        return Status("toy", 0, self.device_name, self.lib.allocated, self.lib.peak,
                      self.lib.reserved, free, total, self._history_words(),
                      ("a toy pool of 8 MiB segments",))

    def _history_words(self) -> str:
        return "history on" if self.lib.events is not None else "history off"

    def history_on(self) -> bool:
        return self.lib.events is not None

    def record_history(self, mode: str, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        if mode == "all":
            self.lib.events = []
        elif mode == "off":
            self.lib.events = None

    def recorded_trace(self) -> Any:
        if not self.lib.events:
            return "gpumem: the toy library has recorded no events."
        return self.snapshot()

    def start_cell(self, cell: int) -> CellMark:
        return CellMark(cell, self.memory_stats(), time.time_ns() // 1000)

    def end_cell(self, mark: CellMark, snapshot: Any = None) -> CellEnd:
        peak = self.lib.peak
        if peak > mark.peak:
            return CellEnd(CellPeak(peak, True, "counter"))
        low = max(mark.allocated, self.lib.allocated)
        return CellEnd(CellPeak(low, True) if low >= mark.peak else CellPeak(mark.peak, False,
                                                                               "bound"))

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, ToyOutOfMemory)

    def oom_report(self, exc: BaseException) -> Any:
        return None

    def oom_steps(self, report: Any) -> list[str]:
        return ["the toy device has 64 MiB: `ToyLib(capacity=...)` makes a bigger one."]

    def replay_setting(self) -> str | None:
        return None


class _Stacks:
    def __init__(self) -> None:
        self.table: list[list[Any]] = []

    def add(self, frames: list[Any]) -> int:
        self.table.append(frames)
        return len(self.table) - 1

    def frames(self, stack_id: int) -> list[Any]:
        return self.table[stack_id]
