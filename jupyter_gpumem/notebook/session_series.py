"""The session's samples for JupyterLab's panel: a bounded series a memory source and device
(a *lane*), on the session's time axis, and where each cell ran on it.

``SessionSeries`` is plain data and arithmetic, with no thread and no comm: ``lab_channel`` takes
its samples (at a cell's start and end, and a few a second while it runs) and sends what is new.
A lane keeps at most ``max_points`` rows: past twice that, it is cut back to ``max_points`` by
keeping each bucket's lowest and highest allocated and reserved rows (``data.timeline.downsample``,
as the live view's saved curve), so the peak survives any length of session. The spans of the
last ``max_spans`` cells are kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from jupyter_gpumem.data.lab_schema import MIN_CELL_S, CellSpan, Lane, SampleRow

__all__ = ["MAX_SPANS", "SessionClock", "SessionSeries", "lane_key"]

#: The cells' spans the series keeps.
MAX_SPANS = 500


def lane_key(source: str, device: int) -> str:
    """``"cupy:0"``: the lane of a source on a device."""
    return f"{source}:{device}"


class SessionClock:
    """Note [Session time]: seconds spent running cells, idle time left out, each cell at least
    ``min_cell_s`` wide. ``clock`` gives seconds (``time.perf_counter``)."""

    def __init__(self, clock: Callable[[], float], min_cell_s: float = MIN_CELL_S) -> None:
        self._clock = clock
        self.min_cell_s = min_cell_s
        self._offset = 0.0  # session time at the end of the last cell
        self._started: float | None = None  # the clock when the running cell began

    @property
    def running(self) -> bool:
        return self._started is not None

    def now(self) -> float:
        """Session seconds now (the end of the last cell, between cells)."""
        if self._started is None:
            return self._offset
        return self._offset + max(0.0, self._clock() - self._started)

    def start_cell(self) -> float:
        """A cell begins: its start on the axis (a cell still running is ended first)."""
        if self._started is not None:
            self.end_cell()
        self._started = self._clock()
        return self._offset

    def end_cell(self) -> float:
        """The running cell ends: its end on the axis, at least ``min_cell_s`` after its start."""
        if self._started is None:
            return self._offset
        end = max(self.now(), self._offset + self.min_cell_s)
        self._offset, self._started = end, None
        return end


@dataclass
class _Lane:
    source: str
    device: int
    device_name: str
    rows: list[SampleRow] = field(default_factory=list)
    sent: int = 0  # rows[:sent] went to the frontends (reset when the rows are cut back)


class SessionSeries:
    """Samples by lane and cells' spans, bounded (see the module docstring)."""

    def __init__(self, max_points: int = 4000, max_spans: int = MAX_SPANS) -> None:
        if max_points < 8:
            raise ValueError(f"max_points must be >= 8, got {max_points}")
        self.max_points = max_points
        self._lanes: dict[str, _Lane] = {}
        self._new_lanes: list[str] = []  # lanes not yet announced to the frontends
        self.spans: deque[CellSpan] = deque(maxlen=max_spans)

    # -- samples -----------------------------------------------------------------------------

    def add(self, source: str, device: int, device_name: str, row: SampleRow) -> None:
        """Add one sample to the lane of ``source`` on ``device``; a sample at the same time as
        the lane's last one replaces it (a cell's start, right after the last one's end)."""
        key = lane_key(source, device)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(source, device, device_name)
            self._new_lanes.append(key)
        rows = lane.rows
        if rows and row[0] <= rows[-1][0]:
            rows[-1] = (rows[-1][0], row[1], row[2], row[3])
            lane.sent = min(lane.sent, len(rows) - 1)
        else:
            rows.append(row)
        if len(rows) > 2 * self.max_points:
            unsent = len(rows) - lane.sent
            lane.rows = _cut_back(rows, self.max_points)
            # the frontends cut their own copy; the rows not sent yet are the last ones (a
            # frontend passes over a row older than its last)
            lane.sent = max(0, len(lane.rows) - unsent)

    def take_new(self) -> tuple[dict[str, list[list[float | None]]], list[Lane]]:
        """The rows not sent yet, by lane key, and the lanes not announced yet (without rows):
        the content of a samples message. Marks them sent."""
        out: dict[str, list[list[float | None]]] = {}
        for key, lane in self._lanes.items():
            if lane.sent < len(lane.rows):
                out[key] = [list(r) for r in lane.rows[lane.sent:]]
                lane.sent = len(lane.rows)
        new = [self._lane(key, rows=False) for key in self._new_lanes]
        self._new_lanes = []
        return out, new

    def lanes(self) -> list[Lane]:
        """Every lane with its rows, at most ``max_points`` of them (a lane kept longer, until
        it is cut back, is cut for this copy). Marks nothing sent: the other frontends still
        get the rows new to them."""
        return [self._lane(key) for key in self._lanes]

    def _lane(self, key: str, *, rows: bool = True) -> Lane:
        lane = self._lanes[key]
        kept = lane.rows if len(lane.rows) <= self.max_points else _cut_back(lane.rows,
                                                                            self.max_points)
        return {"key": key, "source": lane.source, "device": lane.device,
                "device_name": lane.device_name,
                "samples": [list(r) for r in kept] if rows else []}

    def mark_peak(self, source: str, device: int, start: float, peak: int) -> bool:
        """Note [A cell's peak between samples]: the cell that began at ``start`` and whose end
        is the lane's last row peaked at ``peak`` allocated bytes; if no row of it reached that,
        add one between its last two rows. Whether it added one."""
        lane = self._lanes.get(lane_key(source, device))
        rows = lane.rows if lane is not None else []
        if lane is None or not rows or rows[-1][0] <= start:
            return False
        inside = [r for r in rows[-64:] if r[0] >= start]
        if max(r[1] for r in inside) >= peak:
            return False
        end = rows[-1]
        before = rows[-2][0] if len(rows) >= 2 and rows[-2][0] >= start else start
        t = round((before + end[0]) / 2, 4)
        if not before < t < end[0]:
            return False
        rows.insert(len(rows) - 1, (t, peak, max(end[2], peak), end[3]))
        lane.sent = min(lane.sent, len(rows) - 2)
        return True

    def rows(self, key: str) -> list[SampleRow]:
        """The rows of lane ``key`` (empty for an unknown lane)."""
        lane = self._lanes.get(key)
        return list(lane.rows) if lane is not None else []

    # -- cells -------------------------------------------------------------------------------

    def start_span(self, cell: int, cell_id: str | None, msg_id: str | None, start: float
                   ) -> CellSpan:
        span: CellSpan = {"cell": cell, "cell_id": cell_id, "msg_id": msg_id, "start": start,
                          "end": None}
        self.spans.append(span)
        return span

    def end_span(self, end: float) -> CellSpan | None:
        """End the last span, if it still runs; it, or None."""
        if self.spans and self.spans[-1]["end"] is None:
            self.spans[-1]["end"] = end
            return self.spans[-1]
        return None


