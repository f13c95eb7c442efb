"""What the live widget sends: pure functions of a snapshot (or of samples) to binary columns.

Every payload is a JSON-able dict whose large parts are ``bytes`` of little-endian numpy columns;
ipywidgets moves ``bytes`` found anywhere in a synced dict or a custom message as binary buffers,
so nothing large is ever JSON-encoded. A column is ``{"name", "dtype", "data"}`` with dtype one of
``COLUMN_DTYPES``; the browser views ``data`` as the matching typed array.

Conventions (the same as ``timeline``):

- The timeline is the trace's allocated/reserved bytes after every event, downsampled to at most
  ~``max_points`` events that keep each bucket's minimum and maximum (so the peak survives).
- Bands are bytes live per allocation site at those events, for the ``top`` sites with the most
  bytes live at the peak, plus one "other" band. Inside a band, allocations stack in the order
  they were made, so a click at height ``y`` in band ``g`` names one allocation
  (``pick_allocation``).
- The block layout is one row per segment; a block's ``offset`` is from its segment's start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import ALLOC, NO_STACK, OOM, SHOWN_FRAMES, SHOWN_OOMS
from jupyter_gpumem.data.devices import snapshot_device
from jupyter_gpumem.data.ranking import band_groups
from jupyter_gpumem.data.sites import is_library_file, short_site
from jupyter_gpumem.data.timeline import (
    Intervals,
    Timeline,
    band_values,
    build_timeline,
    cell_boundaries,
    downsample,
    live_at,
    live_intervals,
    peak_index,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, SegmentInfo, Snapshot

#: numpy dtype of each column dtype name; all little-endian, as the browser's typed arrays.
COLUMN_DTYPES = {"f8": "<f8", "i4": "<i4", "u1": "u1"}
#: Block state codes of the layout's ``state`` column.
STATES = ("active_allocated", "active_pending_free", "inactive")
_STATE_CODE = {name: code for code, name in enumerate(STATES)}

Payload = dict[str, Any]


def column(name: str, values: npt.ArrayLike, dtype: str = "f8") -> dict[str, Any]:
    """One binary column. Bytes and addresses go as float64: exact below 2**53."""
    arr = np.ascontiguousarray(values, dtype=COLUMN_DTYPES[dtype])
    return {"name": name, "dtype": dtype, "data": arr.tobytes()}


def decode_columns(columns: Sequence[dict[str, Any]]) -> dict[str, npt.NDArray[Any]]:
    """The inverse of ``column``, as the browser does it: name → array."""
    return {c["name"]: np.frombuffer(c["data"], dtype=COLUMN_DTYPES[c["dtype"]])
            for c in columns}


def _stack(frames: Sequence[Frame]) -> list[list[Any]]:
    """The user's frames (no CuPy, numpy, IPython or other installed package, nothing outside
    the first module level) as compact ``[filename, line, name]`` triples, innermost first; the
    innermost three if none is the user's."""
    user = [f for f in frames if not is_library_file(f["filename"])] or list(frames[:3])
    top = next((i for i, f in enumerate(user) if f["name"] == "<module>"), len(user) - 1)
    user = user[:top + 1]  # frames outside the first module level are the runtime's
    return [[f["filename"], f["line"], f["name"]] for f in user[:SHOWN_FRAMES]]


# -- the timeline -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PickIndex:
    """What ``pick_allocation`` needs to name the allocation under a click on a band."""

    timeline: Timeline
    intervals: Intervals
    groups: npt.NDArray[np.int32]  # band of every interval

    def frames(self, interval: int) -> Sequence[Frame]:
        """The allocating stack of interval ``interval`` ([] if unknown)."""
        sid = int(self.intervals.stack[interval])
        return self.timeline.stacks[sid] if sid != NO_STACK else []


def timeline_payload(snapshot: Snapshot, *, device: int | None = None, max_points: int = 4000,
                     top: int = 8, timeline: Timeline | None = None,
                     cell_files: Mapping[str, int] | None = None,
                     ) -> tuple[Payload, PickIndex | None]:
    """The downsampled timeline of ``snapshot``'s trace, with site bands, peak, OOMs and cells.

    ``timeline`` reuses columns already built from the same snapshot and device;
    ``cell_files`` (a cell's source file name -> its number) names sites ``cell [N] line L``.
    Returns the payload and the index that answers clicks (None for an empty trace)."""
    device = snapshot_device(snapshot, device)
    tl = (timeline if timeline is not None
          else build_timeline(snapshot, device, cell_files=cell_files))
    n = len(tl)
    if n == 0:
        return {"n_events": 0, "n_points": 0, "columns": [], "bands": [], "band_labels": [],
                "band_stacks": [], "peak": None, "ooms": [], "n_ooms": 0, "cells": []}, None
    at = np.union1d(downsample(tl.allocated, max_points), downsample(tl.reserved, max_points))
    iv = live_intervals(tl)
    peak = peak_index(tl)
    chosen, groups = band_groups(iv, peak, top)
    values = band_values(iv, groups, len(chosen) + 1, n, at)
    pick = PickIndex(timeline=tl, intervals=iv, groups=groups)
    labels = [short_site(tl.sites[s]) for s in chosen] + ["other"]
    stacks = [_stack(pick.frames(_first_interval(iv, s))) for s in chosen] + [[]]
    ooms = np.flatnonzero(tl.action == OOM)
    t0 = int(tl.time_us[0])
    payload: Payload = {
        "n_events": n,
        "n_points": len(at),
        "columns": [
            column("index", at),
            column("time_s", (tl.time_us[at] - t0) / 1e6),
            column("allocated", tl.allocated[at]),
            column("reserved", tl.reserved[at]),
        ],
        # one column per band, bottom band first, "other" last
        "bands": [column(f"band{g}", values[g]) for g in range(len(chosen) + 1)],
        "band_labels": labels,
        "band_stacks": stacks,
        "peak": {"index": peak, "allocated": int(tl.allocated[peak]),
                 "reserved": int(tl.reserved.max())},
        "ooms": [[int(i), int(tl.allocated[i])] for i in ooms[:SHOWN_OOMS]],
        "n_ooms": len(ooms),
        "cells": [list(b) for b in cell_boundaries(tl)],
    }
    return payload, pick


