from __future__ import annotations

import pytest
from render_workload import MiB, two_device_snapshot

from jupyter_gpumem.data.devices import device_segments, device_trace, snapshot_device
from jupyter_gpumem.data.replay import replay_segments
from jupyter_gpumem.data.timeline import build_timeline


def _segment(device: int, address: int) -> dict:
    return {"device": device, "address": address, "total_size": 2 * MiB, "blocks": []}


def test_the_rule_in_order() -> None:
    snap: dict = {"segments": [_segment(2, 0x100), _segment(3, 0x200)],
                  "device_traces": [[], [], [], [], [{"action": "alloc"}]]}
    assert snapshot_device(snap, 3) == 3  # 1. the argument
    assert snapshot_device({**snap, "jupyter_gpumem": {"device": 1}}) == 1  # 2. its own
    assert snapshot_device(snap) == 4  # 3. the device with trace events
    assert snapshot_device({**snap, "device_traces": [[], []]}) == 2  # 4. with segments
    assert snapshot_device({"segments": [], "device_traces": []}) == 0  # 5. else 0
    with pytest.raises(ValueError, match="device index"):
        snapshot_device(snap, -1)


def test_two_devices_history_on_one() -> None:
    snap, old = two_device_snapshot()
    assert snapshot_device(snap) == 1
    assert device_trace(snap, 0) == [] and device_trace(snap, 1)
    assert {s["device"] for s in device_segments(snap, 1)} == {1}
    tl = build_timeline(snap)
    assert tl.start_allocated == 5 * MiB  # the block older than the trace
    assert tl.old.addr.tolist() == [old]
    start = replay_segments(snap, 0)  # the same device by default
    assert [b["address"] for s in start for b in s["blocks"]
            if b["state"] == "active_allocated"] == [old]
