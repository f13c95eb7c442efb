"""What runs on a worker when the client gathers: small functions sent by ``client.run``.

Each answers for the worker's current device on the plugin's backend and returns plain data
(dicts of ints and strings, snapshots), never allocator objects. A worker without the plugin
raises ``NoPluginError``, which the gathering side reports for that worker.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from jupyter_gpumem.api import memory_summary as local_summary
from jupyter_gpumem.dask.labels import relabel_trace
from jupyter_gpumem.dask.plugin import process_state
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.runtime import registry


class NoPluginError(RuntimeError):
    """The worker has no GpuMemPlugin set up."""


def _allocator(device: int | None) -> CachingAllocator:
    if process_state() is None:
        raise NoPluginError("no GpuMemPlugin on this worker: register it with "
                            "client.register_plugin(jupyter_gpumem.dask.GpuMemPlugin())")
    return registry.get_allocator(device)


def gpu_info(allocator: CachingAllocator) -> dict[str, Any]:
    """The worker's GPU: its name, index in the worker's process, total bytes, the
    CUDA_VISIBLE_DEVICES the worker runs with (dask-cuda rotates it), the backend, host, pid."""
    return {
        "name": allocator.device.name,
        "index": allocator.device.index,
        "total": allocator.device.mem_get_info()[1],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "backend": registry.backend(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def worker_stats(device: int | None = None) -> dict[str, Any]:
    """``{"gpu": gpu_info, "stats": memory_stats()}``: a few kilobytes."""
    allocator = _allocator(device)
    return {"gpu": gpu_info(allocator), "stats": allocator.memory_stats()}


def worker_summary(device: int | None = None) -> dict[str, Any]:
    """``{"gpu": gpu_info, "summary": memory_summary()}``."""
    allocator = _allocator(device)
    return {"gpu": gpu_info(allocator), "summary": local_summary(allocator.device.index)}


def worker_snapshot(device: int | None = None) -> Snapshot:
    """The worker's snapshot, its task labels turned into ``task`` indexes into
    ``snapshot["jupyter_gpumem"]["tasks"]`` (Note [Task labels]), with its GPU."""
    allocator = _allocator(device)
    snap = allocator.snapshot(mark=False)  # a gather logs no event in the worker's history
    state = process_state()
    assert state is not None
    labels: list[list[str]] = []
    index: dict[tuple[str, ...], int] = {}
    snap["device_traces"] = [relabel_trace(trace, state.labels.label_of, labels, index)
                             for trace in snap["device_traces"]]
    extra = snap.setdefault("jupyter_gpumem", {})
    extra["tasks"] = labels
    extra["gpu"] = gpu_info(allocator)
    return snap


def start_history(max_entries: int, stacks: bool, device: int | None = None,
                  trace: str = "") -> bool:
    """Record history afresh on the worker's device (the task labels start over too), for the
    cluster trace named ``trace``."""
    allocator = _allocator(device)
    state = process_state()
    assert state is not None
    allocator.record_history(True, stacks=stacks, max_entries=max_entries, clear=True)
    state.labels.clear()
    state.trace = trace
    return True


def stop_history(device: int | None = None, trace: str = "") -> bool:
    """Stop recording on the worker's device; with ``trace``, only if that cluster trace is the
    last one started here (a stop that arrives late, after a worker resumed, stops no newer
    trace). Whether it stopped."""
    allocator = _allocator(device)
    state = process_state()
    if trace and (state is None or state.trace != trace):
        return False
    allocator.record_history(False)
    return True


def plugin_info() -> dict[str, Any] | None:
    """The plugin's state on this worker, None without one."""
    state = process_state()
    if state is None:
        return None
    return {"device": state.device, "users": state.users, "backend": registry.backend(),
            "recording": [a.recording for a in registry.allocators().values()],
            "running": state.labels.running()}
