"""The session's timeline (``%gpumem plot``): the allocator's history and what traced cells kept.

With history ``state`` (the extension's default) or ``off``, an allocator keeps no events, but
``trace()`` (``%%gpumem_trace``) switches full history on for its block. Putting the history
back afterwards would throw the block's events away, so ``trace`` hands them here (``keep``),
per allocator: the session keeps what traced cells recorded, and nothing else changes (history
stays as the user set it, other cells cost nothing more).

``session_timeline`` stitches the kept blocks, oldest first, and then the allocator's own
events, if it records any (they all come later: a block is kept only when its events would
leave the allocator's history, which then holds none). Two recordings join into one timeline
only where nothing changed memory between them, i.e. where allocated and reserved bytes at the
end of one equal those at the start of the next; a timeline across a gap would draw every
earlier curve wrong. So the timeline starts after the last gap, and its caption names the
cells it leaves out and why.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.timeline import build_timeline

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import SegmentInfo, Snapshot, TraceEntry
    from jupyter_gpumem.data.timeline import Timeline
    from jupyter_gpumem.engine.allocator import CachingAllocator

__all__ = ["MAX_KEPT_EVENTS", "keep", "kept_cells", "session_timeline", "window_marks"]

#: Events kept per allocator from traced blocks; the oldest blocks go first.
MAX_KEPT_EVENTS = 1_000_000


@dataclass
class _Recording:
    """The events of one traced block (or of the allocator's history), and its end points."""

    cell: int | None
    events: list[TraceEntry]
    start: tuple[int, int]  # allocated, reserved bytes before the first event
    end: tuple[int, int]  # after the last event
    segments: list[SegmentInfo] = field(default_factory=list)  # at the end; only the last kept
    ring: bool = False  # the allocator's own history, not a traced block
    #: the snapshot's ``jupyter_gpumem`` field (config, device size, empty_cache marks)
    info: dict[str, Any] = field(default_factory=dict)


#: What a recording keeps of its snapshot's field once a newer one is kept (``_stitched_info``).
_OLDER_INFO = ("empty_cache", "history_dropped")

_kept: weakref.WeakKeyDictionary[CachingAllocator, list[_Recording]] = (
    weakref.WeakKeyDictionary())


def _recording(snapshot: Snapshot, device: int, cell: int | None,
               timeline: Timeline | None = None) -> _Recording | None:
    events = [e for e in snapshot["device_traces"][device] if e["action"] != "snapshot"]
    if not events:
        return None
    tl = timeline
    if tl is None or len(tl) != len(events):
        snap: Snapshot = {**snapshot, "device_traces": [
            events if i == device else [] for i in range(len(snapshot["device_traces"]))]}
        tl = build_timeline(snap, device)
    segments = [s for s in snapshot["segments"] if s["device"] == device]
    info = dict(snapshot.get("jupyter_gpumem") or {})
    if len(events) != len(snapshot["device_traces"][device]):  # marks count the events kept
        info["empty_cache"] = window_marks(snapshot["device_traces"][device], 0,
                                           info.get("empty_cache") or [])
    return _Recording(cell, events, (tl.start_allocated, tl.start_reserved),
                      (int(tl.allocated[-1]), int(tl.reserved[-1])), segments, info=info)


def window_marks(events: list[TraceEntry], first: int, marks: Any) -> list[int]:
    """Note [Recording empty_cache] in ``engine.history``: the positions ``marks`` of
    empty_cache() calls in ``events``, as positions in the window ``events[first:]`` without its
    snapshot events (a call before the window is left out)."""
    kept = [0]  # kept[i]: events of the window before events[first + i]
    for e in events[first:]:
        kept.append(kept[-1] + (e["action"] != "snapshot"))
    return [kept[m - first] for m in marks if isinstance(m, int) and first <= m <= len(events)]


def keep(allocator: CachingAllocator, snapshot: Snapshot, cell: int | None = None,
         timeline: Timeline | None = None) -> None:
    """Keep the events of a traced block (``snapshot``: its end state and only its events;
    ``timeline``: its timeline, if built already)."""
    rec = _recording(snapshot, allocator.device.index, cell, timeline)
    if rec is None:
        return
    kept = _kept.setdefault(allocator, [])
    for older in kept:
        older.segments = []  # only the newest end state is needed
        # and of the older fields, what ``_stitched_info`` reads (not the stats, ~10 KB)
        older.info = {k: older.info[k] for k in _OLDER_INFO if k in older.info}
    kept.append(rec)
    total = sum(len(r.events) for r in kept)
    while len(kept) > 1 and total > MAX_KEPT_EVENTS:
        total -= len(kept.pop(0).events)


def kept_cells(allocator: CachingAllocator) -> list[int | None]:
    """The cells whose traced events are kept for ``allocator``, oldest first."""
    return [r.cell for r in _kept.get(allocator, [])]


def _stitched_info(recs: list[_Recording]) -> dict[str, Any]:
    """Our field for recordings joined end to end: the newest one's (config, device), the
    empty_cache marks of each shifted by the events before it, the first one's drops (what a
    replay of the timeline needs, ``whatif``)."""
    info = dict(recs[-1].info)
    marks: list[int] = []
    offset = 0
    for r in recs:
        marks += [offset + m for m in r.info.get("empty_cache") or []
                  if isinstance(m, int) and 0 <= m <= len(r.events)]
        offset += len(r.events)
    info["empty_cache"] = sorted(set(marks))
    info["history_dropped"] = recs[0].info.get("history_dropped", 0)
    return info


def _cells(recs: list[_Recording]) -> str:
    return ", ".join(f"[{r.cell}]" if r.cell is not None else "(a trace() block)" for r in recs)


def session_timeline(allocator: CachingAllocator) -> tuple[Snapshot, str] | str:
    """``(snapshot, caption)`` of the session's timeline, or one line saying why there is none."""
    history = allocator.history
    mode = "off" if history is None else "state" if history.max_entries == 0 else "on"
    recs = list(_kept.get(allocator, []))
    index = allocator.device.index
    if mode == "on":
        snap = allocator.snapshot(mark=False)  # a view: it adds no event to the timeline
        own = _recording(snap, index, None)
        if own is None and not recs:  # nothing recorded yet: the plot says so
            return snap, f"timeline of {len(snap['device_traces'][index])} events"
        if own is not None:
            own.ring = True
            recs.append(own)
    if not recs:
        return (f"gpumem: no event history is recorded (history is {mode}), and no "
                "%%gpumem_trace cell has recorded any; run %gpumem history on, then the cells "
                "to look at.")
    first = max((i for i in range(1, len(recs)) if recs[i - 1].end != recs[i].start),
                default=0)
    shown, left_out = recs[first:], recs[:first]
    events = [e for r in shown for e in r.events]
    traces: list[list[TraceEntry]] = [[] for _ in range(index + 1)]
    traces[index] = events
    stitched: Snapshot = {"segments": shown[-1].segments, "device_traces": traces,
                          "jupyter_gpumem": _stitched_info(shown)}
    traced = [r for r in shown if not r.ring]
    parts = [f"traced cells {_cells(traced)}"] if traced else []
    if len(traced) < len(shown):
        parts.append("the session's history")
    n = len(events)
    caption = f"timeline of {n} event{'s' if n != 1 else ''}: {' then '.join(parts)}"
    if mode != "on":
        caption += (f" (history is {mode}: other cells record no events; %gpumem history on "
                    "records every cell)")
    if left_out:
        caption += (f"; traced cells {_cells(left_out)} are left out: memory changed after them "
                    "in cells that recorded no events")
    return stitched, caption
