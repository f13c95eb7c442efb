"""The one payload every view draws ("view payload", schema 2): pure functions of a snapshot.

The live widget, the MIME renderer (``MIME_TYPE``) and the offline HTML page read the same
JSON-able dict. Its large parts are *columns*, ``{"dtype": "f8"|"i4"|"u1", "data": D}``, where
``D`` is the little-endian bytes of the array: as ``bytes`` in the widget (ipywidgets sends them
as binary buffers) or as a base64 string of the same bytes in a MIME bundle or a page
(``encode``). Bytes, addresses and times go as float64: exact below 2**53.

What is in it (the field list is the plan's, mirrored by the TS decoder):

- the timeline of the trace (allocated, reserved and bytes live per band), downsampled to at
  most ``max_points`` events that keep every bucket's minimum and maximum. Bands are by
  allocation site (``bands="site"``: the top sites, then "other") or by holder
  (``bands="holder"``, ``holders.HOLDER_BANDS`` bottom first, empty ones left out: the blocks
  live at the end held by parameters & buffers, gradients, optimizer state or other variables,
  those held by no variable, and those freed during the trace);
- the lives of every block and segment: after event ``k`` (-1: before the first event) the
  layout is exactly the segments and blocks with ``start <= k < end``. Past ``max_lives`` block
  lives only the blocks live at some checkpoints are kept, and the layout is exact at those
  (``checkpoints``); ``dropped`` counts the lives left out;
- a segment life of an expandable segment is one contiguous mapped range (as a snapshot has
  them; ``data.mapped``) with ``expandable`` 1 and ``group`` the expandable segment it is in
  (-1 for a classic segment): the views draw a group as one row, from the lowest address of
  its ranges seen so far to the highest end seen so far, the gaps unmapped;
- the stacks and sites the lives point to, the top sites at the peak, the surviving blocks with
  their holders, and (for a live view) the sampled series.

The schema (``col T``: a column of dtype T)::

    {"schema": 2, "kind": "trace" | "snapshot" | "live", "title": str, "device": int,
     "device_name": str, "n_events": int, "start_allocated": int, "start_reserved": int,
     "timeline": {"index": col i4, "time_us": col f8, "allocated": col f8, "reserved": col f8,
                  "bands": [col f8, ...],       # bytes live per band, bottom first
                  "band_labels": [str, ...],    # one per band
                  "bands_by": "site" | "holder",
                  "band_sites": [int, ...]},    # site bands: the site of each band but the
                                                # last ("other"); holder bands: []
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
                    "holders": [str, ...], "stack": int}, ...],
     "block_holders": [[address, [str, ...]], ...],  # who holds a block live at the end
     "raised": str,                 # only when the traced code raised: "ValueError: boom"
     "samples": null | {"n": int, "data": col f8}}

A click on a band names the blocks live then whose ``band`` is that band, stacked in
(start, addr) order (a payload without ``band``: those whose site is the band's).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from jupyter_gpumem.data.codes import (
    BANDS,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_SITE,
    NO_STACK,
    SHOWN_FRAMES,
    SHOWN_OOMS,
)
from jupyter_gpumem.data.devices import (
    device_segments,
    device_total,
    device_trace,
    snapshot_device,
)
from jupyter_gpumem.data.holders import FREED, HOLDER_BANDS
from jupyter_gpumem.data.mapped import virtual_range
from jupyter_gpumem.data.ranking import SiteUse, band_groups, top_sites
from jupyter_gpumem.data.sites import cell_of, is_library_file, saved_cell_files, short_site
from jupyter_gpumem.data.timeline import (
    Intervals,
    SegmentLives,
    Timeline,
    band_values,
    build_timeline,
    cell_boundaries,
    downsample,
    holder_band_groups,
    live_intervals,
    oom_indices,
    segment_lives,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import BlockInfo, Frame, Snapshot

__all__ = ["BANDS", "COLUMN_DTYPES", "MAX_LIVES", "MAX_POINTS", "SAMPLE_FIELDS", "VIEW_SCHEMA",
           "Surviving", "build_view", "decode_column", "encode", "live_view", "samples_array",
           "samples_payload"]

#: Version of the view payload.
VIEW_SCHEMA = 2
#: Points of the timeline and rows of the samples, at most.
MAX_POINTS = 4000
#: Block lives, at most (past it: checkpoints).
MAX_LIVES = 20000
#: numpy dtype of each column dtype name; all little-endian, as the browser's typed arrays.
COLUMN_DTYPES = {"f8": "<f8", "i4": "<i4", "u1": "u1"}
#: Fields of one live sample, in the order of a samples row.
SAMPLE_FIELDS = ("t_s", "allocated", "reserved", "device_used")

_BLOCK_DTYPES = {"start": "i4", "end": "i4", "addr": "f8", "size": "f8", "requested": "f8",
                 "stack": "i4", "site": "i4", "cell": "i4", "band": "i4"}

Kind = Literal["trace", "snapshot", "live"]
Bands = Literal["site", "holder"]
Payload = dict[str, Any]
SampleRow = tuple[float, int, int, "int | None"]


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


# -- columns ------------------------------------------------------------------------------------

def _column(values: npt.ArrayLike, dtype: str = "f8") -> dict[str, Any]:
    arr = np.ascontiguousarray(values, dtype=COLUMN_DTYPES[dtype])
    return {"dtype": dtype, "data": arr.tobytes()}


def _is_column(value: Mapping[str, Any]) -> bool:
    return set(value) == {"dtype", "data"} and value["dtype"] in COLUMN_DTYPES


def encode(payload: Any, transport: Literal["bytes", "base64"]) -> Any:
    """``payload`` with every column's data as ``bytes`` or as a base64 string; a new object."""
    if isinstance(payload, Mapping):
        if _is_column(payload):
            data = payload["data"]
            raw = base64.b64decode(data) if isinstance(data, str) else bytes(data)
            out = raw if transport == "bytes" else base64.b64encode(raw).decode("ascii")
            return {"dtype": payload["dtype"], "data": out}
        return {k: encode(v, transport) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return [encode(v, transport) for v in payload]
    return payload


def decode_column(col: Mapping[str, Any]) -> npt.NDArray[Any]:
    """A column's array, from either transport (what the browser's decoder does)."""
    data = col["data"]
    raw = base64.b64decode(data) if isinstance(data, str) else bytes(data)
    return np.frombuffer(raw, dtype=COLUMN_DTYPES[col["dtype"]])


# -- the payload --------------------------------------------------------------------------------

def _stack(frames: Sequence[Frame],
           cell_files: Mapping[str, int] | None = None) -> list[list[Any]]:
    """The user's frames (no CuPy, numpy, IPython or other installed package, nothing outside
    the first module level) as ``[filename, line, name]`` triples, innermost first; the
    innermost three if none is the user's. A notebook cell's file is named ``cell [N]``."""
    user = [f for f in frames if not is_library_file(f["filename"])] or list(frames[:3])
    top = next((i for i, f in enumerate(user) if f["name"] == "<module>"), len(user) - 1)
    return [[_file_name(f["filename"], cell_files), f["line"], f["name"]]
            for f in user[:top + 1][:SHOWN_FRAMES]]


def _file_name(filename: str, cell_files: Mapping[str, int] | None) -> str:
    cell = cell_of(filename, cell_files)
    return filename if cell is None else f"cell [{cell}]"


def _points(max_points: int, *series: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Indices that draw every one of ``series`` (equal lengths) with at most ``max_points``
    points, keeping each bucket's minimum and maximum of each."""
    n = len(series[0])
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    # downsample(y, m) gives at most m + 2 points; the union of all stays within the bound.
    each = max(2, max_points // len(series) - 2)
    return np.unique(np.concatenate([downsample(y, each) for y in series])).astype(np.int64)


def _block_lives(tl: Timeline, iv: Intervals, groups: npt.NDArray[np.int32],
                 freed: int) -> dict[str, npt.NDArray[Any]]:
    """The lives of the blocks of the layout: the allocations seen in the trace and the blocks
    older than it that have an address (start -1), each until its address leaves the layout.
    A life's ``band`` is its interval's group (``groups``); ``freed`` for a block older than
    the trace whose free was requested before it (no interval: its bytes count in no band).

    That is at the ``free_completed`` of its free: the intervals end at ``free_requested``,
    when the bytes stop counting as allocated. A ``free_completed`` whose request came before
    the trace is one more block older than the trace."""
    n = len(tl)
    keep = iv.seen | (iv.addr != 0)
    start = np.where(iv.seen, iv.start, -1)[keep]
    end = iv.end[keep].copy()
    cols = {"addr": iv.addr[keep], "size": iv.size[keep], "requested": iv.requested[keep],
            "stack": iv.stack[keep], "site": iv.site[keep], "cell": iv.cell[keep],
            "band": groups[keep]}
    done = np.flatnonzero(tl.action == FREE_COMPLETED)
    at_request = end < n
    at_request[at_request] = tl.action[end[at_request]] == FREE_REQUESTED
    if len(done) and at_request.any():
        # The first free_completed of the same address after the request: one sorted key.
        _, inv = np.unique(np.concatenate([tl.addr[done], cols["addr"][at_request]]),
                           return_inverse=True)
        stride = n + 1
        done_key = inv[:len(done)].astype(np.int64) * stride + done
        order = np.argsort(done_key)
        done_key, done_sorted = done_key[order], done[order]
        req = end[at_request]
        req_addr = inv[len(done):].astype(np.int64)
        pos = np.searchsorted(done_key, req_addr * stride + req, side="right")
        hit = np.zeros(len(req), bool)
        found = pos < len(done_key)
        hit[found] = done_key[pos[found]] // stride == req_addr[found]
        req[hit] = done_sorted[pos[hit]]
        end[at_request] = req
    with_requests = bool(np.any(tl.action == FREE_REQUESTED))
    if with_requests:  # the free_completed events that end no life (a mask: setdiff1d sorts)
        ends = np.zeros(n + 1, bool)
        ends[end] = True
        orphans = done[~ends[done]]
    else:
        orphans = np.zeros(0, np.int64)
    k = len(orphans)
    start = np.concatenate([start, np.full(k, -1)]).astype(np.int64)
    end = np.concatenate([end, orphans]).astype(np.int64)
    extra: dict[str, npt.NDArray[Any]] = {"addr": tl.addr[orphans], "size": tl.block_size[orphans],
             "requested": tl.size[orphans], "stack": np.full(k, NO_STACK),
             "site": np.full(k, NO_SITE), "cell": np.full(k, NO_CELL),
             "band": np.full(k, freed)}
    out = {name: np.concatenate([col, extra[name]]) for name, col in cols.items()}
    return {"start": start, "end": end, **out}


def _live_at_any(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64],
                 checkpoints: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which lives hold at one of the sorted ``checkpoints`` (some c with start <= c < end)."""
    return (np.searchsorted(checkpoints, end, side="left")
            > np.searchsorted(checkpoints, start, side="left"))


def _bound_lives(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], n: int, peak: int,
                 max_lives: int) -> tuple[npt.NDArray[np.bool_], list[int] | None]:
    """Which lives to keep, and the checkpoints (None: all kept, exact everywhere).

    Past ``max_lives``: the blocks live at -1, the peak, the last event and evenly spaced
    events, halving the evenly spaced ones until the blocks fit. If the three fixed
    checkpoints alone hold too many, the largest-index lives are cut and no event is exact
    but the checkpoints still name where the layout is closest."""
    if len(start) <= max_lives:
        return np.ones(len(start), bool), None
    fixed = {-1, peak, n - 1}
    spread = min(n, 1024)
    while True:
        spaced = np.linspace(-1, n - 1, spread + 2).round().astype(np.int64).tolist()
        cps = np.array(sorted(fixed | set(spaced if spread else [])), np.int64)
        keep = _live_at_any(start, end, cps)
        if keep.sum() <= max_lives or spread == 0:
            break
        spread //= 2
    if keep.sum() > max_lives:
        keep[np.flatnonzero(keep)[max_lives:]] = False
    return keep, [int(c) for c in cps]


def build_view(snapshot: Snapshot, *, kind: Kind = "trace", device: int | None = None,
               title: str = "", timeline: Timeline | None = None,
               cell_files: Mapping[str, int] | None = None,
               sites: Sequence[SiteUse] | None = None,
               surviving: Sequence[Surviving] = (),
               samples: Sequence[SampleRow] | npt.NDArray[np.float64] | None = None,
               max_points: int = MAX_POINTS, max_lives: int = MAX_LIVES, top: int = 8,
               bands: Bands = "site", holders: Mapping[int, Sequence[str]] | None = None,
               binary: bool = False) -> Payload:
    """The view payload of ``snapshot``'s trace and segments on ``device``.

    ``timeline`` reuses one built from the same snapshot and device; ``cell_files`` (a cell's
    source file name -> its number) names sites ``cell [N] line L``. ``sites`` are the top
    sites at the peak (default: ranked here, ten); ``surviving`` the blocks the traced code left
    live; ``samples`` the live series (rows ``SAMPLE_FIELDS``). ``top`` sites get a timeline
    band each with ``bands="site"``; ``bands="holder"`` makes the bands by holder (see the
    module docstring), a block's holders being its ``surviving`` entry's, or ``holders``
    (address -> names, for blocks older than the trace too) where that names it; a block with
    holders of several roles takes the first in ``HOLDER_ROLES``. Columns are ``bytes`` with
    ``binary``, else base64 strings."""
    if bands not in BANDS:
        raise ValueError(f"bands must be one of {BANDS}, got {bands!r}")
    if max_points < 8 or max_lives < 1:
        raise ValueError(f"max_points must be >= 8 and max_lives >= 1, got {max_points}, "
                         f"{max_lives}")
    device = snapshot_device(snapshot, device)
    cell_files = saved_cell_files(snapshot, cell_files)
    tl = (timeline if timeline is not None
          else build_timeline(snapshot, device, cell_files=cell_files))
    n = len(tl)
    info = snapshot.get("jupyter_gpumem") or {}
    iv = live_intervals(tl)
    top_alloc = int(tl.allocated.max()) if n else tl.start_allocated
    peak = -1 if top_alloc <= tl.start_allocated else int(tl.allocated.argmax())

    at = _points(max_points, tl.allocated, tl.reserved)
    if bands == "site":
        chosen, groups = band_groups(iv, peak, top)
        lives = _block_lives(tl, iv, groups, len(chosen))
        labels = [short_site(tl.sites[s]) for s in chosen] + ["other"]
    else:
        chosen = []
        held = {b.address: b.holders for b in surviving}
        held.update(holders or {})
        groups = holder_band_groups(iv, n, held)
        lives = _block_lives(tl, iv, groups, HOLDER_BANDS.index(FREED))
        # Leave out the bands no block is in; renumber the rest, bottom first.
        used = np.unique(np.concatenate([groups, lives["band"]])).astype(np.int32)
        renumber = np.full(len(HOLDER_BANDS), -1, np.int32)
        renumber[used] = np.arange(len(used), dtype=np.int32)
        groups = renumber[groups]
        lives["band"] = renumber[lives["band"]]
        labels = [HOLDER_BANDS[g] for g in used]
    values = band_values(iv, groups, len(labels), n, at)

    bounded, checkpoints = _bound_lives(lives["start"], lives["end"], n, peak, max_lives)
    sl = segment_lives(tl, device_segments(snapshot, device), device_trace(snapshot, device))

    stack_ids = {_key(s): k for k, s in enumerate(tl.stacks)}
    stacks = [_stack(s, cell_files) for s in tl.stacks]

    def stack_of(frames: Sequence[Frame]) -> int:
        if not frames:
            return NO_STACK
        key = _key(frames)
        if key not in stack_ids:
            stack_ids[key] = len(stacks)
            stacks.append(_stack(frames, cell_files))
        return stack_ids[key]

    if sites is None:
        sites = [SiteUse(short_site(u.site), u.bytes, u.count)
                 for u in top_sites(tl, iv, peak, 10)]
    ooms = oom_indices(tl)
    payload: Payload = {
        "schema": VIEW_SCHEMA,
        "kind": kind,
        "title": title,
        "device": device,
        "device_name": str(info.get("device_name", "")),
        "n_events": n,
        "start_allocated": tl.start_allocated,
        "start_reserved": tl.start_reserved,
        "timeline": {
            "index": _column(at, "i4"),
            "time_us": _column(tl.time_us[at]),
            "allocated": _column(tl.allocated[at]),
            "reserved": _column(tl.reserved[at]),
            "bands": [_column(v) for v in values],
            "band_labels": labels,
            "bands_by": bands,
            "band_sites": list(chosen),
        },
        "peak": {"index": peak, "allocated": top_alloc,
                 "reserved": max(int(tl.reserved.max()) if n else 0, tl.start_reserved)},
        "ooms": ooms[:SHOWN_OOMS].tolist(),
        "n_ooms": len(ooms),
        "cells": [list(b) for b in cell_boundaries(tl)],
        "lives": {
            "blocks": {name: _column(col[bounded], _BLOCK_DTYPES[name])
                       for name, col in lives.items()},
            "segments": {
                "start": _column(sl.start, "i4"), "end": _column(sl.end, "i4"),
                "addr": _column(sl.addr), "size": _column(sl.size),
                "stream": _column(sl.stream), "small": _column(sl.small, "u1"),
                "expandable": _column(sl.expandable, "u1"), "group": _column(sl.group, "i4"),
                "range": _column(_ranges(sl, device_total(snapshot, device))),
            },
            "checkpoints": checkpoints,
            "dropped": int(len(bounded) - bounded.sum()),
        },
        "stacks": stacks,
        "sites": [short_site(s) for s in tl.sites],
        "top_sites": [{"site": u.site, "bytes": u.bytes, "count": u.count} for u in sites],
        "surviving": [{"address": b.address, "size": b.size, "requested": b.requested,
                       "site": b.site, "holders": list(b.holders), "stack": stack_of(b.frames)}
                      for b in surviving],
        "block_holders": _block_holders(surviving, holders, [
            b for seg in device_segments(snapshot, device) for b in seg["blocks"]
            if b["state"] == "active_allocated"]),
        "samples": None if samples is None else samples_payload(samples, max_points),
    }
    return payload if binary else encode(payload, "base64")


def _block_holders(surviving: Sequence[Surviving], holders: Mapping[int, Sequence[str]] | None,
                   end_blocks: Sequence[BlockInfo]) -> list[list[Any]]:
    """``[address, names]`` of each block allocated at the end that something is known to
    hold (``holders``, else its ``surviving`` entry), in address order."""
    known: dict[int, list[str]] = {b.address: list(b.holders) for b in surviving if b.holders}
    known.update({a: list(h) for a, h in (holders or {}).items() if h})
    live = {int(b["address"]) for b in end_blocks}
    return [[a, known[a]] for a in sorted(known) if a in live]


def _ranges(sl: SegmentLives, total: int) -> npt.NDArray[np.float64]:
    """The virtual bytes each expandable segment reserves (0: classic, or the device's size
    unknown)."""
    if not total:
        return np.zeros(len(sl), np.float64)
    big, small = virtual_range(total, small=False), virtual_range(total, small=True)
    return np.where(sl.expandable, np.where(sl.small, small, big), 0).astype(np.float64)


def _key(frames: Sequence[Frame]) -> tuple[tuple[str, int, str], ...]:
    return tuple((f["filename"], f["line"], f["name"]) for f in frames)


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
    return {"n": len(arr), "data": _column(arr.ravel())}


def live_view(samples: Sequence[SampleRow] | npt.NDArray[np.float64], *, title: str = "",
              device: int = 0, device_name: str = "", max_points: int = MAX_POINTS,
              binary: bool = False) -> Payload:
    """The payload of a live view with only its sampled series (kind ``live``)."""
    payload = build_view({"segments": [], "device_traces": []}, kind="live", device=device,
                         title=title, samples=samples, max_points=max_points, binary=True)
    payload["device_name"] = device_name
    return payload if binary else encode(payload, "base64")
