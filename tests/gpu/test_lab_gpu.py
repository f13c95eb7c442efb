"""The channel to JupyterLab's panel and badges with real CuPy arrays on a CUDA device (skipped
where none is visible): a cell's badge, the pushed samples, and the device's parts as NVML and
CUDA give them (printed with ``-s`` for the run's log)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lab_comms import RecordingLayer

from jupyter_gpumem.notebook import lab_channel
from jupyter_gpumem.notebook.extension import get_extension

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch, shell: Any, run: Any) -> Any:
    from jupyter_gpumem.runtime import binding

    layer = RecordingLayer()
    monkeypatch.setattr(lab_channel, "comm_layer", lambda _shell: layer)
    result, out = run("%load_ext jupyter_gpumem")
    assert result.success, out.stderr
    assert binding.installed()
    ext = get_extension(shell)
    ext.settings.live_view = False
    ext.lab.interval_s, ext.lab.send_every_s = 0.05, 0.2
    run("import cupy as cp, time")
    (comm,) = layer.opened
    comm.sent.clear()
    yield comm
    run("%unload_ext jupyter_gpumem")
    assert comm.closed_with == {"reason": "unload"}


def test_badge_samples_and_device_with_cupy(lab: Any, run: Any) -> None:
    import cupy

    result, _ = run("x = cp.ones((1 << 20,), dtype=cp.float32)\ncp.cuda.Device().synchronize()\n"
                    "time.sleep(0.6)")
    assert result.success
    kinds = [m["type"] for m in lab.sent]
    assert kinds[-1] == "cell" and "samples" in kinds
    cell = lab.sent[-1]
    (record,) = cell["badge"]["records"]
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    assert record["source"] == "cupy" and record["device_name"] == name
    assert record["allocated_delta"] == record["peak_allocated"] == 4 * MiB
    assert record["holders"] == "x (4.0 MiB)"
    (device,) = cell["devices"]
    free, total = cupy.cuda.runtime.memGetInfo()
    assert device["total"] == total and abs(device["free"] - free) <= 64 * MiB
    assert device["sources"] == [{"source": "cupy", "allocated": 4 * MiB,
                                  "reserved": device["sources"][0]["reserved"]}]
    assert device["sources"][0]["reserved"] >= 4 * MiB
    # used = ours + other processes + the rest of this process (CUDA context, cuBLAS ...);
    # nothing used is left out (NVML may count this process among the others in a container)
    others = device["other_processes"] or 0
    assert device["rest_of_process"] >= 0
    assert device["rest_of_process"] + others + device["sources"][0]["reserved"] >= (
        device["total"] - device["free"])
    print("device parts:", json.dumps(device))
    rows = [r for m in lab.sent for r in m["lanes"].get("cupy:0", [])]
    assert any(r[1] == 4 * MiB for r in rows) and all(r[3] is not None for r in rows)
    run("del x")
