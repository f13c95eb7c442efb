"""A trace as numpy columns: allocated and reserved bytes after every event, sites, cells.

Everything is vectorised over the trace's columns (``data.columns``): no pass over the events in
Python, and one sort (matching each free with its allocation, ``data.pairs``), so ten million
events take a fraction of a second. Conventions:

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
- What only some readers want event by event (each event's block size, stack and site) is
  worked out on first use; the lives of the blocks are ``data.intervals``.
- A long trace's independent passes (allocated bytes, the pairs, the stacks, the segment
  events) run at once on threads (``data.together``).
"""

from __future__ import annotations

import functools
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
from jupyter_gpumem.data.mapped import mapped_lives
from jupyter_gpumem.data.pairs import Matched, allocated_at, from_partners
from jupyter_gpumem.data.sites import saved_cell_files, site_of
from jupyter_gpumem.data.sizes import SMALL_BUFFER, round_size
from jupyter_gpumem.data.together import together

if TYPE_CHECKING:
    from collections.abc import Mapping

    from jupyter_gpumem.data.schema import BlockInfo, Frame, SegmentInfo, Snapshot, TraceEntry

IntArray = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]


@dataclass(frozen=True, eq=False)
class Timeline:
    """The columns of one device's trace. Every array has one entry per event."""

    time_us: IntArray  # microseconds on the allocator's clock
    action: npt.NDArray[np.int8]  # action code, an index into ACTIONS
    addr: IntArray  # block or segment address
    stream: IntArray  # stream of the block or segment
    size: IntArray  # requested bytes (alloc/free) or segment bytes
    allocated: IntArray  # allocated bytes after the event
    reserved_events: IntArray  # the events that change reserved bytes (segment events)
    reserved_levels: IntArray  # reserved bytes before the first of them, then after each
    cell: npt.NDArray[np.int32]  # notebook cell of the event; NO_CELL outside cells
    sites: list[str]  # "file:line" of every site id
    stacks: list[list[Frame]]  # every distinct stack, innermost frame first
    start_allocated: int  # allocated bytes before the first event
    start_reserved: int  # reserved bytes before the first event
    old: OldBlocks  # the blocks allocated before the trace that outlive it
    matched: Matched  # every allocation with its free (``data.pairs``)
    alloc_stack: Int32Array  # id into ``stacks`` of each allocation's stack (``matched.alloc``)
    site_of_stack: Int32Array  # the site id of each stack id; its last entry is NO_STACK's
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

    @functools.cached_property
    def reserved(self) -> IntArray:
        """Reserved bytes after every event (segment events are few: ``reserved_events`` and
        ``reserved_levels`` hold the same in a few numbers)."""
        runs = np.diff(self.reserved_events, prepend=0, append=len(self))
        return np.repeat(self.reserved_levels, runs)

    def reserved_after(self, events: IntArray) -> IntArray:
        """Reserved bytes after each of ``events``."""
        return self.reserved_levels[np.searchsorted(self.reserved_events, events, "right")]

    @property
    def reserved_max(self) -> int:
        """``reserved.max()`` without the array (the bytes before the trace if it is empty)."""
        if not len(self):
            return self.start_reserved
        runs = np.diff(self.reserved_events, prepend=0, append=len(self))
        return int(self.reserved_levels[runs > 0].max())

    @functools.cached_property
    def block_size(self) -> IntArray:
        """Rounded bytes of the block of each alloc and free event, else 0."""
        found: IntArray | None = self.memo.get("block_size")
        if found is None:
            a = self.action
            found = np.where((a == ALLOC) | (a == FREE_REQUESTED) | (a == FREE_COMPLETED),
                             self.memo["extra"], 0)
        return found

    @functools.cached_property
    def stack(self) -> Int32Array:
        """Id into ``stacks`` of each event's allocating stack: an alloc's or oom's own, a
        free's that of the allocation it frees; NO_STACK for any other event."""
        m = self.matched
        out = np.full(len(self), NO_STACK, np.int32)
        out[m.alloc] = self.alloc_stack
        oom, oom_stack = self.memo["oom_stack"]
        out[oom] = oom_stack
        freed = m.freed
        out[m.end[freed]] = self.alloc_stack[freed]
        return out

    @functools.cached_property
    def site(self) -> Int32Array:
        """Id into ``sites`` of each event's allocating line (as ``stack``); NO_SITE if
        unknown."""
        return self.site_of_stack[self.stack]  # NO_STACK (-1) picks the last entry, NO_SITE


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
    action = cols.column("action").view(np.int8)
    addr = cols.column("addr")
    size = cols.column("size")
    extra = cols.column("extra")
    memo: dict[str, Any] = {"extra": extra}

    is_alloc = action == ALLOC
    is_free = action == FREE_REQUESTED
    if is_free.any():
        memo["requested"] = is_free  # (the block lives read it)
    else:  # a trace of completions only
        is_free = action == FREE_COMPLETED
    alloc = np.flatnonzero(is_alloc)
    rare = _rare_events(action)
    stacks = _StackTable()

    def allocated_bytes() -> tuple[IntArray, int]:
        # +block bytes at an alloc, - at a free, summed (Note [Columns of a trace]: ``extra``
        # holds an alloc's or free's block bytes)
        sign = is_alloc.view(np.int8) - is_free.view(np.int8)
        delta = sign * extra
        if np.count_nonzero(delta) != np.count_nonzero(sign):  # some block size not recorded
            block_size = memo["block_size"] = _block_sizes(action, size, extra,
                                                           is_alloc | is_free)
            delta = np.where(is_alloc, block_size, 0) - np.where(is_free, block_size, 0)
        del sign
        allocated = np.cumsum(delta, out=delta)
        start = _start_value(allocated, end_allocated)
        if start:
            allocated += start
        return allocated, start

    def partners() -> Matched:
        memo["paired"] = cols.paired()
        return from_partners(memo["paired"], alloc, is_free)  # (Note [Paired events])

    def stack_ids() -> Int32Array:
        alloc_stack, memo["oom_stack"], memo["alloc_stacks"] = _alloc_and_oom_stacks(
            stacks, cols, alloc, rare[action.take(rare) == OOM])
        return alloc_stack

    def segments() -> tuple[IntArray, IntArray]:
        memo["same_next"] = addr[:-1] == addr[1:]  # (the completions of frees read it)
        return _reserved(action, size, end_reserved, rare)

    (allocated, start_a), matched, alloc_stack, (reserved_events, reserved_levels) = together(
        len(action), allocated_bytes, partners, stack_ids, segments)
    end_addr = np.array([b["address"] for b in end_blocks], np.int64)
    old_blocks = [b for b, seen in zip(end_blocks, allocated_at(addr, matched, end_addr).tolist(),
                                       strict=True) if not seen]
    old_stack = np.array([stacks.intern(b["frames"]) if b["frames"] else NO_STACK
                          for b in old_blocks], np.int32)
    site_of_stack, sites = _sites_of_stacks(stacks.stacks, cell_files)
    old = OldBlocks(addr=np.array([b["address"] for b in old_blocks], np.int64),
                    size=np.array([b["size"] for b in old_blocks], np.int64),
                    requested=np.array([b["requested_size"] or b["size"] for b in old_blocks],
                                       np.int64),
                    stack=old_stack, site=site_of_stack[old_stack])
    return Timeline(time_us=cols.column("time_us"), action=action, addr=addr,
                    stream=cols.column("stream"), size=size, allocated=allocated,
                    reserved_events=reserved_events, reserved_levels=reserved_levels,
                    cell=cols.column("cell"), sites=sites, stacks=stacks.stacks,
                    start_allocated=start_a, start_reserved=int(reserved_levels[0]),
                    old=old, matched=matched, alloc_stack=alloc_stack,
                    site_of_stack=site_of_stack, memo=memo)


