"""A recorded trace as a replay program: one op per event, and the layout it starts from.

What is read from a snapshot, and how (``replay`` says what is exact):

- the trace of one device (``data.devices.snapshot_device``);
- requests: an alloc event's ``size`` is the requested bytes in our traces and in PyTorch's
  (``record_trace(TraceEntry::ALLOC, ptr, orig_size, ...)``), so rounding under another config
  is the replay's own. An oom event's ``size`` is the rounded request in both formats; ours
  also carries ``requested_size``, PyTorch's does not (the rounded size is replayed then);
- frees: ``free_completed`` (the block is back in the cache then, in both formats);
- streams: each event's own; the policy keeps free blocks per stream;
- ``empty_cache()`` calls: ours are listed in ``jupyter_gpumem["empty_cache"]`` (Note
  [Recording empty_cache] in ``engine.history``); a PyTorch trace has no such list, so they are
  inferred (``_infer_empty_cache``);
- the layout at the trace's start (``start_layout``): what ``data.replay.replay_segments(
  snapshot, 0)`` gives, found without walking the trace in Python: a segment or block whose
  first event is a segment_free or a free was there at the start, one whose first event is a
  segment_alloc or an alloc was not, one with no event is as the snapshot shows it. The
  mapped ranges of expandable segments at the start are the snapshot's with the trace's
  ``segment_map`` / ``segment_unmap`` undone (``data.mapped``).

``segment_map`` and ``segment_unmap`` events, like ``segment_alloc`` and ``segment_free``, are
the recorded policy's own: they replay as nothing (the replayed policy makes its own).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from jupyter_gpumem.data.codes import (
    ACTION_CODES,
    ALLOC,
    FREE_COMPLETED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from jupyter_gpumem.data.columns import TraceColumns
from jupyter_gpumem.data.devices import (
    device_segments,
    device_total,
    device_trace,
    snapshot_device,
)
from jupyter_gpumem.data.mapped import MappedLife, mapped_lives
from jupyter_gpumem.data.replay import block_origin
from jupyter_gpumem.data.sizes import INT64_MAX, MAX_ALLOC_SIZE, round_size, segment_type_of
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.engine.blocks import segment_size_for
from jupyter_gpumem.whatif.departure import Course, recorded_course

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import BlockInfo, SegmentInfo, Snapshot, TraceEntry
    from jupyter_gpumem.engine.config import AllocatorConfig
    from jupyter_gpumem.whatif.rebuild import Plan

#: A device size for a trace that does not say its own: nothing is refused for lack of room.
UNLIMITED = MAX_ALLOC_SIZE
#: The most distinct streams a replay takes (the trace's and its segments'): the policy keeps
#: free blocks per pool and stream, and a small file can name a million streams. Raise it here
#: for a trace that needs more.
MAX_STREAMS = 1 << 16
#: Op codes, one per event (the C core's replay.c mirrors them).
OP_NOP, OP_MALLOC, OP_FREE, OP_PROBE = 0, 1, 2, 3
#: Flag of an op: call empty_cache() before it.
OP_EMPTY_CACHE = 8


class ReplayLimitError(ValueError):
    """A trace asks a replay for more than it takes; the message names the limit."""


@dataclass
class Program:
    """What a replay runs: per-event ops and the recorded address, request and stream."""

    ops: np.ndarray[Any, np.dtype[np.int8]]
    addrs: np.ndarray[Any, np.dtype[np.int64]]
    sizes: np.ndarray[Any, np.dtype[np.int64]]
    streams: np.ndarray[Any, np.dtype[np.int64]]
    #: segments and blocks when the trace starts
    initial: list[SegmentInfo]
    #: bytes of the replayed device, and how many of them are held outside the allocator
    #: (``usable_capacity``)
    capacity: int
    outside: int
    #: empty_cache() after the last event
    empty_cache_at_end: bool = False
    inferred_empty_cache: bool = False
    empty_cache_calls: int = 0
    notes: list[str] = field(default_factory=list)
    #: out-of-memory events in the trace
    recorded_ooms: int = 0
    #: reserved bytes and failures as recorded, event by event (``whatif.departure``)
    course: Course | None = None
    #: how to carve ``initial``, by (device bytes, with holes): ``replay._plan``
    plans: dict[tuple[int, bool], Plan] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ops)


def extension_info(snapshot: Snapshot, device: int) -> dict[str, Any]:
    """Our ``jupyter_gpumem`` field for ``device`` (one allocator's, or one of several)."""
    info: dict[str, Any] = dict(snapshot.get("jupyter_gpumem") or {})
    devices = info.get("devices")
    if isinstance(devices, dict):
        one = devices.get(str(device))
        return dict(one) if isinstance(one, dict) else {}
    return info


def build_program(snapshot: Snapshot, device: int | None, config: AllocatorConfig,
                  capacity: int | None) -> Program:
    """The replay program of ``snapshot``'s trace on ``device``; ``config`` and ``capacity``
    (the recorded ones) are used only to infer empty_cache calls of a PyTorch trace.
    ``capacity`` None: what the recorded allocator could use (``usable_capacity``)."""
    device = snapshot_device(snapshot, device)
    trace = program_columns(device_trace(snapshot, device))
    n = len(trace)
    codes = trace.column("action").astype(np.int8)
    addrs = trace.column("addr").copy()
    sizes = trace.column("size").copy()
    streams = trace.column("stream").copy()
    _check_streams(streams, device_segments(snapshot, device))
    ops = np.zeros(n, np.int8)
    ops[codes == ALLOC] = OP_MALLOC
    ops[codes == FREE_COMPLETED] = OP_FREE
    oom_at = np.flatnonzero(codes == OOM)
    ops[oom_at] = OP_PROBE
    notes: list[str] = []
    requested = trace.column("extra")[oom_at]  # an oom's requested_size (0: not recorded)
    sizes[oom_at] = np.where(requested > 0, requested, sizes[oom_at])
    rounded_ooms = int(np.count_nonzero(requested <= 0))
    if rounded_ooms:
        notes.append(f"{rounded_ooms} out-of-memory request(s) carry only their rounded size "
                     "(PyTorch records no more): replayed at that size")
    if len(oom_at):
        notes.append("a request that failed when recorded is freed at once if it fits in the "
                     "replay (the recorded program went on without it)")
    initial = start_layout(snapshot, device, trace, codes, addrs, sizes)
    course = recorded_course(snapshot, device, trace, codes, sizes,
                             extension_info(snapshot, device).get("alloc_retries"))
    outside = 0
    if capacity is None:
        capacity, outside, said = usable_capacity(snapshot, device, trace, codes,
                                                  course.reserved)
        notes.extend(said)
    program = Program(ops, addrs, sizes, streams, initial, capacity, outside, notes=notes,
                      recorded_ooms=len(oom_at), course=course)
    marks = extension_info(snapshot, device).get("empty_cache")
    if isinstance(marks, list):
        for at in marks:
            if isinstance(at, int) and 0 <= at < n:
                ops[at] |= OP_EMPTY_CACHE
            elif at == n:
                program.empty_cache_at_end = True
        program.empty_cache_calls = len(marks)
    else:
        _infer_empty_cache(program, trace, codes, config, capacity)
    return program


def program_columns(trace: Sequence[TraceEntry] | TraceColumns) -> TraceColumns:
    """``trace`` as columns; a list of entries that lacks a key the replay reads raises the
    KeyError a reader of the entries would (``replay._prepare`` then names the bad field)."""
    if isinstance(trace, TraceColumns):
        return trace
    deque(map(_READ_KEYS, trace), maxlen=0)
    return TraceColumns.from_entries(trace)


_READ_KEYS = itemgetter("action", "addr", "size", "stream")


def _check_streams(streams: np.ndarray[Any, np.dtype[np.int64]],
                   segments: list[SegmentInfo]) -> None:
    """ReplayLimitError when the trace and its segments name more than ``MAX_STREAMS``
    streams."""
    if len(streams) + len(segments) <= MAX_STREAMS:
        return
    named = np.unique(np.concatenate(
        [streams, np.fromiter((seg["stream"] for seg in segments), np.int64, len(segments))]))
    if len(named) > MAX_STREAMS:
        raise ReplayLimitError(
            f"replay: the trace names {len(named):,} distinct streams, more than the "
            f"{MAX_STREAMS:,} a replay takes (MAX_STREAMS in jupyter_gpumem.whatif.program)")


# Note [The replayed device's size]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A real GPU is never all the allocator's: the CUDA context, library workspaces and other
# processes hold some of it. A replay on a simulated device of the GPU's total size would then
# fit requests that failed when recorded, and say "the recorded config fits". So a replay with no
# ``capacity`` given runs on what the recorded allocator could use:
#
# - at an out-of-memory error, its reserved bytes then plus the ``device_free`` the event
#   records (both formats record it; PyTorch after its retry ladder, as we do). The failed
#   request needed a segment larger than that free memory, so on a device of this size the
#   replayed policy meets the same wall. With several errors, the tightest one;
# - else, our snapshot's ``device_free`` when it was taken, plus the reserved bytes then;
# - else the device's total (ours records it), else an unlimited device.
#
# The replayed device has the recorded device's total where the trace says it, with the rest
# held "outside" (by another process of the simulated device): a memory fraction is a share of
# the total, as when it was recorded, and the OOM explainer's device figures stay true.
#
# Reserved bytes at an event are the snapshot's (the sum of its segments: one per mapped range
# of an expandable segment) less what the later segment events added. Never more than the
# device's total. Memory held outside the allocator is taken as constant over the trace.


def usable_capacity(snapshot: Snapshot, device: int, trace: TraceColumns,
                    codes: np.ndarray[Any, np.dtype[np.int8]],
                    after: np.ndarray[Any, np.dtype[np.int64]]) -> tuple[int, int, list[str]]:
    """``(device bytes, bytes held outside the allocator, notes)`` for a replay that is given
    no device size: see Note [The replayed device's size]. ``after``: reserved bytes after
    each event (``departure.reserved_after``)."""
    total = device_total(snapshot, device)
    info = extension_info(snapshot, device)
    end = sum(int(seg["total_size"]) for seg in device_segments(snapshot, device))
    found: list[tuple[int, int, int]] = []  # (room, reserved, free) at each oom that says
    oom_at = np.flatnonzero(codes == OOM)
    for i, free in zip(oom_at.tolist(), trace.column("device_free")[oom_at].tolist(),
                       strict=True):
        if free >= 0:
            found.append((int(after[i]) + free, int(after[i]), free))
    when = "at its first out-of-memory error"
    if found:
        room, reserved, free = min(found)
        if len(found) > 1:
            when = "at the tightest of its out-of-memory errors"
    else:
        free = info.get("device_free")
        if not (isinstance(free, int) and not isinstance(free, bool) and free >= 0
                and (total or end + free) > 0):
            if total:
                return total, 0, []
            return UNLIMITED, 0, ["the trace does not say its device's size: replayed on an "
                                  "unlimited device (pass capacity=)"]
        room, reserved, when = end + free, end, "when the snapshot was taken"
    room = min(room, INT64_MAX)  # the largest device the cores model (free may be up to it)
    if total and room >= total:
        return total, 0, []
    said = (f"its {format_bytes(reserved)} reserved plus the {format_bytes(free)} the device "
            f"had free {when}")
    if not total:
        return room, 0, [f"replayed on a device of {format_bytes(room)}, what the allocator "
                         f"could use: {said} (the trace does not say the device's size)"]
    return total, total - room, [f"replayed on the device's {format_bytes(total)}, "
                                 f"{format_bytes(total - room)} of it in use outside the "
                                 f"allocator, which could use {format_bytes(room)}: {said}"]


def _first_events(codes: np.ndarray[Any, np.dtype[np.int8]],
                  addrs: np.ndarray[Any, np.dtype[np.int64]], of: tuple[int, int]
                  ) -> dict[int, int]:
    """{address: index of its first event} over the events whose code is in ``of``."""
    at = np.flatnonzero((codes == of[0]) | (codes == of[1]))
    unique, first = np.unique(addrs[at], return_index=True)
    return dict(zip(unique.tolist(), at[first].tolist(), strict=True))


def start_layout(snapshot: Snapshot, device: int, trace: TraceColumns,
                 codes: np.ndarray[Any, np.dtype[np.int8]],
                 addrs: np.ndarray[Any, np.dtype[np.int64]],
                 sizes: np.ndarray[Any, np.dtype[np.int64]]) -> list[SegmentInfo]:
    """The segments and their blocks (live ones ``active_allocated``, the gaps ``inactive``)
    when the trace starts, in address order."""
    # address -> (size, stream, type, expandable)
    segments: dict[int, tuple[int, int, str, bool]] = {}
    ranges: dict[int, VirtualRange] = {}  # a mapped range's address -> its segment's range
    live: dict[int, int] = {}  # address -> block size
    streams = trace.column("stream")
    seg_first = _first_events(codes, addrs, (SEGMENT_ALLOC, SEGMENT_FREE))
    block_first = _first_events(codes, addrs, (ALLOC, FREE_COMPLETED))
    end_segments = device_segments(snapshot, device)
    if np.any((codes == SEGMENT_MAP) | (codes == SEGMENT_UNMAP)) or any(
            seg.get("is_expandable") for seg in end_segments):
        lives = mapped_lives(trace, end_segments)
        ranges = virtual_ranges(lives, end_segments)
        for life in lives:
            if life.start < 0:
                segments[life.addr] = (life.size, life.stream,
                                       "small" if life.small else "large", True)
    for seg in end_segments:
        if seg.get("is_expandable"):
            for b in seg["blocks"]:
                if b["state"] != "inactive" and b["address"] not in block_first:
                    live[b["address"]] = b["size"]
        elif seg["address"] not in seg_first:
            segments[seg["address"]] = (seg["total_size"], seg["stream"], seg["segment_type"],
                                        False)
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] not in block_first:
                live[b["address"]] = b["size"]
    for addr, i in seg_first.items():
        if codes[i] == SEGMENT_FREE:
            segments[addr] = (int(sizes[i]), int(streams[i]), segment_type_of(int(sizes[i])),
                              False)
    block_size = trace.column("extra")  # an alloc's or free's block bytes (0: not recorded)
    for addr, i in block_first.items():
        if codes[i] == FREE_COMPLETED:
            live[addr] = int(block_size[i]) or round_size(int(sizes[i]))
    starts = sorted(segments)
    out: list[SegmentInfo] = []
    blocks_of: dict[int, list[int]] = {s: [] for s in starts}
    ends = np.array(starts, np.int64)
    for addr in sorted(live):
        k = int(np.searchsorted(ends, addr, side="right")) - 1
        if k < 0 or addr >= starts[k] + segments[starts[k]][0]:
            raise ValueError(f"{block_origin(snapshot, device, addr)}: block {addr:#x} lies in "
                             "no segment (the trace and the snapshot disagree)")
        blocks_of[starts[k]].append(addr)
    for start in starts:
        total, stream, kind, expandable = segments[start]
        blocks: list[BlockInfo] = []
        cursor = start
        for addr in blocks_of[start]:
            if addr > cursor:
                blocks.append(_block(cursor, addr - cursor, live=False))
            blocks.append(_block(addr, live[addr], live=True))
            cursor = addr + live[addr]
        if cursor < start + total:
            blocks.append(_block(cursor, start + total - cursor, live=False))
        made: SegmentInfo = {
            "device": device, "address": start, "total_size": total, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": stream,
            "segment_type": "small" if kind == "small" else "large", "segment_pool_id": (0, 0),
            "is_expandable": expandable, "frames": [], "blocks": blocks}
        if expandable:
            vr = ranges[start]
            made["virtual_address"] = vr.address
            made["virtual_size"] = vr.size  # -1: not known; 0: the base is inferred
        out.append(made)
    return out


