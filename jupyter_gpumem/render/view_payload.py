"""The one payload every view draws ("view payload", schema 2): pure functions of a snapshot.

The live widget, the MIME renderer (``MIME_TYPE``) and the offline HTML page read the same
JSON-able dict. Its large parts are *columns* (``payload_columns``), ``{"dtype": "f8"|"i4"|"u1",
"data": D}``, where ``D`` is the little-endian bytes of the array: as ``bytes`` in the widget
(ipywidgets sends them as binary buffers) or as a base64 string of the same bytes in a MIME
bundle or a page (``encode``). Bytes, addresses and times go as float64: exact below 2**53.

Its size is bounded whatever the trace's length (Note [A bounded view]): a traced cell of ten
million events saves at most about 1.6 MB of it, under 2 MB with its picture and text. A kernel
gives the rest on demand (``view_detail``): the timeline of any window, the layout at any event.

What is in it (the field list is the plan's, mirrored by the TS decoder):

- the timeline of the trace (allocated, reserved and bytes live per band) as a level-of-detail
  series (``data.lod``): the events cut into at most ``columns`` columns (2,000: one a pixel of
  a wide plot), each with the lowest and highest allocated and reserved bytes after any of its
  events, so a spike of one event is never lost, and the bands at the column's highest
  allocated event (``peak_at``). ``per_column`` 1: every event is its own column, exact. Bands
  are by allocation site (``bands="site"``: the top sites, then "other") or by holder
  (``bands="holder"``, ``holders.HOLDER_BANDS`` bottom first, empty ones left out: the blocks
  live at the end held by parameters & buffers, gradients, optimizer state or other variables,
  those held by no variable, and those freed during the trace);
- the lives of every block and segment: after event ``k`` (-1: before the first event) the
  layout is exactly the segments and blocks with ``start <= k < end``. Past ``max_lives`` block
  lives (or ``MAX_SEGMENT_LIVES`` segment lives) only those live at some checkpoints are kept,
  and the layout is exact at those (``checkpoints``); ``dropped`` counts the lives left out;
- a segment life of an expandable segment is one contiguous mapped range (as a snapshot has
  them; ``data.mapped``) with ``expandable`` 1 and ``group`` the expandable segment it is in
  (-1 for a classic segment): the views draw a group as one row, from the lowest address of
  its ranges seen so far to the highest end seen so far, the gaps unmapped;
- the stacks and sites the lives point to (only those, renumbered, within ``NAMES_BUDGET``
  characters; past it a stack is ``STACK_LEFT_OUT``), the top sites at the peak, the largest
  surviving blocks with their holders, and (for a live view) the sampled series;
- ``full_trace``: the file the whole trace was saved to (``%%gpumem_trace --save``), which a
  view names where its saved detail runs out.

The schema (``col T``: a column of dtype T)::

    {"schema": 2, "kind": "trace" | "snapshot" | "live", "title": str, "device": int,
     "device_name": str, "n_events": int, "start_allocated": int, "start_reserved": int,
     "timeline": {"index": col i4,              # first event of each column
                  "time_us": col f8,            # time of that event
                  "allocated": col f8, "reserved": col f8,          # highest in the column
                  "allocated_min": col f8, "reserved_min": col f8,  # lowest in the column
                  "peak_at": col i4,            # the column's (first) highest allocated event
                  "bands": [col f8, ...],       # bytes live per band after peak_at, bottom first
                  "band_labels": [str, ...],    # one per band
                  "bands_by": "site" | "holder",
                  "band_sites": [int, ...],     # site bands: the site of each band but the
                                                # last ("other"); holder bands: []
                  "window": [0, n_events],      # the events the columns cover
                  "per_column": int},           # events in a full column (1: exact)
     "peak": {"index": int, "allocated": int, "reserved": int},
     "ooms": [int, ...], "n_ooms": int, "cells": [[event_index, cell_number], ...],
     "lives": {"blocks": {"start": i4, "end": i4, "addr": f8, "size": f8, "requested": f8,
                          "stack": i4, "site": i4, "cell": i4,
                          "band": i4},          # the timeline band the block's bytes are in
               "segments": {"start": i4, "end": i4, "addr": f8, "size": f8, "stream": f8,
                            "small": u1, "expandable": u1, "group": i4,
                            "range": f8},       # virtual bytes an expandable one reserves
               "checkpoints": null | [int, ...], "dropped": int},
     "stacks": [[[filename, line, name], ...], ...], "sites": [str, ...],
     "top_sites": [{"site": str, "bytes": int, "count": int}, ...],
     "surviving": [{"address": int, "size": int, "requested": int, "site": str | null,
                    "holders": [str, ...], "stack": int}, ...],   # the largest MAX_SURVIVING
     "surviving_rest": null | {"count": int, "bytes": int, "site": str, "at_site": int},
     "block_holders": [[address, [str, ...]], ...],  # who holds a block live at the end
     "full_trace": null | str,      # the file holding every event
     "raised": str,                 # only when the traced code raised: "ValueError: boom"
     "samples": null | {"n": int, "data": col f8}}

An older payload (before the level of detail) has no ``allocated_min``, ``reserved_min``,
``peak_at``, ``window`` or ``per_column``: its ``index`` points are events kept by a
downsampling, drawn as steps; the viewers read both.

A click on a band names the blocks live then whose ``band`` is that band, stacked in
(start, addr) order (a payload without ``band``: those whose site is the band's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import BANDS, SHOWN_OOMS
from jupyter_gpumem.data.devices import device_segments, snapshot_device
from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.ranking import SiteUse, top_sites
from jupyter_gpumem.data.sites import saved_cell_files, short_site
from jupyter_gpumem.data.timeline import (
    Timeline,
    build_timeline,
    cell_boundaries,
    downsample,
    oom_indices,
    peak_allocated,
)
from jupyter_gpumem.data.together import together
from jupyter_gpumem.render.payload_columns import (
    COLUMN_DTYPES,
    column,
    decode_column,
    encode,
)
from jupyter_gpumem.render.view_detail import NAMES_BUDGET, TraceDetail, view_stack
from jupyter_gpumem.render.view_lives import STACK_LEFT_OUT, Spans, bound_lives

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import BlockInfo, Frame, Snapshot

__all__ = ["BANDS", "COLUMN_DTYPES", "MAX_LIVES", "MAX_POINTS", "MAX_SEGMENT_LIVES",
           "SAMPLE_FIELDS", "STACK_LEFT_OUT", "TIMELINE_COLUMNS", "VIEW_SCHEMA", "Surviving",
           "build_view", "decode_column", "encode", "live_view", "samples_array",
           "samples_payload"]

#: Version of the view payload.
VIEW_SCHEMA = 2
#: Rows of the samples, at most.
MAX_POINTS = 4000
#: Columns of the timeline, at most: one a pixel of a wide plot.
TIMELINE_COLUMNS = 2000
#: Block lives, at most (past it: checkpoints).
MAX_LIVES = 12_000
#: Segment lives, at most (past it: checkpoints).
MAX_SEGMENT_LIVES = 2000
#: Surviving blocks listed, at most (the largest; the rest summed up in ``surviving_rest``).
MAX_SURVIVING = 100
#: Cell marks on the timeline, at most.
MAX_CELL_MARKS = 1000
#: Characters of JSON the holders of the blocks live at the end take at most.
HOLDERS_BUDGET = 60_000
#: Fields of one live sample, in the order of a samples row.
SAMPLE_FIELDS = ("t_s", "allocated", "reserved", "device_used")

Kind = Literal["trace", "snapshot", "live"]
Bands = Literal["site", "holder"]
Payload = dict[str, Any]
SampleRow = tuple[float, int, int, "int | None"]

# Note [A bounded view]: a saved notebook keeps the view payload of every traced cell, so its
# size must not grow with the trace. Each part has its bound: the timeline TIMELINE_COLUMNS
# columns of 7 numbers and one a band (at most 9 bands: ~320 KB as base64), MAX_LIVES block
# lives (44 bytes each: ~700 KB), MAX_SEGMENT_LIVES segment lives (~120 KB), the stacks and
# sites NAMES_BUDGET characters (~300 KB once a notebook file indents them), the holders
# HOLDERS_BUDGET, MAX_SURVIVING surviving blocks, MAX_CELL_MARKS cell marks and SHOWN_OOMS OOM
# marks: at most about 1.6 MB, whatever the trace; with the picture and the text, a traced
# cell's output stays under 2 MB (tests/render/test_view_bound.py fills every part at once).
# The rest of a long trace is the kernel's to give (``view_detail``) or the file's
# (``full_trace``).


class Surviving(Protocol):
    """A block the traced code left live (``trace_result.SurvivingBlock`` is one)."""

    @property
    def address(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def requested(self) -> int: ...
    @property
    def site(self) -> str | None: ...
    @property
    def holders(self) -> Sequence[str]: ...
    @property
    def frames(self) -> Sequence[Frame]: ...


# -- the payload --------------------------------------------------------------------------------

def trace_detail(snapshot: Snapshot, *, device: int | None = None,
                 timeline: Timeline | None = None,
                 cell_files: Mapping[str, int] | None = None, top: int = 8,
                 bands: Bands = "site", surviving: Sequence[Surviving] = (),
                 holders: Mapping[int, Sequence[str]] | None = None) -> TraceDetail:
    """The ``TraceDetail`` a view of ``snapshot`` is drawn from (``build_view``'s arguments)."""
    if bands not in BANDS:
        raise ValueError(f"bands must be one of {BANDS}, got {bands!r}")
    device = snapshot_device(snapshot, device)
    cell_files = saved_cell_files(snapshot, cell_files)
    tl = (timeline if timeline is not None
          else build_timeline(snapshot, device, cell_files=cell_files))
    held: dict[int, Sequence[str]] = {b.address: b.holders for b in surviving}
    held.update(holders or {})
    return TraceDetail.build(snapshot, device, tl, cell_files=cell_files, bands=bands,
                             top=top, held=held)


def build_view(snapshot: Snapshot, *, kind: Kind = "trace", device: int | None = None,
               title: str = "", timeline: Timeline | None = None,
               cell_files: Mapping[str, int] | None = None,
               sites: Sequence[SiteUse] | None = None,
               surviving: Sequence[Surviving] = (),
               samples: Sequence[SampleRow] | npt.NDArray[np.float64] | None = None,
               max_points: int = MAX_POINTS, max_lives: int = MAX_LIVES, top: int = 8,
               bands: Bands = "site", holders: Mapping[int, Sequence[str]] | None = None,
               binary: bool = False, columns: int = TIMELINE_COLUMNS,
               detail: TraceDetail | None = None, full_trace: str | None = None) -> Payload:
    """The view payload of ``snapshot``'s trace and segments on ``device``.

    ``timeline`` reuses one built from the same snapshot and device, ``detail`` one worked out
    with ``trace_detail`` (then ``timeline``, ``top``, ``bands`` and ``holders`` are its);
    ``cell_files`` (a cell's source file name -> its number) names sites ``cell [N] line L``.
    ``sites`` are the top sites at the peak (default: ranked here, ten); ``surviving`` the
    blocks the traced code left live; ``samples`` the live series (rows ``SAMPLE_FIELDS``, at
    most ``max_points`` kept). ``top`` sites get a timeline band each with ``bands="site"``;
    ``bands="holder"`` makes the bands by holder (see the module docstring), a block's holders
    being its ``surviving`` entry's, or ``holders`` (address -> names, for blocks older than
    the trace too) where that names it; a block with holders of several roles takes the first
    in ``HOLDER_ROLES``. The timeline has at most ``columns`` columns, the lives at most
    ``max_lives`` blocks; ``full_trace`` names the file holding every event. Columns are
    ``bytes`` with ``binary``, else base64 strings."""
    if max_points < 8 or max_lives < 1 or columns < 8:
        raise ValueError(f"max_points and columns must be >= 8 and max_lives >= 1, got "
                         f"{max_points}, {columns}, {max_lives}")
    device = snapshot_device(snapshot, device)
    cell_files = saved_cell_files(snapshot, cell_files)
    if detail is None:
        detail = trace_detail(snapshot, device=device, timeline=timeline, cell_files=cell_files,
                              top=top, bands=bands, surviving=surviving, holders=holders)
    tl = detail.timeline
    n = len(tl)
    info = snapshot.get("jupyter_gpumem") or {}
    peak = detail.peak
    names = detail.names(NAMES_BUDGET)
    band_sites = names.site_ids(np.array(detail.band_sites, np.int32)).tolist()

    def lives_part() -> dict[str, Any]:
        sl = detail.segments
        (blocks, segments), checkpoints = bound_lives(
            [(detail.lives, max_lives), (Spans(sl.start, sl.end), MAX_SEGMENT_LIVES)], n, peak)
        return detail.lives_part(blocks, segments, names, checkpoints=checkpoints,
                                 dropped=int(len(blocks) - blocks.sum()))

    def ranked_sites() -> Sequence[SiteUse]:
        return sites if sites is not None else [
            SiteUse(short_site(u.site), u.bytes, u.count)
            for u in top_sites(tl, live_intervals(tl), peak, 10)]

    series, lives_part_, sites = together(n, lambda: detail.series(0, n, columns), lives_part,
                                          ranked_sites)
    ooms = oom_indices(tl)
    listed = list(surviving)[:MAX_SURVIVING]
    payload: Payload = {
        "schema": VIEW_SCHEMA,
        "kind": kind,
        "title": title,
        "device": device,
        "device_name": str(info.get("device_name", "")),
        "n_events": n,
        "start_allocated": tl.start_allocated,
        "start_reserved": tl.start_reserved,
        "timeline": {**series, "band_labels": detail.band_labels,
                     "bands_by": detail.bands_by, "band_sites": band_sites},
        "peak": {"index": peak,
                 "allocated": peak_allocated(tl),
                 "reserved": max(tl.reserved_max if n else 0, tl.start_reserved)},
        "ooms": ooms[:SHOWN_OOMS].tolist(),
        "n_ooms": len(ooms),
        "cells": _cell_marks(tl),
        "lives": lives_part_,
        "stacks": names.stacks,
        "sites": names.sites,
        "top_sites": [{"site": u.site, "bytes": u.bytes, "count": u.count} for u in sites],
        "surviving": [{"address": b.address, "size": b.size, "requested": b.requested,
                       "site": b.site, "holders": list(b.holders),
                       "stack": names.frames_id(view_stack(b.frames, cell_files))
                       if b.frames else -1}
                      for b in listed],
        "surviving_rest": _rest(list(surviving)[MAX_SURVIVING:]),
        "block_holders": _block_holders(surviving, holders, [
            b for seg in device_segments(snapshot, device) for b in seg["blocks"]
            if b["state"] == "active_allocated"]),
        "full_trace": full_trace,
        "samples": None if samples is None else samples_payload(samples, max_points),
    }
    return payload if binary else encode(payload, "base64")


def _cell_marks(tl: Timeline) -> list[list[int]]:
    """``[event, cell]`` where each run of one cell's events begins: at most MAX_CELL_MARKS,
    evenly picked where there are more."""
    marks = cell_boundaries(tl)
    if len(marks) > MAX_CELL_MARKS:
        keep = np.linspace(0, len(marks) - 1, MAX_CELL_MARKS).round().astype(int)
        marks = [marks[i] for i in sorted(set(keep.tolist()))]
    return [list(b) for b in marks]


def _rest(rest: Sequence[Surviving]) -> dict[str, Any] | None:
    """What the surviving blocks past the listed ones add up to: their count and bytes, and
    the site most of them were allocated at."""
    if not rest:
        return None
    by_site: dict[str, int] = {}
    for b in rest:
        by_site[b.site or "(no stack)"] = by_site.get(b.site or "(no stack)", 0) + 1
    site, count = max(by_site.items(), key=lambda kv: kv[1])
    return {"count": len(rest), "bytes": sum(b.size for b in rest), "site": site,
            "at_site": count}


def _block_holders(surviving: Sequence[Surviving], holders: Mapping[int, Sequence[str]] | None,
                   end_blocks: Sequence[BlockInfo]) -> list[list[Any]]:
    """``[address, names]`` of each block allocated at the end that something is known to
    hold (``holders``, else its ``surviving`` entry), in address order, within
    ``HOLDERS_BUDGET`` characters (the largest blocks first)."""
    known: dict[int, list[str]] = {b.address: list(b.holders) for b in surviving if b.holders}
    known.update({a: list(h) for a, h in (holders or {}).items() if h})
    live = {int(b["address"]): int(b["size"]) for b in end_blocks}
    left = HOLDERS_BUDGET
    kept = []
    for a in sorted((a for a in known if a in live), key=lambda a: (-live[a], a)):
        cost = 24 + sum(len(h) + 4 for h in known[a])
        if cost > left:
            break
        left -= cost
        kept.append(a)
    return [[a, known[a]] for a in sorted(kept)]


# -- live samples -------------------------------------------------------------------------------

def samples_array(rows: Sequence[SampleRow] | npt.NDArray[np.float64]
                  ) -> npt.NDArray[np.float64]:
    """``rows`` as an (n, 4) float64 array, ``device_used`` None as NaN."""
    if isinstance(rows, np.ndarray):
        return np.asarray(rows, np.float64).reshape(-1, len(SAMPLE_FIELDS))
    return np.array([(t, a, r, np.nan if d is None else d) for t, a, r, d in rows],
                    np.float64).reshape(len(rows), len(SAMPLE_FIELDS))


def samples_payload(rows: Sequence[SampleRow] | npt.NDArray[np.float64], max_points: int
             ) -> dict[str, Any]:
    """The ``samples`` field: at most ``max_points`` rows, keeping each bucket's extremes of
    allocated and reserved; its column is bytes (``encode`` makes it base64)."""
    arr = samples_array(rows)
    arr = arr[_points(max_points, arr[:, 1], arr[:, 2])]
    return {"n": len(arr), "data": column(arr.ravel())}


def _points(max_points: int, *series: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Indices that draw every one of ``series`` (equal lengths) with at most ``max_points``
    points, keeping each bucket's minimum and maximum of each."""
    n = len(series[0])
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    # downsample(y, m) gives at most m + 2 points; the union of all stays within the bound.
    each = max(2, max_points // len(series) - 2)
    return np.unique(np.concatenate([downsample(y, each) for y in series])).astype(np.int64)


def live_view(samples: Sequence[SampleRow] | npt.NDArray[np.float64], *, title: str = "",
              device: int = 0, device_name: str = "", max_points: int = MAX_POINTS,
              binary: bool = False) -> Payload:
    """The payload of a live view with only its sampled series (kind ``live``)."""
    payload = build_view({"segments": [], "device_traces": []}, kind="live", device=device,
                         title=title, samples=samples, max_points=max_points, binary=True)
    payload["device_name"] = device_name
    return payload if binary else encode(payload, "base64")