def _alloc_and_oom_stacks(stacks: _StackTable, cols: TraceColumns, alloc: IntArray,
                          oom: IntArray) -> tuple[Int32Array, tuple[IntArray, Int32Array],
                                                  IntArray]:
    """The stack ids of the allocations and of the ooms, interned in the order of their events
    together, and the distinct ids of the allocations' stacks."""
    if not len(oom):
        ids, present = stacks.events(cols, alloc)
        return ids, (oom, np.zeros(0, np.int32)), present
    before = np.searchsorted(alloc, oom)
    at = before + np.arange(len(oom))  # where the ooms are among both
    ids, present = stacks.events(cols, np.insert(alloc, before, oom))
    is_oom = np.zeros(len(ids), bool)
    is_oom[at] = True
    alloc_ids, oom_ids = ids[~is_oom], ids[at]
    # a stack only ooms have is no allocation's (ooms are few: look among the allocations)
    gone = [sid for sid in np.unique(oom_ids).tolist() if not np.any(alloc_ids == sid)]
    return alloc_ids, (oom, oom_ids), np.setdiff1d(present, gone)


def _block_sizes(action: npt.NDArray[np.int8], size: IntArray, extra: IntArray,
                 blockish: npt.NDArray[np.bool_]) -> IntArray:
    """Each alloc's and free's block bytes where a trace leaves some out (PyTorch's has none):
    the default rounding of the requested bytes (few distinct sizes)."""
    block_size = np.where((action == ALLOC) | (action == FREE_REQUESTED)
                          | (action == FREE_COMPLETED), extra, 0)
    missing = blockish & (block_size == 0)
    uniq, inverse = np.unique(size[missing], return_inverse=True)
    block_size[missing] = np.array([round_size(int(v)) for v in uniq], np.int64)[inverse]
    return block_size


