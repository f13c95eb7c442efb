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
- Blocks allocated before the trace and live through it are known from the snapshot's segments
  (``Timeline.old``), with the sites of their own frames.
- One device at a time: ``build_timeline`` picks it with ``devices.snapshot_device``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_SITE,
    NO_SITE_LABEL,
    NO_STACK,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from jupyter_gpumem.data.columns import TraceColumns, as_columns
from jupyter_gpumem.data.devices import device_segments, device_trace, snapshot_device
from jupyter_gpumem.data.holders import FREED, HOLDER_BANDS, HOLDER_ROLES, NO_HOLDER, holder_role
from jupyter_gpumem.data.ids import distinct
from jupyter_gpumem.data.mapped import mapped_lives
from jupyter_gpumem.data.sites import saved_cell_files, site_of
from jupyter_gpumem.data.sizes import SMALL_BUFFER, round_size

if TYPE_CHECKING:
    from collections.abc import Mapping

    from jupyter_gpumem.data.schema import BlockInfo, Frame, SegmentInfo, Snapshot, TraceEntry

IntArray = npt.NDArray[np.int64]


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
    stack: npt.NDArray[np.int32]  # id into ``stacks`` of the allocating stack; NO_STACK if none
    stacks: list[list[Frame]]  # every distinct stack, innermost frame first
    start_allocated: int  # allocated bytes before the first event
    start_reserved: int  # reserved bytes before the first event
    old: OldBlocks  # the blocks allocated before the trace that outlive it
    #: what is worked out once and read by several views (``live_intervals``): never compared
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.action)

    @property
    def index(self) -> IntArray:
        """The event index, 0..n-1."""
        return np.arange(len(self.action), dtype=np.int64)

    def site_label(self, site_id: int) -> str:
        return self.sites[site_id] if site_id >= 0 else NO_SITE_LABEL


@dataclass(frozen=True, eq=False)
class OldBlocks:
    """Blocks of the end state that no event of the trace touches: allocated before the trace
    began and live through it. Known only from a snapshot's segments."""

    addr: IntArray
    size: IntArray
    requested: IntArray  # bytes the user asked for (the block size if unknown)
    stack: npt.NDArray[np.int32]  # id into the timeline's ``stacks``; NO_STACK if none
    site: npt.NDArray[np.int32]  # id into the timeline's ``sites``; NO_SITE if none

    def __len__(self) -> int:
        return len(self.addr)


def build_timeline(snapshot: Snapshot, device: int | None = None, *,
                   cell_files: Mapping[str, int] | None = None) -> Timeline:
    """The timeline of ``snapshot``'s trace for ``device`` (default: ``snapshot_device``).

    ``cell_files`` (a cell's source file name -> its number) names sites ``cell [N] line L``,
    with the cells the snapshot was saved with (``saved_cell_files``)."""
    device = snapshot_device(snapshot, device)
    segments = device_segments(snapshot, device)
    live = [b for seg in segments for b in seg["blocks"] if b["state"] == "active_allocated"]
    return trace_columns(device_trace(snapshot, device),
                         end_allocated=sum(b["size"] for b in live),
                         end_reserved=sum(seg["total_size"] for seg in segments),
                         end_blocks=live, cell_files=saved_cell_files(snapshot, cell_files))


