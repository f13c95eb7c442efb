"""Task labels, the plugin's setup and teardown in this process, and merging worker snapshots:
no cluster needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.dask import GpuMemPlugin, merge_snapshots
from jupyter_gpumem.dask.labels import TASK_BASE, TaskLabels, relabel_trace
from jupyter_gpumem.dask.tasks import NO_TASK_LABEL, top_tasks
from jupyter_gpumem.dask.worker import plugin_info, worker_snapshot, worker_stats
from jupyter_gpumem.data.codes import NO_CELL
from jupyter_gpumem.data.columns import plain_snapshot
from jupyter_gpumem.data.schema import check_snapshot
from jupyter_gpumem.runtime import binding, registry

MiB = 1 << 20
# keys as Dask makes them: a prefix and a token
MATMUL = "matmul-8c1a6f0e2b9d4c7a9f3e1d2c4b5a6978"
SAMPLE_B = "random_sample-0f9e8d7c6b5a49382716a5b4c3d2e1f0"
SAMPLE_C = "random_sample-1234567890abcdef1234567890abcdef"
ROOT = Path(__file__).resolve().parents[2]


def _labelled(allocator: CachingAllocator) -> tuple[TaskLabels, list[list[str]]]:
    labels = TaskLabels(lambda: [allocator])
    return labels, []


def _tasks_of_allocs(allocator: CachingAllocator, labels: TaskLabels) -> list[object]:
    out: list[list[str]] = []
    trace = relabel_trace(allocator.snapshot()["device_traces"][0], labels.label_of, out, {})
    return [(e["size"], out[e["task"]] if "task" in e else e.get("cell"))
            for e in trace if e["action"] == "alloc"]


def test_one_task_at_a_time_labels_its_allocations_and_restores_the_cell() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True)
    a.current_cell = 7  # a notebook's cell, as with workers in the notebook's process
    labels = TaskLabels(lambda: [a])
    labels.transition("x-1", "ready", "executing")
    p1 = a.malloc(1 * MiB)
    labels.transition("x-1", "executing", "memory")
    p2 = a.malloc(2 * MiB)
    labels.transition(("y-2", 0), "ready", "executing")
    labels.transition(("y-2", 0), "executing", "long-running")  # seceded: still running
    p3 = a.malloc(3 * MiB)
    labels.transition(("y-2", 0), "long-running", "memory")
    assert a.current_cell == 7
    assert _tasks_of_allocs(a, labels) == [
        (1 * MiB, ["x-1"]), (2 * MiB, 7), (3 * MiB, ["('y-2', 0)"])]
    for p in (p1, p2, p3):
        a.free(p)


def test_overlapping_tasks_share_a_label_naming_both() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True)
    labels = TaskLabels(lambda: [a])
    labels.transition("mul-b", "ready", "executing")
    labels.transition("mul-a", "ready", "executing")
    p = a.malloc(MiB)
    labels.transition("mul-a", "executing", "memory")
    q = a.malloc(2 * MiB)
    labels.transition("mul-b", "executing", "error")
    assert a.current_cell == NO_CELL
    assert _tasks_of_allocs(a, labels) == [(MiB, ["mul-a", "mul-b"]), (2 * MiB, ["mul-b"])]
    a.free(p)
    a.free(q)


def test_no_labels_are_made_while_nothing_records() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    labels = TaskLabels(lambda: [a])
    for i in range(100):
        labels.transition(f"t-{i}", "ready", "executing")
        labels.transition(f"t-{i}", "executing", "memory")
    assert labels.labels == [] and a.current_cell == NO_CELL


def test_the_plugin_in_this_process_sets_up_and_tears_down_exactly() -> None:
    backend, config = registry.backend(), registry.default_config()
    plugin = GpuMemPlugin(device="sim", config="max_split_size_mb:64", history=1000,
                          capacity=1 << 30)
    one, two = object(), object()  # two in-process workers (the plugin tells them apart)
    plugin.setup(one)
    plugin.setup(two)  # the second shares the allocators
    try:
        assert registry.backend() == "sim"
        assert registry.get_allocator(None).recording
        info = plugin_info()
        assert info is not None and info["users"] == 2
        plugin.transition("alloc-1", "ready", "executing")
        ptr = registry.get_allocator(None).malloc(MiB)
        plugin.transition("alloc-1", "executing", "memory")
        registry.get_allocator(None).free(ptr)
        snap = worker_snapshot()
        check_snapshot(snap)
        assert snap["jupyter_gpumem"]["tasks"] == [["alloc-1"]]
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        assert [e.get("task") for e in allocs] == [0] and "cell" not in allocs[0]
        # a gather reads without marking: the worker's history does not grow as it is gathered
        assert "snapshot" not in [e["action"] for e in snap["device_traces"][0]]
        assert worker_snapshot()["device_traces"] == snap["device_traces"]
        stats = worker_stats()
        assert stats["gpu"]["backend"] == "sim" and stats["stats"]["max_split_size"] == 64 * MiB
        plugin.teardown(one)
        plugin.teardown(one)  # twice, or a worker never set up: nothing more
        assert registry.backend() == "sim"  # one worker is left
    finally:
        plugin.teardown(two)
    assert plugin_info() is None
    assert registry.backend() == backend and registry.default_config() == config
    assert not binding.installed()


@pytest.mark.parametrize("bad", [{"device": "tpu"}, {"history": -1}, {"capacity": 0},
                                 {"config": 3}])
def test_bad_plugin_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        GpuMemPlugin(**bad)  # type: ignore[arg-type]


def _worker_like(sizes: dict[str, int]) -> dict[str, object]:
    """A snapshot as a worker sends it: one simulated device, a task label per allocation."""
    a = CachingAllocator(SimulatedDevice(1 << 30))
    a.record_history(True)
    labels = TaskLabels(lambda: [a])
    ptrs = []
    for key, size in sizes.items():
        labels.transition(key, "ready", "executing")
        ptrs.append(a.malloc(size))
        labels.transition(key, "executing", "memory")
    snap = a.snapshot()
    tasks: list[list[str]] = []
    snap["device_traces"][0] = relabel_trace(snap["device_traces"][0], labels.label_of, tasks,
                                             {})  # type: ignore[call-overload]
    snap["jupyter_gpumem"]["tasks"] = tasks
    for p in ptrs:
        a.free(p)
    return snap  # type: ignore[return-value]


def test_merged_snapshot_is_one_device_per_worker_with_tasks_remapped() -> None:
    one = _worker_like({MATMUL: 4 * MiB, SAMPLE_B: 8 * MiB})
    two = _worker_like({SAMPLE_C: 16 * MiB})
    merged = merge_snapshots({"tcp://b:2": two, "tcp://a:1": one}, {"tcp://c:3": "gone"})
    check_snapshot(merged)
    info = merged["jupyter_gpumem"]
    assert info["workers"] == {"tcp://a:1": 0, "tcp://b:2": 1}
    assert info["devices"]["1"]["worker"] == "tcp://b:2"
    assert info["missing_workers"] == {"tcp://c:3": "gone"}
    assert {s["device"] for s in merged["segments"]} == {0, 1}
    for device, want in ((0, [[MATMUL], [SAMPLE_B]]),
                         (1, [[SAMPLE_C]])):
        allocs = [e for e in merged["device_traces"][device] if e["action"] == "alloc"]
        assert [info["tasks"][e["task"]] for e in allocs] == want
    # at the end of worker 0's trace everything is freed; at its peak both tasks hold memory
    top = top_tasks(merged, 0, index=3, by="prefix")
    assert [(t.task, t.bytes) for t in top] == [("random_sample", 8 * MiB), ("matmul", 4 * MiB)]
    assert [t.task for t in top_tasks(merged, 1, index=1, by="key")] == [SAMPLE_C]
    assert NO_TASK_LABEL not in [t.task for t in top]


def test_the_cli_summary_of_a_cluster_snapshot_names_workers_and_top_tasks(
        tmp_path: Path) -> None:
    one = _worker_like({MATMUL: 4 * MiB, SAMPLE_B: 8 * MiB})
    two = _worker_like({SAMPLE_C: 16 * MiB})
    merged = merge_snapshots({"tcp://b:2": two, "tcp://a:1": one}, {"tcp://c:3": "gone"})
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(plain_snapshot(merged)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "jupyter_gpumem", "summary", str(path)],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert "cluster:  2 Dask worker(s)" in out
    assert "missing:  tcp://c:3: gone" in out
    assert "trace (worker tcp://a:1, device 0)" in out
    assert "trace (worker tcp://b:2, device 1)" in out
    tasks = out.split("top tasks at the peak:")
    assert len(tasks) == 3
    assert "random_sample" in tasks[1] and "matmul" in tasks[1].split("trace (")[0]
    assert "random_sample" in tasks[2]


def test_a_task_label_is_no_notebook_cell() -> None:
    assert TASK_BASE > 10**8 and TASK_BASE < 1 << 31


def test_importing_the_package_imports_no_dask() -> None:
    code = ("import json, sys, jupyter_gpumem; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'distributed', 'dask'})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env, cwd=ROOT).stdout
    assert json.loads(out) == []


def test_the_plugin_gives_its_config_to_simulated_devices_made_before_it() -> None:
    """A notebook that already uses the simulated device, then runs an in-process cluster: the
    plugin's config applies to the reused allocators, and teardown puts theirs back."""
    backend = registry.backend()
    (allocator,) = registry.use_simulated_device(1 << 30)
    before = allocator.config
    plugin = GpuMemPlugin(device="sim", config="max_split_size_mb:64", capacity=1 << 30)
    plugin.setup(None)
    try:
        assert allocator.config.max_split_size_mb == 64
        assert worker_stats()["stats"]["max_split_size"] == 64 * MiB
    finally:
        plugin.teardown(None)
        if backend == "cuda":
            registry.use_cuda()
    assert allocator.config == before