# Note [The virtual range]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A snapshot shows an expandable segment as its mapped ranges only. Where the segment itself
# begins matters to the policy: a miss maps pages at the lowest unmapped start of its stream
# and pool that has room (Note [Expandable segments] in ``engine.expandable``), so an unmapped
# stretch before the first mapped range, or between two, takes the next request that fits it.
# A replay that laid the ranges out side by side from a new base would map fresh pages at the
# end instead, and reserve more than was recorded.
#
# So our snapshots carry, on each mapped range of an expandable segment, the segment's reserved
# range: ``virtual_address`` (its base) and ``virtual_size``; and our segment_map and
# segment_unmap entries carry their segment's ``virtual_address`` and ``segment_type`` (extra
# keys: PyTorch's readers ignore them; Note [Recording empty_cache] in ``engine.history``). A
# range at the trace's start gets the base the snapshot or an entry inside it names
# (``MappedLife.virtual_address``; ``virtual_size`` -1 where no segment of its pool is left to
# say the size). A trace without the keys (PyTorch's) gets an inferred base: the lowest
# address the trace shows in the segment (``MappedLife.group``), never below the true one;
# ``virtual_size`` is then 0 and the replay says so in a note. ``whatif.rebuild`` lays each
# segment out from its base, unmapped stretches included.