def trace_columns(trace: Sequence[TraceEntry] | TraceColumns, *, end_allocated: int | None = None,
                  end_reserved: int | None = None, end_blocks: Sequence[BlockInfo] = (),
                  cell_files: Mapping[str, int] | None = None) -> Timeline:
    """Columns of ``trace``. With the end state given, the start state is worked back from it;
    without it the trace is taken to start from nothing (or from the least that keeps every
    column non-negative). ``end_blocks`` are the allocated blocks at the end: those the trace
    never allocates become ``old``."""
    cols = as_columns(trace)
    action = cols.column("action").astype(np.int8)
    addr = cols.column("addr")
    size = cols.column("size")
    time_us = cols.column("time_us")
    stream = cols.column("stream")
    cell = cols.column("cell")
    # an alloc's or free's block bytes (Note [Columns of a trace]); other actions' are zeroed
    block_size = np.where((action == ALLOC) | (action == FREE_REQUESTED)
                          | (action == FREE_COMPLETED), cols.column("extra"), 0)

    is_alloc = action == ALLOC
    free_code = FREE_REQUESTED if np.any(action == FREE_REQUESTED) else FREE_COMPLETED
    is_free = action == free_code
    blockish = is_alloc | is_free
    # A PyTorch trace has no block size: assume the default rounding (few distinct sizes).
    missing = blockish & (block_size == 0)
    if missing.any():
        uniq, inverse = np.unique(size[missing], return_inverse=True)
        block_size[missing] = np.array([round_size(int(v)) for v in uniq], np.int64)[inverse]
    block_size[~blockish & (action != FREE_COMPLETED) & (action != FREE_REQUESTED)] = 0

    d_alloc = np.where(is_alloc, block_size, 0) - np.where(is_free, block_size, 0)
    # Expandable segments map and unmap pages: they change reserved bytes as segments do.
    grows = (action == SEGMENT_ALLOC) | (action == SEGMENT_MAP)
    shrinks = (action == SEGMENT_FREE) | (action == SEGMENT_UNMAP)
    d_res = np.where(grows, size, 0) - np.where(shrinks, size, 0)
    allocated = np.cumsum(d_alloc)
    reserved = np.cumsum(d_res)
    start_a = _start_value(allocated, end_allocated)
    start_r = _start_value(reserved, end_reserved)
    allocated += start_a
    reserved += start_r

    stacks = _StackTable()
    stack = stacks.events(cols, action)
    pairs = _pairs(addr, is_alloc, is_free)
    alloc_idx, free_idx, _ = pairs
    stack[free_idx] = stack[alloc_idx]  # a free belongs to the stack that allocated the block
    in_trace = np.isin(np.array([b["address"] for b in end_blocks], np.int64), addr[is_alloc])
    old_blocks = [b for b, seen in zip(end_blocks, in_trace.tolist(), strict=True) if not seen]
    old_stack = np.array([stacks.intern(b["frames"]) if b["frames"] else NO_STACK
                          for b in old_blocks], np.int32)
    site_of_stack, sites = _sites_of_stacks(stacks.stacks, cell_files)
    site = site_of_stack[stack]  # NO_STACK (-1) picks the last entry, NO_SITE
    old = OldBlocks(addr=np.array([b["address"] for b in old_blocks], np.int64),
                    size=np.array([b["size"] for b in old_blocks], np.int64),
                    requested=np.array([b["requested_size"] or b["size"] for b in old_blocks],
                                       np.int64),
                    stack=old_stack, site=site_of_stack[old_stack])
    return Timeline(time_us=time_us, action=action, addr=addr, stream=stream, size=size,
                    block_size=block_size,
                    allocated=allocated, reserved=reserved, site=site, cell=cell, sites=sites,
                    stack=stack, stacks=stacks.stacks, start_allocated=start_a,
                    start_reserved=start_r, old=old, memo={"pairs": pairs})


def _start_value(cum: IntArray, end: int | None) -> int:
    floor = max(0, -int(cum.min())) if len(cum) else 0
    if end is None:
        return floor
    total = int(cum[-1]) if len(cum) else 0
    return max(end - total, floor)


class _StackTable:
    """Interns stacks: every distinct stack once, found by content."""

    def __init__(self) -> None:
        self.stacks: list[list[Frame]] = []
        self._ids: dict[tuple[tuple[str, int, str], ...], int] = {}
        self._by_list: dict[int, int] = {}  # id(frames) -> stack id: snapshots share lists

    def intern(self, frames: list[Frame]) -> int:
        sid = self._by_list.get(id(frames))
        if sid is None:
            key = tuple(map(_FRAME_KEY, frames))
            sid = self._ids.get(key)
            if sid is None:
                sid = self._ids[key] = len(self.stacks)
                self.stacks.append(frames)
            self._by_list[id(frames)] = sid
        return sid

    def events(self, trace: TraceColumns, action: npt.NDArray[np.int8]
               ) -> npt.NDArray[np.int32]:
        """Stack ids of alloc and oom events (others get NO_STACK), interned once per distinct
        stack of the trace, in the order of their first event (an event without frames gets
        the empty stack, as its empty frames list would)."""
        stack = np.full(len(trace), NO_STACK, np.int32)
        picks = np.flatnonzero((action == ALLOC) | (action == OOM))
        ids = trace.column("stack")[picks]
        distinct_ids, first, inverse = distinct(ids)
        ours = np.empty(len(distinct_ids), np.int32)
        empty: list[Frame] = []
        for k in np.argsort(first, kind="stable").tolist():
            sid = int(distinct_ids[k])
            ours[k] = self.intern(trace.stacks[sid] if 0 <= sid < len(trace.stacks) else empty)
        stack[picks] = ours[inverse.reshape(-1)]
        return stack


