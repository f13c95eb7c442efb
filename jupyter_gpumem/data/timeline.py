"""A trace as numpy columns: allocated and reserved bytes after every event, sites, cells, lives.

One pass over the trace's dicts pulls out the raw fields; everything after it is vectorised, so a
million events take well under a second. Conventions:

- Column ``i`` describes the state *after* event ``i``. ``allocated`` counts rounded block sizes,
  as PyTorch's ``allocated_bytes`` does; ``reserved`` counts segment bytes.
- A block stops counting as allocated at ``free_requested`` (PyTorch decreases
  ``allocated_bytes`` there); a trace with no ``free_requested`` at all uses ``free_completed``.
- The trace may start mid-session (a ring buffer drops old events). The starting allocated and
  reserved bytes are worked backward from the snapshot's segments, which hold the state at the
  end of the trace.
- A site is the first frame outside CuPy, numpy and installed packages, as ``"file:line"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.sites import site_of

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, SegmentInfo, Snapshot, TraceEntry

IntArray = npt.NDArray[np.int64]

#: Action codes of the ``action`` column. ``OTHER`` is any action we do not know.
ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
    "snapshot", "other",
)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, OOM, SNAPSHOT, OTHER = range(8)
_CODES = {name: code for code, name in enumerate(ACTIONS)}
# PyTorch's expandable segments map and unmap pages: they change reserved bytes like segments.
_CODES["segment_map"] = SEGMENT_ALLOC
_CODES["segment_unmap"] = SEGMENT_FREE

#: Site id of an event with no user frame, or of a block allocated before the trace began.
NO_SITE = -1
#: Cell id of an event recorded outside any cell.
NO_CELL = -1

@dataclass(frozen=True, eq=False)
class Timeline:
    """The columns of one device's trace. Every array has one entry per event."""

    time_us: IntArray  # microseconds on the allocator's clock
    action: npt.NDArray[np.int8]  # action code, an index into ACTIONS
    addr: IntArray  # block or segment address
    stream: IntArray  # stream of the block or segment
    size: IntArray  # requested bytes (alloc/free) or segment bytes
    block_size: IntArray  # rounded bytes of the block for alloc/free events, else 0
    allocated: IntArray  # allocated bytes after the event
    reserved: IntArray  # reserved bytes after the event
    site: npt.NDArray[np.int32]  # id into ``sites`` of the allocating line; NO_SITE if unknown
    cell: npt.NDArray[np.int32]  # notebook cell of the event; NO_CELL outside cells
    sites: list[str]  # "file:line" of every site id
    stack: npt.NDArray[np.int32]  # id into ``stacks`` of the allocating stack; NO_SITE if none
    stacks: list[list[Frame]]  # every distinct stack, innermost frame first
    start_allocated: int  # allocated bytes before the first event
    start_reserved: int  # reserved bytes before the first event

    def __len__(self) -> int:
        return len(self.action)

    @property
    def index(self) -> IntArray:
        """The event index, 0..n-1."""
        return np.arange(len(self.action), dtype=np.int64)

    def site_label(self, site_id: int) -> str:
        return self.sites[site_id] if site_id >= 0 else "(before trace)"


def _trace_of(snapshot: Snapshot, device: int | None) -> tuple[list[TraceEntry], int]:
    traces = snapshot.get("device_traces") or []
    if device is None:
        info = snapshot.get("jupyter_gpumem") or {}
        dev = info.get("device")
        device = dev if isinstance(dev, int) else next(
            (i for i, t in enumerate(traces) if t), 0)
    trace = traces[device] if 0 <= device < len(traces) else []
    return trace, device


def _end_state(segments: Sequence[SegmentInfo], device: int) -> tuple[int, int]:
    allocated = reserved = 0
    for seg in segments:
        if seg.get("device", device) != device:
            continue
        reserved += seg["total_size"]
        allocated += sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    return allocated, reserved


def build_timeline(snapshot: Snapshot, device: int | None = None) -> Timeline:
    """The timeline of ``snapshot``'s trace for ``device`` (default: the snapshot's own)."""
    trace, device = _trace_of(snapshot, device)
    end_allocated, end_reserved = _end_state(snapshot.get("segments", []), device)
    return trace_columns(trace, end_allocated=end_allocated, end_reserved=end_reserved)


