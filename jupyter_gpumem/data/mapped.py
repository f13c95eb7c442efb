"""The mapped ranges of expandable segments, at any point of a trace. Pure functions of the data.

An expandable segment (Note [Expandable segments] in ``engine.expandable``) reserves a virtual
range and maps pages into it; the trace records each ``segment_map`` and ``segment_unmap``
(address, bytes). A snapshot reports each contiguous *mapped* range as one segment with
``is_expandable`` true; unmapped ranges do not appear. Here:

- ``MappedRanges``: the mapped ranges of one moment, kept as the snapshot has them (maximal
  contiguous ranges), changed by a map or an unmap; walking a trace backwards undoes them.
- Which pool a range is in: our trace entries say it (``segment_type`` on a map or unmap,
  ``event_pool``); PyTorch's do not. Without it, a map is exact by its size
  (``pool_of_map``: a large-pool map is whole 20 MiB pages, a small-pool one maps one 2 MiB
  page, what a request of at most 1 MiB lacks). A range older than the trace (an unmap undone)
  is in the pool of a block seen in it (blocks of at most 1 MiB are the small pool's), else of
  the range it touches, else small if it is not whole 20 MiB pages, else the pool of the
  nearest range on its stream (a guess).
- ``row_groups``: which ranges belong to one segment and so draw as one row. A segment is
  per (stream, pool); a segment whose pages are all unmapped is released (the Note), so a later
  map on that stream and pool starts a new segment: a new group.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_gpumem.data.sizes import LARGE_BUFFER, MAX_VIRTUAL_RANGE, SMALL_BUFFER, SMALL_SIZE

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, SegmentInfo, TraceEntry

__all__ = ["LayoutRow", "MappedLife", "MappedRange", "MappedRanges", "event_pool", "layout_rows",
           "mapped_lives", "pool_of_map", "virtual_range"]


def virtual_range(total: int, small: bool) -> int:
    """Virtual bytes an expandable segment reserves on a device of ``total`` bytes: total plus
    an eighth, at most ``MAX_VIRTUAL_RANGE``, in whole pages
    (``engine.expandable.address_space_size``, which the engine uses; data cannot import it,
    a test keeps the two equal)."""
    page = SMALL_BUFFER if small else LARGE_BUFFER
    return -(-min(total + total // 8, MAX_VIRTUAL_RANGE) // page) * page


def event_pool(e: TraceEntry) -> bool | None:
    """Whether a segment_map or segment_unmap entry is in the small pool, when it says (ours
    do: ``segment_type``); None when it does not."""
    kind = e.get("segment_type")
    return None if kind not in ("small", "large") else kind == "small"


def pool_of_map(size: int) -> bool:
    """Whether a map of ``size`` bytes with nothing else to go by is in the small pool."""
    return size % LARGE_BUFFER != 0


@dataclass(frozen=True)
class MappedRange:
    """One contiguous mapped range of an expandable segment."""

    start: int
    end: int
    stream: int
    small: bool

    @property
    def size(self) -> int:
        return self.end - self.start


class MappedRanges:
    """The mapped ranges of one moment, maximal (touching ranges are one), in address order."""

    def __init__(self, ranges: list[MappedRange] | None = None) -> None:
        self.ranges: list[MappedRange] = sorted(ranges or [], key=lambda r: r.start)

    def __iter__(self) -> Iterator[MappedRange]:
        return iter(list(self.ranges))

    def __len__(self) -> int:
        return len(self.ranges)

    def _starts(self) -> list[int]:
        return [r.start for r in self.ranges]

    def pool_near(self, addr: int, stream: int, size: int) -> bool:
        """The pool of a new range at ``addr``: small if it is not whole large pages, else
        that of the nearest range on ``stream``."""
        near = [r for r in self.ranges if r.stream == stream]
        if not near or pool_of_map(size):
            return pool_of_map(size)
        best = min(near, key=lambda r: min(abs(addr - r.start), abs(addr - r.end)))
        return best.small

    def add(self, start: int, end: int, stream: int, small: bool | None = None
            ) -> tuple[list[MappedRange], MappedRange]:
        """Map ``[start, end)``: returns the ranges it merged with (now gone) and the new
        range. ``small`` None: the pool of the range it touches, or ``pool_near``'s."""
        i = bisect.bisect_left(self._starts(), start)
        merged: list[MappedRange] = []
        if i > 0 and self.ranges[i - 1].end == start:
            merged.append(self.ranges[i - 1])
        if i < len(self.ranges) and self.ranges[i].start == end:
            merged.append(self.ranges[i])
        for r in (self.ranges[i - 1] if i > 0 else None,
                  self.ranges[i] if i < len(self.ranges) else None):
            if r is not None and r.start < end and start < r.end and r not in merged:
                raise ValueError(f"map of [{start:#x}, {end:#x}) overlaps a mapped range")
        if small is None:
            small = merged[0].small if merged else self.pool_near(start, stream, end - start)
        new = MappedRange(min([start, *(r.start for r in merged)]),
                          max([end, *(r.end for r in merged)]), stream, small)
        self.ranges = [r for r in self.ranges if r not in merged]
        bisect.insort(self.ranges, new, key=lambda r: r.start)
        return merged, new

    def remove(self, start: int, end: int) -> tuple[MappedRange, list[MappedRange]]:
        """Unmap ``[start, end)``, which lies in one mapped range: returns that range (now gone)
        and what is left of it (0, 1 or 2 ranges)."""
        i = bisect.bisect_right(self._starts(), start) - 1
        if i < 0 or self.ranges[i].end < end:
            raise ValueError(f"unmap of [{start:#x}, {end:#x}) is not inside a mapped range")
        old = self.ranges.pop(i)
        rest = [MappedRange(a, b, old.stream, old.small)
                for a, b in ((old.start, start), (end, old.end)) if a < b]
        for r in rest:
            bisect.insort(self.ranges, r, key=lambda x: x.start)
        return old, rest