_FRAME_KEY = itemgetter("filename", "line", "name")


def _sites_of_stacks(stacks: Sequence[Sequence[Frame]], cell_files: Mapping[str, int] | None
                     ) -> tuple[npt.NDArray[np.int32], list[str]]:
    """The site id of every stack (NO_SITE if it has no user frame), and the site names."""
    ids: dict[str, int] = {}
    of_stack = np.full(len(stacks) + 1, NO_SITE, np.int32)  # the last entry maps NO_STACK
    for k, frames in enumerate(stacks):
        site = site_of(frames, cell_files, full=True)
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
    Blocks older than the trace that outlive it are the timeline's ``old`` blocks, with their
    own sites; any bytes older than the trace not accounted for so (a trace built without the
    end state) are one more entry with site NO_SITE and address 0."""

    start: IntArray
    end: IntArray
    size: IntArray
    site: npt.NDArray[np.int32]
    cell: npt.NDArray[np.int32]  # cell of the allocating event (NO_CELL if unknown)
    addr: IntArray  # block address (0 for the unseen remainder)
    requested: IntArray  # bytes the user asked for (the block size if unknown)
    stack: npt.NDArray[np.int32]  # id into the timeline's ``stacks`` (NO_STACK if unknown)
    seen: npt.NDArray[np.bool_]  # whether the allocation itself is in the trace

    def __len__(self) -> int:
        return len(self.start)


def live_intervals(tl: Timeline) -> Intervals:
    """Every allocation's life, for stacked bands and per-site totals (worked out once a
    timeline: the arrays are shared, never to be changed)."""
    found: Intervals | None = tl.memo.get("intervals")
    if found is None:
        found = tl.memo["intervals"] = _intervals(tl)
    return found


def _intervals(tl: Timeline) -> Intervals:
    n = len(tl)
    pairs = tl.memo.get("pairs")
    if pairs is None:
        is_alloc = tl.action == ALLOC
        free_code = FREE_REQUESTED if np.any(tl.action == FREE_REQUESTED) else FREE_COMPLETED
        pairs = _pairs(tl.addr, is_alloc, tl.action == free_code)
    alloc_idx, free_idx, orphan = pairs
    is_alloc = tl.action == ALLOC
    freed = np.zeros(n, bool)
    freed[alloc_idx] = True
    open_idx = np.flatnonzero(is_alloc & ~freed)
    old = tl.old
    unseen = tl.start_allocated - int(tl.block_size[orphan].sum()) - int(old.size.sum())
    base = np.array([unseen], np.int64) if unseen > 0 else np.zeros(0, np.int64)
    k = len(orphan) + len(old) + len(base)  # the allocations older than the trace
    start = np.concatenate([alloc_idx, open_idx, np.zeros(k, np.int64)])
    end = np.concatenate([free_idx, np.full(len(open_idx), n, np.int64), orphan,
                          np.full(len(old) + len(base), n, np.int64)])
    size = np.concatenate([tl.block_size[alloc_idx], tl.block_size[open_idx],
                           tl.block_size[orphan], old.size, base])
    site = np.concatenate([tl.site[alloc_idx], tl.site[open_idx],
                           np.full(len(orphan), NO_SITE, np.int32), old.site,
                           np.full(len(base), NO_SITE, np.int32)])
    cell = np.concatenate([tl.cell[alloc_idx], tl.cell[open_idx], np.full(k, NO_CELL, np.int32)])
    addr = np.concatenate([tl.addr[alloc_idx], tl.addr[open_idx], tl.addr[orphan], old.addr,
                           np.zeros(len(base), np.int64)])
    requested = np.concatenate([tl.size[alloc_idx], tl.size[open_idx], tl.size[orphan],
                                old.requested, base])
    stack = np.concatenate([tl.stack[alloc_idx], tl.stack[open_idx],
                            np.full(len(orphan), NO_STACK, np.int32), old.stack,
                            np.full(len(base), NO_STACK, np.int32)])
    return Intervals(start=start.astype(np.int64), end=end.astype(np.int64),
                     size=size.astype(np.int64), site=site.astype(np.int32),
                     cell=cell.astype(np.int32), addr=addr.astype(np.int64),
                     requested=requested.astype(np.int64), stack=stack.astype(np.int32),
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


def holder_band_groups(iv: Intervals, n: int, held: Mapping[int, Sequence[str]]
                       ) -> npt.NDArray[np.int32]:
    """The band by holder (an index into ``holders.HOLDER_BANDS``) of every interval of a
    trace of ``n`` events: ``FREED`` if it ends in the trace, else the first role in
    ``HOLDER_ROLES`` of its block's holders (``held``: address -> names), else ``NO_HOLDER``."""
    groups = np.full(len(iv), HOLDER_BANDS.index(NO_HOLDER), np.int32)
    alive = iv.end >= n
    groups[~alive] = HOLDER_BANDS.index(FREED)
    for k in np.flatnonzero(alive & (iv.addr != 0)):
        names = held.get(int(iv.addr[k]))
        if names:
            groups[k] = min(HOLDER_ROLES.index(holder_role(name)) for name in names)
    return groups


