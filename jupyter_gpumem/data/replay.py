"""Rebuild the block layout at any point of a recorded trace. Pure functions of a Snapshot.

A snapshot holds the state at the end of its trace. Walking the trace backwards and undoing each
event gives the state after any earlier event. Free blocks need no bookkeeping: freed blocks
merge with free neighbours at once (Note [No pending frees] in ``allocator``), so between two
live blocks of a segment there is exactly one free block, or none.

Expandable segments: a snapshot has one segment per contiguous mapped range (``is_expandable``);
undoing ``segment_map`` / ``segment_unmap`` events changes those ranges (``data.mapped``), and
the state after any event is given the same way, one segment per mapped range (mapped free
neighbours merge, as classic ones do).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from jupyter_gpumem.data.codes import (
    ALLOC,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from jupyter_gpumem.data.columns import TraceColumns, as_columns
from jupyter_gpumem.data.devices import (
    device_segments,
    device_total,
    device_trace,
    snapshot_device,
)
from jupyter_gpumem.data.mapped import MappedLife, mapped_lives, virtual_range
from jupyter_gpumem.data.schema import BlockInfo, Frame, SegmentInfo, Snapshot, TraceEntry
from jupyter_gpumem.data.sizes import round_size, segment_type_of


def _block_size(entry: TraceEntry) -> int:
    # A PyTorch trace has no block size: assume the default rounding.
    return entry.get("block_size") or round_size(entry["size"])


def _first_events_from(cols: TraceColumns, codes: np.ndarray[Any, Any],
                       addrs: np.ndarray[Any, Any], index: int, made: int, gone: int
                       ) -> list[tuple[int, list[Frame]]]:
    """The first event of action ``made`` or ``gone`` at ``index`` or later of each address,
    in address order, each with the frames of the ``made`` event just before it of that
    address (``[]`` when that event is a ``gone``, or none is): the frames a free's block had.
   """
    ours = (codes == made) | (codes == gone)
    later = np.flatnonzero(ours[index:]) + index
    unique, first = np.unique(addrs[later], return_index=True)
    at = later[first]
    freed = at[codes[at] == gone]
    frames_of: dict[int, list[Frame]] = {}
    if len(freed) and index:
        earlier = np.flatnonzero(ours[:index])
        earlier = earlier[np.isin(addrs[earlier], addrs[freed])]
        # the last event before ``index`` of each address freed first
        last_unique, last_rev = np.unique(addrs[earlier][::-1], return_index=True)
        last = earlier[::-1][last_rev]
        for a, j in zip(last_unique.tolist(), last.tolist(), strict=True):
            if codes[j] == made:
                frames_of[a] = cols.frames_of(j)
    return [(i, frames_of.get(a, [])) for a, i in zip(unique.tolist(), at.tolist(), strict=True)]


def replay_segments(snapshot: Snapshot, index: int, device: int | None = None
                    ) -> list[SegmentInfo]:
    """The segments and blocks as they were after the first ``index`` events of the trace.

    ``index == len(trace)`` gives the snapshot's own segments; ``index == 0`` the state when the
    trace starts. Frames of blocks and segments come from the trace's own alloc events, so a
    segment or block older than the trace has no frames. ``device`` defaults to
    ``snapshot_device``.
    """
    device = snapshot_device(snapshot, device)
    trace = device_trace(snapshot, device)
    if not 0 <= index <= len(trace):
        raise ValueError(f"index must be in [0, {len(trace)}], got {index}")

    segments: dict[int, SegmentInfo] = {}
    active: dict[int, BlockInfo] = {}
    end_segments = device_segments(snapshot, device)
    for seg in end_segments:
        if not seg.get("is_expandable"):
            segments[seg["address"]] = {**seg, "blocks": []}
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                active[b["address"]] = dict(b)  # type: ignore[assignment]

    cols = as_columns(trace)
    codes = cols.column("action")
    addrs = cols.column("addr")
    sizes = cols.column("size")
    # Undoing the events from the last one back to ``index`` leaves each address as its first
    # event at ``index`` or later says: a block (a segment) first allocated there was not there
    # yet; one first freed there was, with the frames of the alloc (segment_alloc) event just
    # before that free, if the event just before it (of that address) is one.
    for made, gone in ((ALLOC, FREE_COMPLETED), (SEGMENT_ALLOC, SEGMENT_FREE)):
        for i, frames in _first_events_from(cols, codes, addrs, index, made, gone):
            addr = int(addrs[i])
            if codes[i] == made:
                if made == ALLOC:
                    active.pop(addr, None)
                else:
                    segments.pop(addr, None)
            elif made == ALLOC:
                active[addr] = {
                    "address": addr,
                    # a PyTorch trace has no block size: the default rounding (_block_size)
                    "size": int(cols.column("extra")[i]) or round_size(int(sizes[i])),
                    "requested_size": int(sizes[i]),
                    "state": "active_allocated",
                    "frames": frames,
                }
            else:
                size = int(sizes[i])
                segments[addr] = {
                    "device": device,
                    "address": addr,
                    "total_size": size,
                    "allocated_size": 0,
                    "active_size": 0,
                    "requested_size": 0,
                    "stream": int(cols.column("stream")[i]),
                    "segment_type": segment_type_of(size),
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": frames,
                    "blocks": [],
                }
    if any(seg.get("is_expandable") for seg in end_segments) or np.any(
            (codes == SEGMENT_MAP) | (codes == SEGMENT_UNMAP)):
        spans = _virtual_sizes(end_segments, device_total(snapshot, device))
        for life in mapped_lives(trace, end_segments):
            if life.start < index <= life.end:
                segments[life.addr] = expandable_segment(device, life, spans)
    try:
        return _fill_blocks(segments, active)
    except _Outside as lost:
        addr = lost.args[0]
        raise ValueError(f"{block_origin(snapshot, device, addr, index)}: block {addr:#x} lies in "
                         "no segment (the trace and the snapshot disagree)") from None


def block_origin(snapshot: Snapshot, device: int, addr: int, start: int = 0) -> str:
    """Where a file holds the block at ``addr`` of ``device``, for an error to name: the
    first ``alloc`` or ``free_completed`` event at ``start`` or later of its trace, else the
    block of the snapshot's segments (``segments[i].blocks[j]``)."""
    cols = as_columns(device_trace(snapshot, device))
    codes = cols.column("action")[start:]
    hits = np.flatnonzero((cols.column("addr")[start:] == addr)
                          & ((codes == ALLOC) | (codes == FREE_COMPLETED)))
    if len(hits):
        return f"device_traces[{device}][{start + int(hits[0])}]"
    for i, seg in enumerate(snapshot["segments"]):
        if seg.get("device", device) == device:
            for j, b in enumerate(seg["blocks"]):
                if b["address"] == addr and b["state"] != "inactive":
                    return f"segments[{i}].blocks[{j}]"
    return f"device_traces[{device}]"


