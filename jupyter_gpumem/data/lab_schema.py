"""What the kernel tells JupyterLab's GPU memory panel and cell badges, and what a notebook keeps
of it: the shapes, one home for both sides (``labextension/src/lab/schema.ts`` mirrors them, and a
test reads its constants against these).

The kernel side (``notebook.lab_channel``) talks through one comm target, ``COMM_TARGET``:

- ``StateMessage``: everything at once, when a frontend connects (``hello``) or the extension
  loads (the data of the comm it opens);
- ``SamplesMessage``: while a cell runs, at most two a second, the samples taken since the last
  one (a few rows per lane);
- ``CellMessage``: when a cell ends, its badge (one ``BadgeRecord`` a memory source read), its
  span on the session's time axis, the last samples, the devices and the sources.

The browser never asks while the kernel is busy; it says ``{"type": "hello"}`` once when it
attaches to the comm, and the kernel answers with a ``StateMessage``.

What a notebook keeps (written by the frontend; nbformat and papermill users read it with
``read_badges``): each executed cell's ``metadata["jupyter_gpumem"]``, a ``CellBadge``; and the
notebook's ``metadata["jupyter_gpumem"]``, a ``NotebookRecord``: the session's timeline at most
``SAVED_POINTS`` rows a lane, the last ``SAVED_SPANS`` cells' spans, the devices and sources at
the last cell.

The session's time axis (``t`` of a sample, ``start``/``end`` of a span) is seconds spent running
cells since the extension loaded, idle time between cells left out, each cell at least
``MIN_CELL_S`` wide (Note [Session time] in ``notebook.session_series``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

__all__ = ["COMM_TARGET", "LAB_SCHEMA", "METADATA_KEY", "MIN_CELL_S", "SAVED_POINTS",
           "SAVED_SPANS", "BadgeRecord", "CellBadge", "CellEntry", "CellMessage", "CellSpan",
           "DeviceUse", "Lane", "NotebookRecord", "SampleRow", "SamplesMessage", "SourceInfo",
           "SourceUse", "StateMessage", "read_badges"]

#: The comm target the extension registers at ``%load_ext`` (and opens a comm to, announcing
#: itself).
COMM_TARGET = "jupyter_gpumem.lab"
#: The key of our metadata, in a cell's metadata and in the notebook's.
METADATA_KEY = "jupyter_gpumem"
#: Version of these shapes; a reader skips what has another.
LAB_SCHEMA = 1
#: The narrowest a cell is on the session's time axis (seconds).
MIN_CELL_S = 0.2
#: Rows a lane keeps in a notebook's metadata (the extremes of each bucket kept).
SAVED_POINTS = 1000
#: Cells' spans a notebook's metadata keeps (the last ones).
SAVED_SPANS = 500

#: One sample: session seconds, allocated bytes, reserved bytes, bytes used on the device by
#: every process (None where the source cannot say).
SampleRow = tuple[float, int, int, "int | None"]


# -- a cell's badge (cell metadata) -----------------------------------------------------------

class BadgeRecord(TypedDict):
    """What one cell did to one memory source: a ledger row (``CellRecord``), as the badge shows
    it."""

    source: str  # the memory source: "cupy" (our allocator), "torch", "jax", a third party's
    device: int  # the device index
    device_name: str  # "NVIDIA H200", "Simulated GPU 0"
    allocated_delta: int  # allocated bytes after the cell minus before it
    reserved_delta: int  # reserved bytes after the cell minus before it
    peak_allocated: int  # the highest allocated bytes while the cell ran
    peak_exact: bool  # False when peak_allocated is only an upper bound
    ooms: int  # out-of-memory errors raised while the cell ran
    #: who holds what the cell left behind, as the footer says it (``x (64.0 MiB), ...``); ""
    #: when it left nothing
    holders: str
    wall_s: float  # wall-clock seconds the cell took


class CellBadge(TypedDict):
    """A cell's ``metadata["jupyter_gpumem"]``: what its last run did to GPU memory."""

    version: int  # LAB_SCHEMA
    execution_count: int  # the run it is of (a badge of an older run shows dimmed)
    records: list[BadgeRecord]  # one a memory source read while the cell ran


# -- the session --------------------------------------------------------------------------------