def live_at(iv: Intervals, index: int) -> npt.NDArray[np.bool_]:
    """Which intervals are live after event ``index`` (-1: before the first event)."""
    if index < 0:
        return ~iv.seen
    return (iv.start <= index) & (iv.end > index)


@dataclass(frozen=True, eq=False)
class SegmentLives:
    """Segment ``k`` exists after events ``start[k] .. end[k]-1``; -1 = before the trace.

    A segment of an expandable segment is one contiguous mapped range of it, as a snapshot
    has them (``data.mapped``); ``group`` says which expandable segment (one row of the
    layout), -1 for a classic segment."""

    start: IntArray
    end: IntArray
    addr: IntArray
    size: IntArray
    stream: IntArray
    small: npt.NDArray[np.bool_]  # small pool
    expandable: npt.NDArray[np.bool_]
    group: npt.NDArray[np.int32]

    def __len__(self) -> int:
        return len(self.start)


def segment_lives(tl: Timeline, segments: Sequence[SegmentInfo],
                  trace: Sequence[TraceEntry] = ()) -> SegmentLives:
    """Every segment's life: from the trace's segment events, plus the snapshot's segments
    (the state at the end of the trace) for those older than the trace. The mapped ranges of
    expandable segments come from ``trace`` (the trace ``tl`` was built from) and the
    snapshot's expandable segments."""
    n = len(tl)
    classic = segments
    if any(s.get("is_expandable") for s in segments) or np.any(tl.action == SEGMENT_MAP):
        classic = [s for s in segments if not s.get("is_expandable")]
        ml = mapped_lives(trace, segments)
    else:
        ml = []
    is_alloc = tl.action == SEGMENT_ALLOC
    is_free = tl.action == SEGMENT_FREE
    alloc_idx, free_idx, orphan = _pairs(tl.addr, is_alloc, is_free)
    freed = np.zeros(n, bool)
    freed[alloc_idx] = True
    open_idx = np.flatnonzero(is_alloc & ~freed)
    opened = set(tl.addr[open_idx].tolist())
    old = [s for s in classic if s["address"] not in opened]
    idx = np.concatenate([alloc_idx, open_idx, orphan]).astype(np.int64)
    start = np.concatenate([alloc_idx, open_idx, np.full(len(orphan) + len(old), -1)])
    end = np.concatenate([free_idx, np.full(len(open_idx), n), orphan, np.full(len(old), n)])
    addr = np.concatenate([tl.addr[idx], np.array([s["address"] for s in old], np.int64)])
    size = np.concatenate([tl.size[idx], np.array([s["total_size"] for s in old], np.int64)])
    streams = np.concatenate([tl.stream[idx], np.array([s["stream"] for s in old], np.int64)])
    small = np.concatenate([tl.size[idx] == SMALL_BUFFER,
                            np.array([s["segment_type"] == "small" for s in old], bool)])
    k = len(start)

    def col(values: list[int], dtype: type) -> npt.NDArray[Any]:
        return np.array(values, dtype)

    return SegmentLives(
        start=np.concatenate([start, col([m.start for m in ml], np.int64)]).astype(np.int64),
        end=np.concatenate([end, col([m.end for m in ml], np.int64)]).astype(np.int64),
        addr=np.concatenate([addr, col([m.addr for m in ml], np.int64)]),
        size=np.concatenate([size, col([m.size for m in ml], np.int64)]),
        stream=np.concatenate([streams, col([m.stream for m in ml], np.int64)]),
        small=np.concatenate([small, col([m.small for m in ml], bool)]),
        expandable=np.arange(k + len(ml)) >= k,
        group=np.concatenate([np.full(k, -1, np.int32), col([m.group for m in ml], np.int32)]))