def _first_interval(iv: Intervals, site: int) -> int:
    """The earliest allocation of ``site`` (its stack is the band's)."""
    of_site = np.flatnonzero(iv.site == site)
    return int(of_site[np.argmin(iv.start[of_site])])


def pick_allocation(index: PickIndex, event: int, band: int, offset: float) -> Payload | None:
    """The allocation in ``band`` live after ``event`` that covers height ``offset`` (bytes
    above the band's bottom), allocations stacking in the order they were made; None if none."""
    iv = index.intervals
    n = len(index.timeline)
    event = min(max(int(event), 0), n - 1)
    live = np.flatnonzero(live_at(iv, event) & (index.groups == band))
    if not len(live):
        return None
    live = live[np.lexsort((iv.addr[live], iv.start[live]))]
    tops = np.cumsum(iv.size[live])
    k = min(int(np.searchsorted(tops, max(offset, 0.0), side="right")), len(live) - 1)
    j = int(live[k])
    start = int(iv.start[j])
    tl = index.timeline
    known = tl.action[start] == ALLOC and tl.addr[start] == iv.addr[j]
    return {
        "event": event,
        "band": band,
        "addr": int(iv.addr[j]),
        "size": int(iv.size[j]),
        "requested": int(tl.size[start]) if known else None,
        "alloc_event": start if known else None,
        "free_event": int(iv.end[j]) if int(iv.end[j]) < n else None,
        "site": tl.site_label(int(iv.site[j])),
        "stack": _stack(index.frames(j)),
    }


# -- the block layout ---------------------------------------------------------------------------


def layout_payload(segments: Sequence[SegmentInfo]) -> Payload:
    """One row per segment, its blocks to scale: segment and block columns plus the stacks."""
    segs = sorted(segments, key=lambda s: (s.get("device", 0), s["address"]))
    n_blocks = sum(len(s["blocks"]) for s in segs)
    b_seg = np.empty(n_blocks, np.int32)
    b_off = np.empty(n_blocks, np.float64)
    b_size = np.empty(n_blocks, np.float64)
    b_req = np.empty(n_blocks, np.float64)
    b_state = np.empty(n_blocks, np.uint8)
    b_stack = np.empty(n_blocks, np.int32)
    stacks: list[list[list[Any]]] = []
    stack_ids: dict[tuple[tuple[str, int, str], ...], int] = {}
    k = 0
    for i, seg in enumerate(segs):
        base = seg["address"]
        for b in seg["blocks"]:
            b_seg[k] = i
            b_off[k] = b["address"] - base
            b_size[k] = b["size"]
            b_req[k] = b["requested_size"]
            b_state[k] = _STATE_CODE.get(b["state"], 2)
            frames = b["frames"]
            if frames:
                key = tuple((f["filename"], f["line"], f["name"]) for f in frames)
                sid = stack_ids.get(key)
                if sid is None:
                    sid = stack_ids[key] = len(stacks)
                    stacks.append(_stack(frames))
                b_stack[k] = sid
            else:
                b_stack[k] = NO_STACK
            k += 1
    return {
        "n_segments": len(segs),
        "n_blocks": n_blocks,
        "segments": [
            column("address", [s["address"] for s in segs]),
            column("total_size", [s["total_size"] for s in segs]),
            column("allocated_size", [s["allocated_size"] for s in segs]),
            column("stream", [s["stream"] for s in segs]),
            column("large", [s["segment_type"] == "large" for s in segs], "u1"),
            column("device", [s.get("device", 0) for s in segs], "i4"),
        ],
        "blocks": [
            column("segment", b_seg, "i4"),
            column("offset", b_off),
            column("size", b_size),
            column("requested", b_req),
            column("state", b_state, "u1"),
            column("stack", b_stack, "i4"),
        ],
        "states": list(STATES),
        "stacks": stacks,
    }


# -- live samples -------------------------------------------------------------------------------

#: Fields of one live sample, in the order of a samples buffer's rows.
SAMPLE_FIELDS = ("t", "allocated", "reserved", "device_used")


def samples_buffer(rows: Sequence[tuple[float, int, int, int | None]]) -> bytes:
    """``rows`` as one row-major little-endian float64 buffer, ``device_used`` None as NaN."""
    arr = np.array([(t, a, r, np.nan if d is None else d) for t, a, r, d in rows],
                   dtype="<f8").reshape(len(rows), len(SAMPLE_FIELDS))
    return arr.tobytes()


def decode_samples(data: bytes) -> npt.NDArray[np.float64]:
    """The inverse of ``samples_buffer``: an (n, 4) float64 array."""
    return np.frombuffer(data, dtype="<f8").reshape(-1, len(SAMPLE_FIELDS))
