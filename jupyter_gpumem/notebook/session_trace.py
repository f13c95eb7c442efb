"""The session's timeline (``%gpumem plot``): a source's history and what traced cells kept.

With history ``state`` (the extension's default for our allocator) or ``off``, a source keeps no
events, but ``trace()`` (``%%gpumem_trace``) switches full history on for its block. Putting the
history back afterwards would throw the block's events away, so ``trace`` hands them here
(``keep``), per source: the session keeps what traced cells recorded, and nothing else changes
(history stays as the user set it, other cells cost nothing more).

Recordings are kept per source: by its name and what its blocks belong to (``LiveBlocks.owner``:
our allocator object, weakly, so a simulated device thrown away takes its recordings with it;
PyTorch's device). ``session_timeline`` stitches the kept blocks, oldest first, and then the
source's own events, if it records any (they all come later: a block is kept only when its
events would leave the source's history, which then holds none). Two recordings join into one
timeline only where nothing changed memory between them, i.e. where allocated and reserved
bytes at the end of one equal those at the start of the next; a timeline across a gap would
draw every earlier curve wrong. So the timeline starts after the last gap, and its caption
names the cells it leaves out and why.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.codes import SNAPSHOT
from jupyter_gpumem.data.columns import as_columns, concat_traces, without_snapshots
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.sources.protocol import offers

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import SegmentInfo, Snapshot, TraceEntry
    from jupyter_gpumem.data.timeline import Timeline
    from jupyter_gpumem.sources.protocol import HistoryMode, MemorySource

__all__ = ["MAX_KEPT_EVENTS", "history_mode", "keep", "kept_cells", "session_timeline",
           "window_marks"]

#: Events kept per source from traced blocks; the oldest blocks go first.
MAX_KEPT_EVENTS = 1_000_000


@dataclass
class _Recording:
    """The events of one traced block (or of the allocator's history), and its end points."""

    cell: int | None
    events: Sequence[TraceEntry]  # TraceColumns
    start: tuple[int, int]  # allocated, reserved bytes before the first event
    end: tuple[int, int]  # after the last event
    segments: list[SegmentInfo] = field(default_factory=list)  # at the end; only the last kept
    ring: bool = False  # the allocator's own history, not a traced block
    #: the snapshot's ``jupyter_gpumem`` field (config, device size, empty_cache marks)
    info: dict[str, Any] = field(default_factory=dict)


#: What a recording keeps of its snapshot's field once a newer one is kept (``_stitched_info``).
_OLDER_INFO = ("empty_cache", "history_dropped")

#: Recordings by what a source's blocks belong to, weakly (our allocator object, so a simulated
#: device thrown away takes its recordings with it), then by the source's name and owner; for
#: an owner that cannot be weakly referred to (PyTorch's ``(name, device)``), by the source
#: object itself (a source made again starts afresh).
_kept: weakref.WeakKeyDictionary[Any, dict[tuple[str, Any], list[_Recording]]] = (
    weakref.WeakKeyDictionary())
_kept_by_name: dict[tuple[str, Any], list[_Recording]] = {}


def _recordings(source: MemorySource, *, make: bool = False) -> list[_Recording]:
    """The recordings kept for ``source`` (with ``make``, the list kept, made if new)."""
    owner = source.live_blocks().owner
    try:
        weakref.ref(owner)
        hash(owner)
        holder: Any = owner
    except TypeError:  # a tuple, None, or not hashable
        holder = source
    key = (source.name, owner if holder is owner else _hashable(owner))
    try:
        per_owner = _kept.get(holder)
        if per_owner is None:
            if not make:
                return []
            per_owner = _kept[holder] = {}
    except TypeError:  # a source object that cannot be weakly referred to: by name
        per_owner = _kept_by_name
    return per_owner.setdefault(key, []) if make else per_owner.get(key, [])


def _hashable(owner: Any) -> Any:
    try:
        hash(owner)
    except TypeError:
        return None  # one store for the source, whatever it owns
    return owner


def history_mode(source: MemorySource) -> HistoryMode:
    """What ``source``'s history records now: "all", "state" or "off" (``history_mode`` where
    the source has it, else from ``history_on``)."""
    own = getattr(source, "history_mode", None)
    if callable(own):
        mode: HistoryMode = own()
        return mode
    return "all" if source.history_on() else "off"


def _trace_of(snapshot: Snapshot, device: int) -> Sequence[TraceEntry]:
    traces = snapshot["device_traces"]
    return traces[device] if device < len(traces) else []


def _recording(snapshot: Snapshot, device: int, cell: int | None,
               timeline: Timeline | None = None) -> _Recording | None:
    trace = _trace_of(snapshot, device)
    events = without_snapshots(trace)
    if not len(events):
        return None
    tl = timeline
    if tl is None or len(tl) != len(events):
        snap: Snapshot = {**snapshot, "device_traces": [
            events if i == device else [] for i in range(len(snapshot["device_traces"]))]}
        tl = build_timeline(snap, device)
    segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
    info = dict(snapshot.get("jupyter_gpumem") or {})
    if len(events) != len(trace):  # marks count the events kept
        info["empty_cache"] = window_marks(trace, 0, info.get("empty_cache") or [])
    return _Recording(cell, events, (tl.start_allocated, tl.start_reserved),
                      (int(tl.allocated[-1]), int(tl.reserved[-1])), segments, info=info)


def window_marks(events: Sequence[TraceEntry], first: int, marks: Any) -> list[int]:
    """Note [Recording empty_cache] in ``engine.history``: the positions ``marks`` of
    empty_cache() calls in ``events``, as positions in the window ``events[first:]`` without its
    snapshot events (a call before the window is left out)."""
    import numpy as np

    actions = as_columns(events).column("action")[first:]
    kept = np.concatenate(([0], np.cumsum(actions != SNAPSHOT)))  # kept[i]: before events[first+i]
    return [int(kept[m - first]) for m in marks
            if isinstance(m, int) and first <= m <= len(events)]


def keep(source: MemorySource, snapshot: Snapshot, cell: int | None = None,
         timeline: Timeline | None = None) -> None:
    """Keep the events of a block traced on ``source`` (``snapshot``: its end state and only
    its events; ``timeline``: its timeline, if built already)."""
    rec = _recording(snapshot, source.device_index, cell, timeline)
    if rec is None:
        return
    kept = _recordings(source, make=True)
    for older in kept:
        older.segments = []  # only the newest end state is needed
        # and of the older fields, what ``_stitched_info`` reads (not the stats, ~10 KB)
        older.info = {k: older.info[k] for k in _OLDER_INFO if k in older.info}
    kept.append(rec)
    total = sum(len(r.events) for r in kept)
    while len(kept) > 1 and total > MAX_KEPT_EVENTS:
        total -= len(kept.pop(0).events)


def kept_cells(source: MemorySource) -> list[int | None]:
    """The cells whose traced events are kept for ``source``, oldest first."""
    return [r.cell for r in _recordings(source)]


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


def session_timeline(source: MemorySource) -> tuple[Snapshot, str] | str:
    """``(snapshot, caption)`` of the session's timeline on ``source``, or one line saying why
    there is none."""
    recorded = history_mode(source)
    mode = "on" if recorded == "all" else recorded
    recs = list(_recordings(source))
    index = source.device_index
    if mode == "on":
        snap = source.snapshot()  # a view: where it can, it adds no event to the timeline
        own = _recording(snap, index, None)
        if own is None and not recs:  # nothing recorded yet: the plot says so
            return snap, f"timeline of {len(_trace_of(snap, index))} events"
        if own is not None:
            own.ring = True
            recs.append(own)
    if not recs and not offers(source, "history"):
        own_line = source.recorded_trace()  # why there is none, and what it gives instead
        if isinstance(own_line, str):
            return own_line
    if not recs:
        return (f"gpumem: no event history is recorded (history is {mode}), and no "
                "%%gpumem_trace cell has recorded any; run %gpumem history on, then the cells "
                "to look at.")
    first = max((i for i in range(1, len(recs)) if recs[i - 1].end != recs[i].start),
                default=0)
    shown, left_out = recs[first:], recs[:first]
    events = concat_traces([r.events for r in shown])
    traces: list[Sequence[TraceEntry]] = [[] for _ in range(index + 1)]
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