def segment_origin(snapshot: Snapshot, device: int, addr: int) -> str:
    """Where a file holds the segment at ``addr`` of ``device``, for an error to name: the
    snapshot's segment (``segments[i]``), else the first ``segment_free`` event of it."""
    for i, seg in enumerate(snapshot["segments"]):
        if seg.get("device", device) == device and seg["address"] == addr:
            return f"segments[{i}]"
    cols = as_columns(device_trace(snapshot, device))
    hits = np.flatnonzero((cols.column("addr") == addr) & (cols.column("action") == SEGMENT_FREE))
    if len(hits):
        return f"device_traces[{device}][{int(hits[0])}]"
    return f"device_traces[{device}]"


class _Outside(Exception):
    """A block (its address the one argument) lies in no segment."""


def expandable_segment(device: int, life: MappedLife,
                       spans: dict[bool, int] | None = None) -> SegmentInfo:
    """The snapshot's segment of one mapped range of an expandable segment, without blocks;
    with its reserved range where the trace names its base (``spans``: the range's bytes in
    the small and the large pool, ``_virtual_sizes``)."""
    seg: SegmentInfo = {
        "device": device, "address": life.addr, "total_size": life.size, "allocated_size": 0,
        "active_size": 0, "requested_size": 0, "stream": life.stream,
        "segment_type": "small" if life.small else "large", "segment_pool_id": (0, 0),
        "is_expandable": True, "frames": life.frames, "blocks": []}
    if life.virtual_address is not None and spans and life.small in spans:
        seg["virtual_address"] = life.virtual_address
        seg["virtual_size"] = spans[life.small]
    return seg


def _virtual_sizes(end_segments: list[SegmentInfo], total: int) -> dict[bool, int]:
    """The bytes an expandable segment reserves, in the small (True) and large pool: as the
    snapshot's segments say, else from the device's bytes (``virtual_range``)."""
    spans = {small: virtual_range(total, small) for small in (True, False)} if total else {}
    for seg in end_segments:
        size = seg.get("virtual_size")
        if seg.get("is_expandable") and type(size) is int and size > 0:
            spans[seg["segment_type"] == "small"] = size
    return spans


def _fill_blocks(
    segments: dict[int, SegmentInfo], active: dict[int, BlockInfo]
) -> list[SegmentInfo]:
    starts = sorted(segments)
    by_segment: dict[int, list[BlockInfo]] = {s: [] for s in starts}
    for addr in sorted(active):
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= starts[i] + segments[starts[i]]["total_size"]:
            raise _Outside(addr)
        by_segment[starts[i]].append(active[addr])
    out = []
    for start in starts:
        seg = segments[start]
        blocks: list[BlockInfo] = []
        cursor = start
        end = start + seg["total_size"]
        for b in by_segment[start]:
            if b["address"] > cursor:
                blocks.append(_free(cursor, b["address"] - cursor))
            blocks.append(b)
            cursor = b["address"] + b["size"]
        if cursor < end:
            blocks.append(_free(cursor, end - cursor))
        allocated = sum(b["size"] for b in by_segment[start])
        requested = sum(b["requested_size"] for b in by_segment[start])
        filled: SegmentInfo = {**seg}
        filled["allocated_size"] = filled["active_size"] = allocated
        filled["requested_size"] = requested
        filled["blocks"] = blocks
        out.append(filled)
    return out


def _free(addr: int, size: int) -> BlockInfo:
    return {"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []}
