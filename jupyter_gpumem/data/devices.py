"""Which device of a snapshot a view shows, decided by one rule for every view.

A snapshot may hold several devices (``api.snapshot()`` with more than one allocator): segments
carry their ``device``, and ``device_traces`` has one trace per device index. The timeline, the
HTML page, the widget, the plots and ``analyze`` all show one device, chosen by
``snapshot_device``, so that the trace they draw and the segments they lay out belong together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.sizes import INT64_MAX

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import SegmentInfo, Snapshot, TraceEntry


def snapshot_device(snapshot: Snapshot, device: int | None = None) -> int:
    """The device a view of ``snapshot`` shows:

    1. ``device``, when given;
    2. else the device the snapshot says it is of (``jupyter_gpumem["device"]``, written by one
       allocator's ``snapshot()``);
    3. else the lowest device with trace events;
    4. else the lowest device with segments;
    5. else 0.
    """
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ValueError(f"device must be a device index (an int >= 0), got {device!r}")
        return device
    own = (snapshot.get("jupyter_gpumem") or {}).get("device")
    if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
        return own
    traced = next((i for i, t in enumerate(snapshot.get("device_traces") or []) if t), None)
    if traced is not None:
        return traced
    segmented = [s.get("device", 0) for s in snapshot.get("segments") or []]
    return min(segmented, default=0)


def device_trace(snapshot: Snapshot, device: int) -> Sequence[TraceEntry]:
    """The trace of ``device`` ([] if the snapshot has none for it)."""
    traces = snapshot.get("device_traces") or []
    return traces[device] if 0 <= device < len(traces) else []


def device_segments(snapshot: Snapshot, device: int) -> list[SegmentInfo]:
    """The segments of ``device``, in the snapshot's order (a segment without ``device`` is
    taken to be on the device asked for)."""
    return [s for s in snapshot.get("segments") or [] if s.get("device", device) == device]


def device_total(snapshot: Snapshot, device: int) -> int:
    """The bytes of ``device`` as a snapshot of ours records them (one allocator's
    ``jupyter_gpumem["device_total"]``, or that device's entry of several), else 0.

    ValueError, naming the field, for a total above 2**63 - 1 B: no device the allocator models
    is larger (Note [Sizes near 2**63] in ``engine/stats``)."""
    info: Any = snapshot.get("jupyter_gpumem") or {}
    where = "jupyter_gpumem"
    devices = info.get("devices") if isinstance(info, dict) else None
    if isinstance(devices, dict):
        info = devices.get(str(device)) or {}
        where = f"jupyter_gpumem.devices[{str(device)!r}]"
    elif isinstance(info, dict) and info.get("device", device) != device:
        return 0
    total = info.get("device_total") if isinstance(info, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        return 0
    _check_total(where, total)
    return total


def _check_total(where: str, total: int) -> None:
    if total > INT64_MAX:
        shown = f"{total} B" if total.bit_length() <= 128 else f"{total.bit_length()} bits"
        raise ValueError(f"{where}.device_total: {shown} is more than 2**63 - 1 B, the largest "
                         "device the allocator models")