@dataclass(frozen=True)
class MappedLife:
    """Mapped range ``[addr, addr + size)`` exists after events ``start .. end - 1`` (-1: before
    the trace; ``end`` = the trace's length: still mapped at its end)."""

    start: int
    end: int
    addr: int
    size: int
    stream: int
    small: bool
    group: int  # the expandable segment it is in (one row of the layout)
    base: int  # the lowest address of that segment seen so far (its base, when seen)
    frames: list[Frame]  # the segment's stack, on the range at its base only (as snapshots)
    #: the base of the segment's reserved range where the snapshot or the trace names it (ours
    #: do: ``virtual_address``), else None
    virtual_address: int | None = None


def _settle_pools(ranges: MappedRanges, trace: Sequence[TraceEntry],
                  end_segments: Sequence[SegmentInfo]) -> None:
    """Give each range older than the trace and not the snapshot's the pool of a block seen in
    it, where there is one: a block of at most 1 MiB is in the small pool, a larger one in the
    large pool (``SMALL_SIZE``)."""
    seen = sorted({(e["addr"], e.get("block_size") or e["size"]) for e in trace
                   if e["action"] in ("alloc", "free_completed")}
                  | {(b["address"], b["size"]) for seg in end_segments for b in seg["blocks"]
                     if b["state"] != "inactive"})
    addrs = [a for a, _ in seen]
    known = sorted(seg["address"] for seg in end_segments if seg.get("is_expandable"))
    settled = []
    for r in ranges:
        i = bisect.bisect_left(addrs, r.start)
        k = bisect.bisect_left(known, r.start)
        small = r.small
        if k < len(known) and known[k] < r.end:
            pass  # holds a range of the snapshot: its pool is known
        elif i < len(addrs) and addrs[i] < r.end:
            small = seen[i][1] <= SMALL_SIZE
        settled.append(MappedRange(r.start, r.end, r.stream, small))
    ranges.ranges = settled


