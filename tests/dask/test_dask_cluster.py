"""A real Dask cluster of worker processes on simulated devices: the plugin on every worker (and
on one that joins late), gathering, task keys on the events, and workers that die or hang.

One cluster for the module (starting worker processes costs seconds); each test asks for the
workers there are now, since one test kills a worker (its nanny starts a new one).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")
import cloudpickle  # noqa: E402

from jupyter_gpumem.dask import (  # noqa: E402
    GpuMemPlugin,
    PartialResultWarning,
    cluster_snapshot,
    memory_stats,
    memory_summary,
    snapshot,
    start_trace,
)
from jupyter_gpumem.dask.gather import gather, workers_of  # noqa: E402
from jupyter_gpumem.dask.tasks import top_tasks  # noqa: E402
from jupyter_gpumem.dask.worker import plugin_info  # noqa: E402
from tests.dask.sim_cluster import CAPACITY, sim_cluster  # noqa: E402

# the workers cannot import this file: send its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with sim_cluster(2) as c:
        yield c


def _alloc(nbytes: int, keep: bool) -> int:
    """A task that allocates through our API on the worker; frees unless ``keep``."""
    from jupyter_gpumem import api

    ptr = api.caching_allocator_alloc(nbytes)
    if not keep:
        api.caching_allocator_delete(ptr)
    return ptr


def _free_all() -> int:
    from jupyter_gpumem.runtime import registry

    a = registry.get_allocator(None)
    live = [b.address for b in a.state().blocks if b.allocated]
    for p in live:
        a.free(p)
    return len(live)


def _own_stats() -> dict[str, int]:
    from jupyter_gpumem import api

    return api.memory_stats()


def _wait_for(predicate, what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_each_worker_reports_its_own_stats_and_gpu(client) -> None:
    workers = workers_of(client)
    sizes = {w: (i + 1) * 3 * MiB for i, w in enumerate(workers)}
    futures = [client.submit(_alloc, sizes[w], True, workers=[w], pure=False) for w in workers]
    client.gather(futures)
    try:
        got = memory_stats(client)
        own = {w: client.submit(_own_stats, workers=[w], pure=False).result() for w in workers}
        assert got.complete and sorted(got) == workers
        for w in workers:
            assert got[w]["stats"] == own[w]
            assert got[w]["stats"]["allocated_bytes.all.current"] == sizes[w]
            gpu = got[w]["gpu"]
            assert (gpu["backend"], gpu["name"], gpu["total"]) == ("sim", "Simulated GPU 0",
                                                                  CAPACITY)
        assert len({got[w]["gpu"]["pid"] for w in workers}) == len(workers)
        summaries = memory_summary(client)
        assert all("Allocated memory" in s["summary"] for s in summaries.values())
    finally:
        client.run(_free_all)


def test_task_keys_are_on_the_events_and_group_by_prefix(client) -> None:
    workers = workers_of(client)
    trace = start_trace(client)
    keys = {}
    for i, w in enumerate(workers):
        for j in range(3):
            key = f"grow-{i}{j}aa00bb11cc22dd33ee44ff55"  # a prefix and a token, as Dask makes
            keys[key] = (w, (1 + j + 3 * i) * MiB)
    futures = [client.submit(_alloc, size, False, key=key, workers=[w])
               for key, (w, size) in keys.items()]
    client.gather(futures)
    snap = trace.stop()
    assert trace.errors == {}
    info = snap["jupyter_gpumem"]
    for w in workers:
        device = info["workers"][w]
        assert info["devices"][str(device)]["worker"] == w
        allocs = [e for e in snap["device_traces"][device] if e["action"] == "alloc"]
        mine = {key: size for key, (ww, size) in keys.items() if ww == w}
        assert sorted((info["tasks"][e["task"]][0], e["size"]) for e in allocs) == \
            sorted(mine.items())
        assert all(len(info["tasks"][e["task"]]) == 1 for e in allocs)
    # each task freed what it took: a snapshot at each alloc's event ranks that task first
    device = info["workers"][workers[0]]
    at = next(i for i, e in enumerate(snap["device_traces"][device]) if e["action"] == "alloc")
    assert [t.task for t in top_tasks(snap, device, index=at)] == ["grow"]


def test_the_cluster_snapshot_goes_through_files_the_cli_and_renderers(client, tmp_path: Path
                                                                      ) -> None:
    from jupyter_gpumem.cli import main
    from jupyter_gpumem.data.files import load_snapshot, save_snapshot
    from jupyter_gpumem.render.html import render_html

    trace = start_trace(client)
    client.gather([client.submit(_alloc, 5 * MiB, True, workers=[w], pure=False)
                   for w in workers_of(client)])
    trace.stop()
    try:
        snap = cluster_snapshot(client)
        path = tmp_path / "cluster.pickle"
        save_snapshot(snap, str(path), pickled=True)
        loaded = load_snapshot(str(path))
        assert loaded["jupyter_gpumem"]["workers"] == snap["jupyter_gpumem"]["workers"]
        assert sum(s["allocated_size"] for s in loaded["segments"]) == 5 * MiB * len(
            workers_of(client))
        assert "<html" in render_html(loaded).lower()
        assert main(["summary", str(path)]) in (0, None)
    finally:
        client.run(_free_all)


def test_a_worker_without_the_plugin_is_named(client) -> None:
    client.unregister_worker_plugin("jupyter_gpumem")
    try:
        assert all(v is None for v in client.run(plugin_info).values())
        with pytest.warns(PartialResultWarning, match="no GpuMemPlugin on this worker"):
            got = memory_stats(client)
        assert len(got) == 0 and len(got.errors) == len(workers_of(client))
    finally:
        client.register_plugin(GpuMemPlugin(device="sim", capacity=CAPACITY))


def _sleep_on(address: str, seconds: float, dask_worker=None) -> str:
    if dask_worker.address == address:
        time.sleep(seconds)
    return dask_worker.address


def test_a_worker_that_does_not_answer_in_time_leaves_a_partial_result(client) -> None:
    workers = workers_of(client)
    slow = workers[0]
    with pytest.warns(PartialResultWarning, match="no answer in time"):
        got = gather(client, _sleep_on, slow, 2.0, timeout=0.5)
    assert sorted(got) == workers[1:] and list(got.errors) == [slow]
    assert slow in got.message
    _wait_for(lambda: gather(client, _sleep_on, "", 0, warn=False).complete, "the slow worker")


def test_a_worker_that_dies_mid_trace_gives_a_partial_result(client) -> None:
    workers = workers_of(client)
    victim, survivor = workers[0], workers[1]
    trace = start_trace(client)
    client.gather([client.submit(_alloc, 2 * MiB, False, workers=[w], pure=False)
                   for w in workers])
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)  # the worker process this cluster started; its nanny remains
    _wait_for(lambda: victim not in workers_of(client), "the worker to leave")
    with pytest.warns(PartialResultWarning, match=victim):
        snap = trace.stop()
    assert victim in trace.errors and survivor not in trace.errors
    info = snap["jupyter_gpumem"]
    assert list(info["workers"]) == [survivor]
    assert victim in info["missing_workers"]
    assert any(e["action"] == "alloc" for e in snap["device_traces"][0])


def test_a_worker_that_joins_late_gets_the_plugin(client) -> None:
    cluster = client.cluster
    before = len(workers_of(client))
    cluster.scale(before + 1)
    client.wait_for_workers(before + 1, timeout=60)
    info = client.run(plugin_info)
    assert len(info) == before + 1
    assert all(v is not None and v["device"] == "sim" for v in info.values())
    got = snapshot(client)
    assert got.complete and len(got) == before + 1


# -- %%gpumem_trace --cluster --------------------------------------------------------------------

def test_a_cluster_trace_explains_each_worker_on_its_own(client) -> None:
    from jupyter_gpumem.dask.trace import ClusterTraceResult, cluster_trace

    workers = workers_of(client)
    sizes = {w: (i + 2) * MiB for i, w in enumerate(workers)}
    with cluster_trace(client, title="block") as t:
        kept = client.gather([
            client.submit(_alloc, sizes[w], True, key=f"keep-{i}aa00bb11cc22dd33", workers=[w])
            for i, w in enumerate(workers)])
        client.gather([client.submit(_alloc, 7 * MiB, False, key=f"temp-{i}aa00bb11cc22dd33",
                                     workers=[w]) for i, w in enumerate(workers)])
    try:
        assert isinstance(t, ClusterTraceResult) and t.errors == {}
        assert [one.worker for one in t.workers] == workers
        for one in t.workers:
            r = one.result
            # the peak holds the kept block and the temporary one, the kept one survives
            assert r.peak_allocated == sizes[one.worker] + 7 * MiB
            assert [b.size for b in r.surviving] == [sizes[one.worker]]
            assert sorted(u.task for u in one.top_tasks) == ["keep", "temp"]
            assert one.worker in r.title and "Simulated GPU 0" in r.title
        text = t.text()
        for w in workers:
            assert f"== worker {w}: Simulated GPU 0 (GPU 0) ==" in text
        assert text.count("Top tasks at the peak:") == len(workers)
        from tests.bundle_checks import check_bundle

        bundle = t._repr_mimebundle_()
        check_bundle(bundle, pictures=len(workers))  # one timeline per worker, each with alt
        assert bundle["text/html"].count("<h4>") == len(workers)
    finally:
        client.run(_free_all)
    assert len(kept) == len(workers)


def test_the_cluster_trace_magic_records_every_worker(client, shell) -> None:
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    shell.user_ns.update(client=client, _alloc=_alloc, workers=workers_of(client))
    result = shell.run_cell(
        "%%gpumem_trace --cluster --no-plot -o t\n"
        "client.gather([client.submit(_alloc, 3 << 20, False, workers=[w], pure=False)\n"
        "               for w in workers])\n")
    assert result.error_in_exec is None and result.error_before_exec is None
    t = shell.user_ns["t"]
    assert [one.worker for one in t.workers] == workers_of(client)
    assert all(one.result.peak_allocated == 3 * MiB for one in t.workers)
    assert t.title.startswith("cell [")


def test_a_worker_that_dies_in_a_cluster_trace_is_named_in_one_line(client) -> None:
    from jupyter_gpumem.dask.trace import cluster_trace

    workers = workers_of(client)
    victim, survivor = workers[0], workers[1]
    with cluster_trace(client) as t:
        client.gather([client.submit(_alloc, 2 * MiB, False, workers=[w], pure=False)
                       for w in workers])
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: victim not in workers_of(client), "the worker to leave")
    assert [one.worker for one in t.workers] == [survivor] and list(t.errors) == [victim]
    lines = [line for line in t.text().splitlines() if victim in line]
    assert len(lines) == 1 and "no result (it died or left during the trace" in lines[0]
    assert t.workers[0].result.peak_allocated == 2 * MiB


# -- an OOM on a worker, explained in the notebook ---------------------------------------------

def test_a_workers_oom_reaches_the_notebook_naming_the_worker_and_the_task(client) -> None:
    from jupyter_gpumem.engine.oom import OutOfMemoryError
    from jupyter_gpumem.notebook.oom_panel import build_panel, is_oom_error

    worker = workers_of(client)[0]
    key = "too-big-aa00bb11cc22dd33ee44"
    future = client.submit(_alloc, 2 * CAPACITY, False, key=key, workers=[worker])
    with pytest.raises(OutOfMemoryError) as info:
        future.result()
    exc = info.value
    assert is_oom_error(exc) and exc.report.requested == 2 * CAPACITY
    assert exc.worker == worker and exc.tasks == [key]
    assert f"On Dask worker {worker}, in task '{key}'." in str(exc)
    panel = build_panel(exc, cell=3)
    text = panel.text()
    assert f"GPU out of memory in cell [3] on Dask worker {worker} in task '{key}'" in text
    assert "held by the worker, not this process" in text
    assert worker in panel.html() and key in panel.html()


def test_the_notebook_shows_a_workers_oom_under_the_cell(client, shell, run) -> None:
    worker = workers_of(client)[-1]
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    shell.user_ns.update(client=client, _alloc=_alloc, worker=worker, size=2 * CAPACITY)
    result, captured = run("client.submit(_alloc, size, False, key='huge-0aa11bb22cc33dd44',\n"
                           "              workers=[worker]).result()")
    assert result.error_in_exec is not None
    shown = "\n".join(o.data.get("text/plain", "") for o in captured.outputs)
    assert f"on Dask worker {worker} in task 'huge-0aa11bb22cc33dd44'" in shown