@dataclass(frozen=True)
class VirtualRange:
    """An expandable segment's reserved range: ``size`` -1 when only its base is known (from
    a trace event), 0 when the base is inferred."""

    address: int
    size: int


def virtual_ranges(lives: list[MappedLife], end_segments: list[SegmentInfo]
                   ) -> dict[int, VirtualRange]:
    """The reserved range of the segment of each mapped range at the trace's start, by the
    range's address: Note [The virtual range]."""
    spans = {seg["segment_type"] == "small": seg["virtual_size"] for seg in end_segments
             if seg.get("is_expandable") and type(seg.get("virtual_size")) is int
             and seg["virtual_size"] > 0}
    lowest: dict[int, int] = {}
    for life in lives:
        lowest[life.group] = min(lowest.get(life.group, life.addr), life.addr)
    return {life.addr: VirtualRange(lowest[life.group], 0) if life.virtual_address is None
            else VirtualRange(life.virtual_address, spans.get(life.small, -1))
            for life in lives if life.start < 0}


def _block(addr: int, size: int, *, live: bool) -> BlockInfo:
    return {"address": addr, "size": size, "requested_size": size if live else 0,
            "state": "active_allocated" if live else "inactive", "frames": []}


def _infer_empty_cache(program: Program, trace: TraceColumns,
                       codes: np.ndarray[Any, np.dtype[np.int8]], config: AllocatorConfig,
                       capacity: int) -> None:
    """Mark empty_cache() calls in a trace that does not list them (PyTorch's).

    Segment events come in runs: the segments a request freed (garbage collection, the retry
    ladder) and the one it got, just before its alloc or oom event; or what an empty_cache()
    call freed. A run with a segment_free is the policy's when it ends at an oom event, or when
    at its start the policy had to free: reserved bytes (as recorded) plus the segment the next
    request needs pass the cap or the device, or garbage collection was due (reserved above
    its threshold). Otherwise the run is an empty_cache() call, placed before the run.
    """
    n = len(codes)
    sizes = trace.column("size")
    grows = (codes == SEGMENT_ALLOC) | (codes == SEGMENT_MAP)
    shrinks = (codes == SEGMENT_FREE) | (codes == SEGMENT_UNMAP)
    delta = np.where(grows, sizes, 0) - np.where(shrinks, sizes, 0)
    start = sum(seg["total_size"] for seg in program.initial)
    reserved_before = start + np.concatenate(([0], np.cumsum(delta)[:-1])) if n else delta
    segment_event = grows | shrinks
    fraction = config.per_process_memory_fraction
    cap = round(fraction * capacity) if fraction is not None and fraction < 1.0 else None
    limit = capacity if cap is None else min(cap, capacity)
    gc = config.garbage_collection_threshold
    found = 0
    frees = np.flatnonzero(shrinks)
    i = 0
    for f in frees.tolist():
        if f < i:
            continue  # inside a run already decided
        first = f
        while first > 0 and segment_event[first - 1]:
            first -= 1
        end = f
        while end < n and (segment_event[end] or codes[end] == ACTION_CODES["snapshot"]):
            end += 1
        i = end
        r = int(reserved_before[first])
        if end < n and codes[end] == OOM:
            continue
        if end < n and codes[end] == ALLOC:
            need = segment_size_for(round_size(int(sizes[end]),
                                               config.roundup_power2_divisions or 0))
            if r + need > limit or (gc is not None and cap is not None and r > gc * cap):
                continue
        program.ops[first] |= OP_EMPTY_CACHE
        found += 1
    program.inferred_empty_cache = True
    program.empty_cache_calls = found
    program.notes.append(
        f"the trace lists no empty_cache() calls (a PyTorch trace): {found} inferred from "
        "segment_free events the policy would not have made; calls that freed nothing "
        "cannot be seen")
