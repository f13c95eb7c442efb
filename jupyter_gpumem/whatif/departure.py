"""Where a replay under the recorded config leaves the recording, and why.

A trace of ours replayed under its own config on its own device gives back the recording
(``whatif.replay``); when it does not, its notes must say so. The trace records reserved bytes
event by event (segment events add and take away bytes), so the replay's course can be checked
against it: ``recorded_course`` reads the recorded one, ``departure`` finds the first
alloc, free or out-of-memory event after which the replay's reserved bytes, or its failures,
differ, and names what the trace shows there:

- the recorded policy ran the retry ladder before that event (a segment released for a retry,
  or an out-of-memory error): the recorded device refused memory that the replayed one has, a
  failed device call or memory another process held for a while. A retry that released
  nothing leaves no event: our snapshots count the retries while the trace was recorded
  (``alloc_retries``), and a replay that retried otherwise says so;
- garbage collection is on and blocks were cached before the trace: their ages are not
  recorded (they start equal in the replay);
- otherwise the trace does not say (a config change during the recording, or a trace not made
  by this policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from jupyter_gpumem.data.codes import (
    ALLOC,
    FREE_COMPLETED,
    OOM,
    RELEASE_REASONS,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from jupyter_gpumem.data.devices import device_segments
from jupyter_gpumem.data.units import format_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.data.columns import TraceColumns
    from jupyter_gpumem.data.schema import Snapshot

__all__ = ["Course", "departure", "recorded_course", "reserved_after"]

Int64s = np.ndarray[Any, np.dtype[np.int64]]
Codes = np.ndarray[Any, np.dtype[np.int8]]
#: Releases of the retry ladder: the device (or the cap) refused a segment just before.
_LADDER = ("retry", "oversize")
_REFUSED = ("the recorded device refused memory the replayed one had (a failed device call, "
            "or memory another process held for a while)")
_GC_AGES = ("the garbage-collection ages of the blocks cached before the trace are not "
            "recorded (they start equal)")


@dataclass
class Course:
    """The recording's course, event by event."""

    reserved: Int64s  # reserved bytes after each event
    acts: np.ndarray[Any, np.dtype[np.bool_]]  # an alloc, free or oom event (the replay's ops)
    ladder: np.ndarray[Any, np.dtype[np.bool_]]  # the retry ladder ran for this event
    first_oom: int | None  # the first oom event
    ooms: int
    retries: int | None = None  # retries of the ladder while recorded, where the trace says


def reserved_after(snapshot: Snapshot, device: int, codes: Codes, sizes: Int64s) -> Int64s:
    """Reserved bytes after each event: the snapshot's (the sum of its segments), less what
    every later segment event added (Note [The replayed device's size] in whatif.program)."""
    delta = np.zeros(len(codes), np.int64)
    grows = (codes == SEGMENT_ALLOC) | (codes == SEGMENT_MAP)
    shrinks = (codes == SEGMENT_FREE) | (codes == SEGMENT_UNMAP)
    delta[grows] = sizes[grows]
    delta[shrinks] = -sizes[shrinks]
    end = sum(int(seg["total_size"]) for seg in device_segments(snapshot, device))
    if not len(delta):
        return delta
    return end - (np.cumsum(delta[::-1])[::-1] - delta)


def recorded_course(snapshot: Snapshot, device: int, trace: TraceColumns, codes: Codes,
                    sizes: Int64s, retries: object = None) -> Course:
    """The recorded course of ``trace`` (one device's); ``retries``: our snapshot's
    ``alloc_retries`` (retries while the trace was recorded), when it has one."""
    n = len(codes)
    acts = (codes == ALLOC) | (codes == FREE_COMPLETED) | (codes == OOM)
    ladder = codes == OOM
    releases = np.flatnonzero((codes == SEGMENT_FREE) | (codes == SEGMENT_UNMAP))
    reasons = trace.column("device_free")[releases]  # a release's reason code
    ladder_codes = [code for code, name in enumerate(RELEASE_REASONS) if name in _LADDER]
    marked = releases[np.isin(reasons, ladder_codes)].tolist()
    if marked:  # the event each ladder release served: the next alloc, free or oom
        at = np.flatnonzero(acts)
        nxt = np.searchsorted(at, np.array(marked, np.int64))
        ladder[at[nxt[nxt < len(at)]]] = True
    ooms = np.flatnonzero(codes == OOM)
    said = retries if type(retries) is int and retries >= 0 else None
    return Course(reserved_after(snapshot, device, codes, sizes), acts, ladder,
                  int(ooms[0]) if len(ooms) else None, len(ooms) if n else 0, said)


def departure(course: Course, reserved: Int64s, first_oom: int | None, num_ooms: int,
              retries: int, *, gc_ages: bool) -> str | None:
    """The note for a replay under the recorded config that leaves ``course`` (None when it
    follows it): ``reserved`` after each event, its first failed request, its OOM and retry
    counts; ``gc_ages``: garbage collection is on and blocks were cached before the trace."""
    differs = np.flatnonzero(course.acts & (reserved != course.reserved))
    at = int(differs[0]) if len(differs) else None
    if first_oom != course.first_oom or num_ooms != course.ooms:
        fails = [i for i in (first_oom, course.first_oom) if i is not None]
        if fails and (at is None or min(fails) < at):
            at = min(fails)
    if at is None:
        if course.retries is None or course.retries == retries:
            return None
        # a retry that released nothing leaves no event: only the counts tell
        return (f"the replay leaves the recording: it retried {retries} time(s), the "
                f"recording {course.retries}: " + (_GC_AGES if gc_ages else _REFUSED))
    what = (f"the replay leaves the recording at event {at}: {format_bytes(int(reserved[at]))} "
            f"reserved, {format_bytes(int(course.reserved[at]))} recorded")
    if first_oom != course.first_oom and at in (first_oom, course.first_oom):
        what += (", and the request there failed only in the "
                 + ("replay" if at == first_oom else "recording"))
    if course.ladder[at]:
        why = _REFUSED
    elif gc_ages:
        why = _GC_AGES
    else:
        why = "the trace does not say why (a config change while it was recorded?)"
    return f"{what}: {why}"