def _cut_back(rows: list[SampleRow], max_points: int) -> list[SampleRow]:
    """At most ``max_points`` of ``rows``, keeping each bucket's extremes of allocated and
    reserved, and the first and last row."""
    import numpy as np

    from jupyter_gpumem.data.timeline import downsample

    each = max(2, max_points // 2 - 2)  # two series, each at most each + 2 points
    picks: Iterable[int] = np.unique(np.concatenate([
        downsample(np.array([r[k] for r in rows], np.int64), each) for k in (1, 2)]))
    return [rows[int(i)] for i in picks]


# Note [A cell's peak between samples]: samples are taken at a cell's start and end and every
# ``INTERVAL_S`` while it runs, so a cell that allocates and frees within 0.2 s (a temporary)
# leaves no sample at its peak, and the session's curve would never show it. The ledger knows
# each cell's own peak (exact for our allocator: a watermark a cell), so at the cell's end a row
# at that peak is put between the cell's last two samples (reserved: at least the peak, as the
# end's; the device's use: the end's). A peak that is only a bound (a source whose counters
# cannot tell) is not drawn.

# Note [Session time]: the panel draws a session that may last days, with cells of milliseconds
# and of hours, and idle time between them. On the wall clock, the cells would be slivers at the
# idle gaps' edges. So the axis is the time spent running cells: it stands still between cells,
# and a cell shorter than ``MIN_CELL_S`` (one sample's interval) is given that much room, so
# that every cell can be seen and clicked. Samples inside a cell are at their true pace.