def mapped_lives(trace: Sequence[TraceEntry], end_segments: Sequence[SegmentInfo]
                 ) -> list[MappedLife]:
    """Every mapped range's life over ``trace``, given the snapshot's segments at its end.

    The ranges at the trace's start are the end's with the trace's maps and unmaps undone; a
    map or unmap that disagrees with them (no bytes, an overlap: a damaged file) is left out.
    A group is a (stream, pool) from the first map into it until all its pages are unmapped
    (the segment is released then). The group's stack is the first map's, or the snapshot's
    for a segment older than the trace."""
    ranges = MappedRanges()
    end_frames: dict[int, list[Frame]] = {}
    for seg in end_segments:
        if seg.get("is_expandable"):
            ranges.add(seg["address"], seg["address"] + seg["total_size"], seg["stream"],
                       seg["segment_type"] == "small")
            end_frames[seg["address"]] = seg.get("frames") or []
    skipped: set[int] = set()  # events that disagree with the ranges (a damaged file)
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if e["action"] not in ("segment_map", "segment_unmap"):
            continue
        try:
            if e["size"] <= 0:
                raise ValueError("a map or unmap of no bytes")
            if e["action"] == "segment_map":
                ranges.remove(e["addr"], e["addr"] + e["size"])
            else:
                ranges.add(e["addr"], e["addr"] + e["size"], e["stream"], event_pool(e))
        except ValueError:
            skipped.add(i)
    if not all(event_pool(e) is not None for e in trace
               if e["action"] in ("segment_map", "segment_unmap")):
        _settle_pools(ranges, trace, end_segments)  # PyTorch's: pools guessed, then settled

    n = len(trace)
    out: list[MappedLife] = []
    open_at: dict[int, tuple[int, MappedRange]] = {}  # range start -> (life start, range)
    group_of: dict[tuple[int, bool], int] = {}  # (stream, small) -> its current group
    mapped: dict[tuple[int, bool], int] = {}  # mapped bytes of each (stream, small)
    base: dict[int, int] = {}
    frames_of: dict[int, list[Frame]] = {}

    def open_(r: MappedRange, at: int) -> None:
        open_at[r.start] = (at, r)

    named = _named_bases(trace, end_segments)

    def close(r: MappedRange, at: int) -> None:
        start, _ = open_at.pop(r.start)
        g = group_of[(r.stream, r.small)]
        out.append(MappedLife(start, at, r.start, r.size, r.stream, r.small, g, base[g],
                              (frames_of[g] or end_frames.get(r.start, []))
                              if r.start == base[g] else [],
                              _named_base(named, r, [trace[k] for k in (start, at)
                                                     if 0 <= k < n])))

    for r in ranges:
        key = (r.stream, r.small)
        if key not in group_of:
            g = group_of[key] = len(base)
            base[g] = r.start
            frames_of[g] = end_frames.get(r.start, [])
        mapped[key] = mapped.get(key, 0) + r.size
        open_(r, -1)
    for i, e in enumerate(trace):
        action = e["action"]
        if i in skipped:
            continue
        if action == "segment_map":
            said = event_pool(e)
            small = pool_of_map(e["size"]) if said is None else said
            key = (e["stream"], small)
            if not mapped.get(key):
                g = group_of[key] = len(base)
                base[g] = e["addr"]
                frames_of[g] = e["frames"]
            try:
                merged, new = ranges.add(e["addr"], e["addr"] + e["size"], e["stream"], small)
            except ValueError:
                continue  # disagrees with the ranges (a damaged file): left out
            g = group_of[key]
            base[g] = min(base[g], e["addr"])
            for r in merged:
                close(r, i)
            open_(new, i)
            mapped[key] = mapped.get(key, 0) + e["size"]
        elif action == "segment_unmap":
            try:
                old, rest = ranges.remove(e["addr"], e["addr"] + e["size"])
            except ValueError:
                continue
            close(old, i)
            for r in rest:
                open_(r, i)
            key = (old.stream, old.small)
            mapped[key] -= e["size"]
    for _, r in list(open_at.values()):
        close(r, n)
    return sorted(out, key=lambda life: (life.start, life.addr))