def trace_columns(trace: Sequence[TraceEntry], *, end_allocated: int | None = None,
                  end_reserved: int | None = None) -> Timeline:
    """Columns of ``trace``. With the end state given, the start state is worked back from it;
    without it the trace is taken to start from nothing (or from the least that keeps every
    column non-negative)."""
    n = len(trace)
    codes = _CODES
    action = np.fromiter((codes.get(a, OTHER) for a in map(itemgetter("action"), trace)),
                         np.int8, n)
    addr = np.fromiter(map(itemgetter("addr"), trace), np.int64, n)
    size = np.fromiter(map(itemgetter("size"), trace), np.int64, n)
    time_us = np.fromiter(map(itemgetter("time_us"), trace), np.int64, n)
    stream = np.fromiter(map(itemgetter("stream"), trace), np.int64, n)
    cell = np.fromiter((e.get("cell", NO_CELL) for e in trace), np.int32, n)
    block_size = np.fromiter((e.get("block_size", 0) for e in trace), np.int64, n)

    is_alloc = action == ALLOC
    free_code = FREE_REQUESTED if np.any(action == FREE_REQUESTED) else FREE_COMPLETED
    is_free = action == free_code
    blockish = is_alloc | is_free
    # A PyTorch trace has no block size: assume the default rounding to 512 B.
    missing = blockish & (block_size == 0)
    block_size[missing] = np.maximum(512, (size[missing] + 511) // 512 * 512)
    block_size[~blockish & (action != FREE_COMPLETED) & (action != FREE_REQUESTED)] = 0

    d_alloc = np.where(is_alloc, block_size, 0) - np.where(is_free, block_size, 0)
    d_res = np.where(action == SEGMENT_ALLOC, size, 0) - np.where(action == SEGMENT_FREE, size, 0)
    allocated = np.cumsum(d_alloc)
    reserved = np.cumsum(d_res)
    start_a = _start_value(allocated, end_allocated)
    start_r = _start_value(reserved, end_reserved)
    allocated += start_a
    reserved += start_r

    stack, stacks = _stacks(trace, action)
    alloc_idx, free_idx, _ = _pairs(addr, is_alloc, is_free)
    stack[free_idx] = stack[alloc_idx]  # a free belongs to the stack that allocated the block
    site_of_stack, sites = _sites_of_stacks(stacks)
    site = site_of_stack[stack]  # NO_SITE (-1) picks the last entry, NO_SITE
    return Timeline(time_us=time_us, action=action, addr=addr, stream=stream, size=size,
                    block_size=block_size,
                    allocated=allocated, reserved=reserved, site=site, cell=cell, sites=sites,
                    stack=stack, stacks=stacks, start_allocated=start_a, start_reserved=start_r)


def _start_value(cum: IntArray, end: int | None) -> int:
    floor = max(0, -int(cum.min())) if len(cum) else 0
    if end is None:
        return floor
    total = int(cum[-1]) if len(cum) else 0
    return max(end - total, floor)


def _stacks(trace: Sequence[TraceEntry], action: npt.NDArray[np.int8]
            ) -> tuple[npt.NDArray[np.int32], list[list[Frame]]]:
    """Interned stack ids of alloc and oom events (others get NO_SITE), and the stacks."""
    stack = np.full(len(trace), NO_SITE, np.int32)
    key_of = itemgetter("filename", "line", "name")
    ids: dict[tuple[tuple[str, int, str], ...], int] = {}
    stacks: list[list[Frame]] = []
    picks = np.flatnonzero((action == ALLOC) | (action == OOM)).tolist()
    out = []
    by_list: dict[int, int] = {}  # id(frames) -> stack id: live snapshots share frame lists
    for i in picks:
        frames = trace[i]["frames"]
        sid = by_list.get(id(frames))
        if sid is None:
            key = tuple(map(key_of, frames))
            sid = ids.get(key)
            if sid is None:
                sid = ids[key] = len(stacks)
                stacks.append(frames)
            by_list[id(frames)] = sid
        out.append(sid)
    stack[picks] = out
    return stack, stacks


def _sites_of_stacks(stacks: Sequence[Sequence[Frame]]
                     ) -> tuple[npt.NDArray[np.int32], list[str]]:
    """The site id of every stack (NO_SITE if it has no user frame), and the site names."""
    ids: dict[str, int] = {}
    of_stack = np.full(len(stacks) + 1, NO_SITE, np.int32)  # the last entry maps NO_SITE
    for k, frames in enumerate(stacks):
        site = site_of(frames, full=True)
        if site is not None:
            of_stack[k] = ids.setdefault(site, len(ids))
    return of_stack, list(ids)


def _pairs(addr: IntArray, is_alloc: npt.NDArray[np.bool_],
           is_free: npt.NDArray[np.bool_]) -> tuple[IntArray, IntArray, IntArray]:
    """Match each free to the alloc of the same address before it.

    Returns (allocs that are freed, their frees, frees with no alloc in the trace)."""
    idx = np.flatnonzero(is_alloc | is_free)
    order = idx[np.lexsort((idx, addr[idx]))]
    a = addr[order]
    alloc_s = is_alloc[order]
    same = a[1:] == a[:-1]
    paired = same & alloc_s[:-1] & ~alloc_s[1:]
    alloc_idx = order[:-1][paired]
    free_idx = order[1:][paired]
    freed_first = np.ones(len(order), bool)
    freed_first[1:] = ~paired
    orphan = order[freed_first & ~alloc_s]
    return alloc_idx, free_idx, orphan


@dataclass(frozen=True, eq=False)
class Intervals:
    """Live allocations: block ``k`` counts as allocated after events ``start[k] .. end[k]-1``.

    A block allocated before the trace starts at 0; one still live at the end ends at ``n``.
    Blocks that live through the whole trace unseen are one entry with site NO_SITE."""

    start: IntArray
    end: IntArray
    size: IntArray
    site: npt.NDArray[np.int32]
    cell: npt.NDArray[np.int32]  # cell of the allocating event (NO_CELL if unknown)
    addr: IntArray  # block address (0 for the unseen remainder)
    requested: IntArray  # bytes the user asked for (the block size if unknown)
    stack: npt.NDArray[np.int32]  # id into the timeline's ``stacks`` (NO_SITE if unknown)
    seen: npt.NDArray[np.bool_]  # whether the allocation itself is in the trace

    def __len__(self) -> int:
        return len(self.start)


def live_intervals(tl: Timeline) -> Intervals:
    """Every allocation's life, for stacked bands and per-site totals."""
    n = len(tl)
    is_alloc = tl.action == ALLOC
    free_code = FREE_REQUESTED if np.any(tl.action == FREE_REQUESTED) else FREE_COMPLETED
    is_free = tl.action == free_code
    alloc_idx, free_idx, orphan = _pairs(tl.addr, is_alloc, is_free)
    freed = np.zeros(n, bool)
    freed[alloc_idx] = True
    open_idx = np.flatnonzero(is_alloc & ~freed)
    unseen = tl.start_allocated - int(tl.block_size[orphan].sum())
    base = np.array([unseen], np.int64) if unseen > 0 else np.zeros(0, np.int64)
    start = np.concatenate([alloc_idx, open_idx, np.zeros(len(orphan), np.int64),
                            np.zeros(len(base), np.int64)])
    end = np.concatenate([free_idx, np.full(len(open_idx), n, np.int64), orphan,
                          np.full(len(base), n, np.int64)])
    size = np.concatenate([tl.block_size[alloc_idx], tl.block_size[open_idx],
                           tl.block_size[orphan], base])
    site = np.concatenate([tl.site[alloc_idx], tl.site[open_idx],
                           np.full(len(orphan) + len(base), NO_SITE, np.int32)])
    cell = np.concatenate([tl.cell[alloc_idx], tl.cell[open_idx],
                           np.full(len(orphan) + len(base), NO_CELL, np.int32)])
    addr = np.concatenate([tl.addr[alloc_idx], tl.addr[open_idx], tl.addr[orphan],
                           np.zeros(len(base), np.int64)])
    requested = np.concatenate([tl.size[alloc_idx], tl.size[open_idx], tl.size[orphan], base])
    stack = np.concatenate([tl.stack[alloc_idx], tl.stack[open_idx],
                            np.full(len(orphan) + len(base), NO_SITE, np.int32)])
    return Intervals(start=start.astype(np.int64), end=end.astype(np.int64), size=size,
                     site=site.astype(np.int32), cell=cell.astype(np.int32), addr=addr,
                     requested=requested, stack=stack.astype(np.int32),
                     seen=np.arange(len(start)) < len(alloc_idx) + len(open_idx))


def peak_index(tl: Timeline) -> int:
    """The first event after which allocated bytes were highest (-1 for an empty trace)."""
    return int(np.argmax(tl.allocated)) if len(tl) else -1


def cell_boundaries(tl: Timeline) -> list[tuple[int, int]]:
    """``(event index, cell)`` for the first event of every run of events of one cell."""
    if not len(tl):
        return []
    c = tl.cell
    starts = np.flatnonzero(np.concatenate([[True], c[1:] != c[:-1]]))
    return [(int(i), int(c[i])) for i in starts if c[i] != NO_CELL]


def oom_indices(tl: Timeline) -> IntArray:
    """Indices of the ``oom`` events."""
    return np.flatnonzero(tl.action == OOM).astype(np.int64)


def downsample(y: IntArray, max_points: int = 2000) -> IntArray:
    """Indices into ``y`` to draw it with at most ~``max_points`` points, keeping every bucket's
    minimum and maximum (so the peak and the dips survive), plus the first and last point."""
    n = len(y)
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    buckets = max(1, max_points // 2)
    width = -(-n // buckets)
    padded = np.empty(buckets * width, y.dtype)
    padded[:n] = y
    padded[n:] = y[-1]
    rows = padded.reshape(buckets, width)
    base = np.arange(buckets, dtype=np.int64) * width
    picks = np.concatenate([base + rows.argmin(axis=1), base + rows.argmax(axis=1), [0, n - 1]])
    return np.unique(np.minimum(picks, n - 1))


def band_values(iv: Intervals, groups: npt.NDArray[np.int32], n_groups: int, n: int,
                at: IntArray) -> IntArray:
    """Bytes live in each group after the events ``at``: an array of shape (n_groups, len(at)).

    ``groups[k]`` is the group (0..n_groups-1) of interval ``k``."""
    out = np.zeros((n_groups, len(at)), np.int64)
    for g in range(n_groups):
        mask = groups == g
        sizes = iv.size[mask].astype(np.float64)  # exact below 2**53 bytes
        diff = (np.bincount(iv.start[mask], sizes, n + 1)
                - np.bincount(iv.end[mask], sizes, n + 1))
        out[g] = np.cumsum(diff.astype(np.int64))[at]
    return out


def live_at(iv: Intervals, index: int) -> npt.NDArray[np.bool_]:
    """Which intervals are live after event ``index``."""
    return (iv.start <= index) & (iv.end > index)


def top_sites(tl: Timeline, iv: Intervals, index: int | None = None,
              top: int = 10) -> list[tuple[str, int, int]]:
    """``(site, bytes, count)`` of the allocations live after event ``index`` (default: the
    peak), largest first."""
    if index is None:
        index = peak_index(tl)
    if index < 0:
        return []
    live = live_at(iv, index)
    sites = iv.site[live]
    sizes = iv.size[live]
    uniq, inverse = np.unique(sites, return_inverse=True)
    total = np.bincount(inverse, weights=sizes, minlength=len(uniq))
    count = np.bincount(inverse, minlength=len(uniq))
    order = np.argsort(-total, kind="stable")[:top]
    return [(tl.site_label(int(uniq[k])), int(total[k]), int(count[k])) for k in order]


@dataclass(frozen=True, eq=False)
class SegmentLives:
    """Segment ``k`` exists after events ``start[k] .. end[k]-1``; -1 = before the trace."""

    start: IntArray
    end: IntArray
    addr: IntArray
    size: IntArray
    stream: IntArray
    small: npt.NDArray[np.bool_]  # small pool (a 2 MiB segment)

    def __len__(self) -> int:
        return len(self.start)


SMALL_SEGMENT = 2 << 20


def segment_lives(tl: Timeline, segments: Sequence[SegmentInfo]) -> SegmentLives:
    """Every segment's life: from the trace's segment events, plus the snapshot's segments
    (the state at the end of the trace) for those older than the trace."""
    n = len(tl)
    is_alloc = tl.action == SEGMENT_ALLOC
    is_free = tl.action == SEGMENT_FREE
    alloc_idx, free_idx, orphan = _pairs(tl.addr, is_alloc, is_free)
    freed = np.zeros(n, bool)
    freed[alloc_idx] = True
    open_idx = np.flatnonzero(is_alloc & ~freed)
    opened = set(tl.addr[open_idx].tolist())
    old = [s for s in segments if s["address"] not in opened]
    idx = np.concatenate([alloc_idx, open_idx, orphan]).astype(np.int64)
    start = np.concatenate([alloc_idx, open_idx, np.full(len(orphan) + len(old), -1)])
    end = np.concatenate([free_idx, np.full(len(open_idx), n), orphan, np.full(len(old), n)])
    addr = np.concatenate([tl.addr[idx], np.array([s["address"] for s in old], np.int64)])
    size = np.concatenate([tl.size[idx], np.array([s["total_size"] for s in old], np.int64)])
    streams = np.concatenate([tl.stream[idx], np.array([s["stream"] for s in old], np.int64)])
    small = np.concatenate([tl.size[idx] == SMALL_SEGMENT,
                            np.array([s["segment_type"] == "small" for s in old], bool)])
    return SegmentLives(start=start.astype(np.int64), end=end.astype(np.int64), addr=addr,
                        size=size, stream=streams, small=small)