class Lane(TypedDict):
    """The sampled series of one memory source on one device."""

    key: str  # "cupy:0": the source and the device index
    source: str
    device: int
    device_name: str
    samples: list[list[float | None]]  # rows of SampleRow, oldest first


class CellSpan(TypedDict):
    """Where one cell ran on the session's time axis."""

    cell: int  # its execution count
    cell_id: str | None  # the notebook cell's id (nbformat 4.5), None when run from elsewhere
    msg_id: str | None  # the execute request's message id
    start: float  # session seconds when it began
    end: float | None  # ... and ended; None while it runs


class SourceUse(TypedDict):
    """One memory source's share of a device."""

    source: str
    allocated: int
    reserved: int  # allocated plus cached free blocks


class DeviceUse(TypedDict):
    """Where a device's memory is: the sources read (ours and other libraries'), the rest of this
    process (CUDA context, libraries no source reads), other processes, free."""

    device: int
    device_name: str
    total: int | None  # None where no source can say
    free: int | None
    sources: list[SourceUse]
    other_processes: int | None  # bytes other processes hold, None where unknown (no NVML)
    #: used bytes that are neither a source's reserved memory nor another process's
    rest_of_process: int | None


class SourceInfo(TypedDict):
    """A memory source the views read, and how it is set."""

    name: str
    title: str
    history: str  # "history on", "history: lines of live blocks only" ...
    notes: list[str]
    #: the allocator config (``key:value,...``, "" for the defaults); None: not known
    config: str | None


class StateMessage(TypedDict):
    """Everything the kernel knows, sent when a frontend attaches."""

    type: Literal["state"]
    version: int
    running: bool  # a cell runs now
    lanes: list[Lane]
    spans: list[CellSpan]
    cells: list[CellEntry]  # the badges of the last cells, with the cell each is for
    devices: list[DeviceUse]
    sources: list[SourceInfo]


class SamplesMessage(TypedDict):
    """Samples taken since the last message, by lane key."""

    type: Literal["samples"]
    lanes: dict[str, list[list[float | None]]]
    #: lanes first seen in these samples, without their rows (a source picked in the cell)
    new_lanes: NotRequired[list[Lane]]


class CellEntry(TypedDict):
    """A cell's badge, and the cell it is for."""

    cell_id: str | None  # the notebook cell's id, None when run from elsewhere (a console)
    msg_id: str | None  # the execute request's message id
    badge: CellBadge | None  # None: no memory source could be read while it ran


class CellMessage(CellEntry):
    """A cell that ended: its badge, and what changed with it."""

    type: Literal["cell"]
    span: CellSpan
    #: the samples since the last message (as ``SamplesMessage.lanes``), the cell's end among them
    lanes: NotRequired[dict[str, list[list[float | None]]]]
    new_lanes: NotRequired[list[Lane]]
    devices: NotRequired[list[DeviceUse]]
    sources: NotRequired[list[SourceInfo]]


# -- what a notebook keeps (notebook metadata) ----------------------------------------------------

class NotebookRecord(TypedDict):
    """The notebook's ``metadata["jupyter_gpumem"]``: the panel's view of the last session, for a
    reader with no kernel."""

    version: int
    lanes: list[Lane]  # at most SAVED_POINTS rows each
    spans: list[CellSpan]  # the last SAVED_SPANS cells
    devices: list[DeviceUse]
    sources: list[SourceInfo]


def read_badges(notebook: Mapping[str, Any]) -> dict[str, CellBadge]:
    """The badges a saved notebook (nbformat's dict, or its JSON) keeps, by cell id: the cells
    whose ``metadata["jupyter_gpumem"]`` is a ``CellBadge`` of this version. A cell without an id
    (nbformat before 4.5) is keyed by its position, ``"#3"``."""
    out: dict[str, CellBadge] = {}
    for i, cell in enumerate(notebook.get("cells") or []):
        meta = cell.get("metadata") or {}
        badge = meta.get(METADATA_KEY)
        if (isinstance(badge, Mapping) and badge.get("version") == LAB_SCHEMA
                and isinstance(badge.get("records"), list)):
            out[str(cell.get("id") or f"#{i}")] = badge  # type: ignore[assignment]
    return out