Named = list[tuple[int, int, int, bool]]  # (address, base, stream, small), by address


def _named_bases(trace: Sequence[TraceEntry], end_segments: Sequence[SegmentInfo]) -> Named:
    """Every map and unmap entry, and every expandable segment of the snapshot, that names
    the base of its segment's reserved range (a valid one: at or below its address)."""
    named: Named = []
    for e in trace:
        if e["action"] in ("segment_map", "segment_unmap"):
            base, small = e.get("virtual_address"), event_pool(e)
            if type(base) is int and small is not None and 0 <= base <= e["addr"]:
                named.append((e["addr"], base, e["stream"], small))
    for seg in end_segments:
        base = seg.get("virtual_address")
        if seg.get("is_expandable") and type(base) is int and 0 <= base <= seg["address"]:
            named.append((seg["address"], base, seg["stream"], seg["segment_type"] == "small"))
    named.sort()
    return named


def _named_base(named: Named, r: MappedRange, ends: list[TraceEntry]) -> int | None:
    """The base of range ``r``'s segment: the one the map or unmap that made it or ended it
    names (it merged the range, or cut it), else one named inside it (a segment's address
    space is its own), else None."""
    for e in ends:
        base = e.get("virtual_address")
        if type(base) is int and event_pool(e) == r.small and 0 <= base <= r.start:
            return base
    i = bisect.bisect_left(named, (r.start,))
    while i < len(named) and named[i][0] < r.end:
        _, base, stream, small = named[i]
        if stream == r.stream and small == r.small and base <= r.start:
            return base
        i += 1
    return None


@dataclass(frozen=True)
class LayoutRow:
    """One row of a drawn layout: a classic segment, or an expandable segment's mapped ranges
    from the lowest address to the highest end (the gaps between them unmapped)."""

    address: int
    span: int  # bytes from ``address`` to the highest mapped end
    mapped: int  # bytes mapped (a classic segment: its size)
    stream: int
    segment_type: str
    expandable: bool
    parts: list[SegmentInfo]  # the snapshot's segments of the row, by address
    range: int = 0  # virtual bytes an expandable segment reserves (0: unknown or classic)

    def unmapped(self) -> list[tuple[int, int]]:
        """``(address, bytes)`` of each unmapped stretch between the mapped ranges."""
        out = []
        at = self.address
        for seg in self.parts:
            if seg["address"] > at:
                out.append((at, seg["address"] - at))
            at = max(at, seg["address"] + seg["total_size"])
        return out


def layout_rows(segments: Sequence[SegmentInfo], device_total: int = 0) -> list[LayoutRow]:
    """The rows of ``segments`` (a snapshot's, or ``replay_segments``'), by address: the
    expandable ones of one device, stream and pool grouped in one row. ``device_total`` (0:
    unknown) gives the range an expandable segment reserves (``virtual_range``)."""
    rows: list[LayoutRow] = []
    groups: dict[tuple[int, int, str], list[SegmentInfo]] = {}
    for seg in sorted(segments, key=lambda s: s["address"]):
        if seg.get("is_expandable"):
            key = (seg.get("device", 0), seg.get("stream", 0), seg.get("segment_type", "large"))
            groups.setdefault(key, []).append(seg)
        else:
            rows.append(LayoutRow(seg["address"], seg["total_size"], seg["total_size"],
                                  seg.get("stream", 0), seg.get("segment_type", "large"), False,
                                  [seg]))
    for (_, stream, kind), parts in groups.items():
        start = parts[0]["address"]
        end = max(s["address"] + s["total_size"] for s in parts)
        rows.append(LayoutRow(start, end - start, sum(s["total_size"] for s in parts), stream,
                              kind, True, parts,
                              virtual_range(device_total, kind == "small") if device_total else 0))
    return sorted(rows, key=lambda r: r.address)