def _rare_events(action: npt.NDArray[np.int8]) -> IntArray:
    """The events that are neither allocations nor frees (segments, ooms, snapshots: few), in
    one comparison: their codes are ``SEGMENT_ALLOC`` to ``SEGMENT_UNMAP``."""
    shifted = np.subtract(action, SEGMENT_ALLOC, dtype=np.int8).view(np.uint8)
    rare = np.less_equal(shifted, SEGMENT_UNMAP - SEGMENT_ALLOC, out=shifted.view(np.bool_))
    return np.flatnonzero(rare)


def _reserved(action: npt.NDArray[np.int8], size: IntArray, end: int | None,
              rare: IntArray) -> tuple[IntArray, IntArray]:
    """The segment events (they change reserved bytes; among the ``rare`` events), and the
    reserved bytes before the first of them then after each."""
    a = action.take(rare)
    grows = (a == SEGMENT_ALLOC) | (a == SEGMENT_MAP)  # expandable segments map and unmap
    changes = grows | (a == SEGMENT_FREE) | (a == SEGMENT_UNMAP)  # pages: as segments
    seg = rare[changes]
    seg_size = size.take(seg)
    levels = np.cumsum(np.where(grows[changes], seg_size, -seg_size))
    start = _start_value(levels, end)
    return seg, np.concatenate([[0], levels]).astype(np.int64) + start


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

    def events(self, trace: TraceColumns, picks: IntArray) -> tuple[Int32Array, IntArray]:
        """Stack ids of the events ``picks`` (increasing), interned once per distinct stack of
        the trace, in the order of their first event (an event without frames gets the empty
        stack, as its empty frames list would); and the distinct ids."""
        count = len(trace.stacks)
        ids = trace.column("stack")[picks]
        if len(ids) and (int(ids.min()) < -1 or int(ids.max()) >= count):
            ids = np.where((ids >= 0) & (ids < count), ids, -1).astype(np.int32)
        ids = ids + 1  # 0: no stack; k + 1: the trace's stack k
        ours = np.zeros(count + 1, np.int32)
        empty: list[Frame] = []
        firsts = _by_first_event(ids, count + 1).tolist()
        for sid in firsts:
            ours[sid] = self.intern(trace.stacks[sid - 1] if sid else empty)
        found: Int32Array = ours[ids]
        return found, np.unique(ours[firsts]).astype(np.int64)


def _by_first_event(ids: npt.NDArray[np.int32], span: int) -> npt.NDArray[np.int64]:
    """The distinct values of ``ids`` (in ``[0, span)``) in the order they first appear. Most
    appear early: a prefix that holds them all is found by growing it, and ordered alone."""
    present = np.bincount(ids, minlength=span) > 0
    total = int(present.sum())
    k = 1024
    while k < len(ids) and np.count_nonzero(np.bincount(ids[:k], minlength=span)) < total:
        k *= 8
    uniq, first = np.unique(ids[:k], return_index=True)
    return uniq[np.argsort(first, kind="stable")].astype(np.int64)


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


def peak_index(tl: Timeline) -> int:
    """The first event after which allocated bytes were highest (-1 for an empty trace)."""
    found: int | None = tl.memo.get("peak")
    if found is None:
        found = tl.memo["peak"] = int(np.argmax(tl.allocated)) if len(tl) else -1
    return found


def peak_allocated(tl: Timeline) -> int:
    """The most allocated bytes after any event (before the first for an empty trace)."""
    return int(tl.allocated[peak_index(tl)]) if len(tl) else tl.start_allocated


def cell_boundaries(tl: Timeline) -> list[tuple[int, int]]:
    """``(event index, cell)`` for the first event of every run of events of one cell."""
    if not len(tl):
        return []
    c = tl.cell
    starts = np.flatnonzero(np.concatenate([[True], c[1:] != c[:-1]]))
    return [(int(i), int(c[i])) for i in starts if c[i] != NO_CELL]


def oom_indices(tl: Timeline) -> IntArray:
    """Indices of the ``oom`` events."""
    known = tl.memo.get("oom_stack")  # (found with the stacks)
    return np.asarray(known[0] if known is not None else np.flatnonzero(tl.action == OOM),
                      np.int64)


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
    ev = tl.reserved_events  # the segment events, and their partners (Note [Paired events])
    kinds = tl.action.take(ev)
    partner = tl.memo["paired"].take(ev)
    alloc = ev[kinds == SEGMENT_ALLOC]
    end = partner[kinds == SEGMENT_ALLOC]
    np.copyto(end, n, where=end < 0)
    m = Matched(n=n, alloc=alloc, end=end, orphan=ev[(kinds == SEGMENT_FREE) & (partner < 0)],
                at_once=(end == alloc + 1) & (end < n))
    opened = set(tl.addr[m.alloc[~m.freed]].tolist())
    old = [s for s in classic if s["address"] not in opened]
    idx = np.concatenate([m.alloc, m.orphan]).astype(np.int64)
    start = np.concatenate([m.alloc, np.full(len(m.orphan) + len(old), -1)])
    end = np.concatenate([m.end, m.orphan, np.full(len(old), n)])
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
