"""Dask on a real GPU: two worker processes sharing one GPU, a ``dask.array`` workload with CuPy
chunks, each worker's gathered stats against its own, the cluster trace rendered, and an induced
OOM on one worker explained in the client.

The cluster: ``dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,0", n_workers=2)`` where
dask_cuda imports and starts two workers; else (dask_cuda missing, too old for this
``distributed``, or unable to put two workers on one device: its worker names come from the set
of visible devices) one worker process per GPU with its own ``CUDA_VISIBLE_DEVICES`` on a
two-GPU machine, or ``distributed.LocalCluster(n_workers=2, processes=True)`` with both
workers' ``CUDA_VISIBLE_DEVICES=0`` on one GPU. The test prints which one ran.
"""

from __future__ import annotations

import sys
import time

import pytest

pytestmark = pytest.mark.gpu

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
import cloudpickle  # noqa: E402
import dask  # noqa: E402

from jupyter_gpumem.dask import GpuMemPlugin, memory_stats  # noqa: E402
from jupyter_gpumem.dask.gather import workers_of  # noqa: E402

# the workers cannot import this file: send its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

START_TIMEOUT = 120  # seconds for the workers to come up (CUDA contexts, imports)


def _cuda_cluster() -> tuple[object, str]:
    try:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,0", n_workers=2,
                                   threads_per_worker=1, dashboard_address=None)
    except Exception as exc:  # missing, too old for this distributed, or one worker per device
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    else:
        try:
            with distributed.Client(cluster) as probe:
                probe.wait_for_workers(2, timeout=START_TIMEOUT)
            return cluster, "dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES='0,0')"
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            cluster.close()  # type: ignore[attr-defined]
    import cupy

    if cupy.cuda.runtime.getDeviceCount() >= 2:  # a worker per GPU, as LocalCUDACluster does
        specs = {f"gpu-{i}": {"cls": distributed.Nanny, "options": {
            "nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}, "silence_logs": 50}}
            for i in range(2)}
        cluster = distributed.SpecCluster(workers=specs, scheduler={
            "cls": distributed.Scheduler, "options": {"dashboard_address": None}})
        return cluster, ("distributed.SpecCluster, one worker on each of GPUs 0 and 1 "
                         f"(dask_cuda: {reason})")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=50,
                                       env={"CUDA_VISIBLE_DEVICES": "0"})
    return cluster, f"distributed.LocalCluster, both workers on GPU 0 (dask_cuda: {reason})"


@pytest.fixture(scope="module")
def client():
    cluster, which = _cuda_cluster()
    print(f"\ncluster: {which}")
    c = distributed.Client(cluster)
    c.wait_for_workers(2, timeout=START_TIMEOUT)
    c.register_plugin(GpuMemPlugin(device="cuda"))
    yield c
    c.close()
    cluster.close()  # type: ignore[attr-defined]


def _own_stats() -> dict[str, int]:
    from jupyter_gpumem import api

    return api.memory_stats()


def _ours_in_cupy() -> bool:
    from jupyter_gpumem.runtime import binding

    return binding.installed()


def _cupy_bytes_held(dask_worker) -> int:
    """Bytes of the CuPy arrays in the worker's data: chunks it keeps for the client."""
    import cupy

    return sum(int(v.nbytes) for v in dask_worker.data.values() if isinstance(v, cupy.ndarray))


def _empty_cache() -> None:
    import gc

    from jupyter_gpumem import api

    gc.collect()
    api.empty_cache()


def _huge(nbytes: int) -> int:
    import cupy

    return int(cupy.empty((nbytes,), dtype=cupy.uint8).nbytes)


def test_two_workers_share_the_gpu_with_our_allocator(client) -> None:
    workers = workers_of(client)
    assert len(workers) == 2
    assert all(client.run(_ours_in_cupy).values())


def test_a_cupy_chunked_workload_and_each_workers_own_stats(client) -> None:
    import cupy

    with dask.config.set({"array.backend": "cupy"}):
        x = da.random.random((8192, 8192), chunks=(2048, 2048))
    assert isinstance(x._meta, cupy.ndarray)
    x = x.persist()
    distributed.wait(x)
    total = float((x @ x.T).sum().compute())
    assert total > 0
    try:
        # compute() returns before the workers have released its intermediate keys (a 512 B
        # block of a partial sum was seen going between the two reads): read both until the
        # workers are quiet, then they must agree to the byte
        keys = ("allocated_bytes.all.current", "reserved_bytes.all.current")
        for _ in range(50):
            got = memory_stats(client)
            own = client.run(_own_stats)
            if all(got[a]["stats"][k] == own[a][k] for a in own if a in got for k in keys):
                break
            time.sleep(0.1)
        assert got.complete and sorted(got) == sorted(own)
        for addr, one in got.items():
            for key in keys:
                assert one["stats"][key] == own[addr][key], (addr, key)
            assert one["gpu"]["backend"] == "cuda"
        # every chunk a worker keeps lives in our allocator: its allocated bytes cover them
        chunks = client.run(_cupy_bytes_held)
        print(f"\nchunks held per worker: {chunks}; allocated: "
              f"{ {a: one['stats']['allocated_bytes.all.current'] for a, one in got.items()} }")
        assert sum(chunks.values()) > 0
        for addr, one in got.items():
            assert one["stats"]["allocated_bytes.all.current"] >= chunks[addr], addr
    finally:
        del x
        client.run(_empty_cache)


def test_the_cluster_trace_renders(client) -> None:
    from jupyter_gpumem.dask.trace import cluster_trace
    from jupyter_gpumem.render.html import render_html

    with dask.config.set({"array.backend": "cupy"}):
        y = da.random.random((4096, 4096), chunks=(1024, 1024))
    with cluster_trace(client, plot=True) as t:
        float((y + 1).sum().compute())
    assert t.errors == {} and len(t.workers) == 2
    assert sum(one.result.events for one in t.workers) > 0
    assert any(one.top_tasks or one.result.surviving or one.result.events
               for one in t.workers)
    text = t.text()
    for one in t.workers:
        assert f"== worker {one.worker}: " in text
    assert "<img" in t._repr_mimebundle_()["text/html"]
    assert "<html" in render_html(t.snapshot).lower()
    client.run(_empty_cache)


def test_an_induced_oom_on_one_worker_is_explained(client) -> None:
    from jupyter_gpumem.notebook.oom_panel import build_panel, is_oom_error

    worker = workers_of(client)[1]
    total = memory_stats(client)[worker]["gpu"]["total"]
    key = "induced-oom-0aa11bb22cc33dd44"
    future = client.submit(_huge, 2 * total, key=key, workers=[worker])
    with pytest.raises(MemoryError) as info:
        future.result()
    exc = info.value
    assert is_oom_error(exc), repr(exc)
    assert getattr(exc, "worker", None) == worker and getattr(exc, "tasks", None) == [key]
    text = build_panel(exc).text()
    assert f"on Dask worker {worker} in task '{key}'" in text
    assert "held by the worker, not this process" in text
    # the worker is still there and still answers
    assert memory_stats(client).complete
