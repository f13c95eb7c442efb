"""The live view of every worker: the sampler on a real cluster of worker processes (simulated
devices), its bookkeeping on scripted answers, the widget's messages and static bundle, and the
``%gpumem cluster`` options.

One cluster for the module; tests ask for the workers there are now (one kills a worker, whose
nanny starts a new one; one adds a worker).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")
pytest.importorskip("anywidget")
import cloudpickle  # noqa: E402
import comm as comm_package  # noqa: E402
import numpy as np  # noqa: E402

from jupyter_gpumem.dask import GpuMemPlugin  # noqa: E402
from jupyter_gpumem.dask.gather import workers_of  # noqa: E402
from jupyter_gpumem.dask.live import (  # noqa: E402
    FIELDS,
    GONE,
    LIVE,
    RECORD_BYTES,
    STALE,
    TASK_BYTES,
    ClusterSampler,
    decode_record,
    encode_record,
    stop_all_samplers,
)
from tests.bundle_checks import check_bundle  # noqa: E402
from tests.dask.sim_cluster import CAPACITY, sim_cluster  # noqa: E402
from tests.notebook.test_widget import RecordingComm  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20
THREAD = "jupyter_gpumem-cluster-sampler"


@pytest.fixture(autouse=True)
def recording_comm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm_package, "create_comm", lambda **kw: RecordingComm(**kw))


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield
    leaked = [t.name for t in threading.enumerate() if t.name == THREAD]
    stop_all_samplers()
    assert leaked == [], "a test left a sampler thread running"


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with sim_cluster(3) as c:
        yield c


def _alloc(nbytes: int) -> int:
    from jupyter_gpumem import api

    return api.caching_allocator_alloc(nbytes)


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


def _block_loop(seconds: float, dask_worker: Any = None) -> str:
    time.sleep(seconds)  # a plain function of client.run: it holds the worker's event loop
    return dask_worker.address


def _wait_for(predicate: Any, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _latest(sampler: ClusterSampler, address: str) -> dict[str, float]:
    rnd = sampler.rounds[-1]
    row = sampler.workers[address].row
    (k,) = np.flatnonzero(rnd.rows == row)
    return dict(zip(FIELDS, rnd.values[k].tolist(), strict=True))


# -- the record ----------------------------------------------------------------------------------

def test_a_record_has_a_fixed_size_whatever_it_holds() -> None:
    small = encode_record(1, 2, 3, 4, 0, 0, 0, "")
    big = encode_record(1 << 40, 1 << 41, 1 << 42, 1 << 43, 7, 9, 3, "é" * 100)
    assert len(small) == len(big) == RECORD_BYTES
    assert decode_record(small) == (1, 2, 3, 4, 0, 0, 0, "")
    values = decode_record(big)
    assert values[:7] == (1 << 40, 1 << 41, 1 << 42, 1 << 43, 7, 9, 3)
    assert values[7] == "é" * (TASK_BYTES // 2)  # cut at a whole character


# -- the sampler on a real cluster ---------------------------------------------------------------

def test_each_round_holds_every_worker_with_its_own_stats(client) -> None:
    workers = workers_of(client)
    sizes = {w: (i + 1) * 4 * MiB for i, w in enumerate(workers)}
    client.gather([client.submit(_alloc, sizes[w], workers=[w], pure=False) for w in workers])
    try:
        sampler = ClusterSampler(client, interval=0.5)
        rnd = sampler.sample()
        assert rnd is not None and sampler.error == "" and sampler.mode == "scheduler"
        assert sorted(sampler.workers) == workers and len(rnd.rows) == len(workers)
        assert sampler.last_bytes == RECORD_BYTES * len(workers)
        for w in workers:
            own = client.submit(_own_stats, workers=[w], pure=False).result()
            got = _latest(sampler, w)
            assert got["allocated"] == own["allocated_bytes.all.current"] == sizes[w]
            assert got["reserved"] == own["reserved_bytes.all.current"]
            assert got["peak"] == own["allocated_bytes.all.peak"]
            assert (got["ooms"], got["retries"], got["state"]) == (
                own["num_ooms"], own["num_alloc_retries"], LIVE)
            row = sampler.workers[w]
            assert (row.total, row.gpu, row.state) == (CAPACITY, 0, LIVE)
    finally:
        client.run(_free_all)


def test_the_thread_samples_every_worker_at_the_interval_until_stopped(client) -> None:
    workers = workers_of(client)
    sampler = ClusterSampler(client, interval=0.25).start()
    try:
        _wait_for(lambda: len(sampler.rounds) >= 8, "8 rounds")
    finally:
        sampler.stop()
    assert not sampler.running and sampler._thread is not None
    assert not sampler._thread.is_alive()
    rounds = list(sampler.rounds)
    for rnd in rounds:  # every worker, every round
        assert sorted(int(r) for r in rnd.rows) == sorted(sampler.workers[w].row for w in workers)
        assert (rnd.values[:, FIELDS.index("state")] == LIVE).all()
    # rounds are scheduled every interval (0.25 s): well over one sample a second per worker
    gaps = np.diff([r.t for r in rounds])
    assert float(np.median(gaps)) < 1.0
    n = len(sampler.rounds)
    time.sleep(0.6)
    assert len(sampler.rounds) == n  # stopped means stopped


def test_the_window_is_bounded(client) -> None:
    sampler = ClusterSampler(client, interval=0.5, capacity=3)
    for _ in range(5):
        sampler.sample()
    assert [r.index for r in sampler.rounds] == [2, 3, 4]
    t, v = sampler.series(workers_of(client)[0])
    assert len(t) == len(v) == 3


def test_a_worker_that_does_not_answer_in_time_is_stale_and_holds_up_no_one(client) -> None:
    workers = workers_of(client)
    slow = workers[0]
    sampler = ClusterSampler(client, interval=1.0, timeout=0.3)
    sampler.sample()
    blocker = threading.Thread(target=client.run, args=(_block_loop, 2.0),
                               kwargs={"workers": [slow]})
    blocker.start()
    try:
        time.sleep(0.3)  # the slow worker's loop is in the sleep now
        rnd = sampler.sample()
        assert rnd is not None
        assert sampler.workers[slow].state == STALE
        assert "no answer in time" in sampler.workers[slow].why
        for w in workers[1:]:
            assert sampler.workers[w].state == LIVE
            assert _latest(sampler, w)["state"] == LIVE
        assert np.isnan(_latest(sampler, slow)["allocated"])
    finally:
        blocker.join()
    _wait_for(lambda: sampler.sample() is not None and sampler.workers[slow].state == LIVE,
              "the slow worker to answer again")


def test_a_killed_worker_is_marked_gone_and_sampling_goes_on(client) -> None:
    workers = workers_of(client)
    victim = workers[0]
    sampler = ClusterSampler(client, interval=0.2).start()
    try:
        _wait_for(lambda: len(sampler.rounds) >= 2, "2 rounds")
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)  # the worker process this cluster started; its nanny remains
        _wait_for(lambda: sampler.workers.get(victim) is not None
                  and sampler.workers[victim].state == GONE, "the killed worker to be gone")
        at = len(sampler.rounds)
        _wait_for(lambda: len(sampler.rounds) >= at + 3, "more rounds after the kill")
        assert sampler.running
        assert all(sampler.workers[w].state == LIVE for w in workers[1:])
        last = sampler.rounds[-1]
        k = int(np.flatnonzero(last.rows == sampler.workers[victim].row)[0])
        assert last.values[k, FIELDS.index("state")] == GONE
    finally:
        sampler.stop()
    client.wait_for_workers(len(workers), timeout=60)  # the nanny's new worker


def test_a_worker_that_joins_late_gets_a_row(client) -> None:
    before = workers_of(client)
    sampler = ClusterSampler(client, interval=0.2).start()
    try:
        _wait_for(lambda: len(sampler.rounds) >= 1, "a round")
        client.cluster.scale(len(before) + 1)
        client.wait_for_workers(len(before) + 1, timeout=60)
        (new,) = set(workers_of(client)) - set(before)
        _wait_for(lambda: new in sampler.workers and sampler.workers[new].state == LIVE,
                  "the new worker's row")
        assert sampler.workers[new].row == max(w.row for w in sampler.workers.values())
        assert sampler.workers[new].total == CAPACITY
    finally:
        sampler.stop()


def test_the_sampler_ends_when_the_client_closes() -> None:
    with distributed.LocalCluster(n_workers=1, processes=False, threads_per_worker=1,
                                  dashboard_address=":0") as cluster:
        c = distributed.Client(cluster)
        c.register_plugin(GpuMemPlugin(device="sim", capacity=1 << 30))
        ended = threading.Event()
        sampler = ClusterSampler(c, interval=0.1)
        sampler.on_end(ended.set)
        sampler.start()
        _wait_for(lambda: len(sampler.rounds) >= 1, "a round")
        # an in-process worker's answer comes back unframed: still a record
        assert [w.state for w in sampler.workers.values()] == [LIVE]
        c.unregister_worker_plugin("jupyter_gpumem")
        c.close()
        assert ended.wait(30)
        assert not sampler.running


# -- bookkeeping on scripted answers (no cluster) ------------------------------------------------

class ScriptedClient:
    """Answers each round with the next of ``script``: ``{address: record bytes or why}``, or an
    exception for a scheduler that does not answer."""

    status = "running"

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)

    def sync(self, _fn: Any, callback_timeout: float | None = None) -> Any:
        got = self.script.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got, {a: str(i) for i, a in enumerate(sorted(got))}


def _rec(allocated: int, task: str = "") -> bytes:
    return encode_record(allocated, 2 * allocated, 3 * allocated, CAPACITY, 0, 0, 1, task)


def test_rows_are_stable_joins_get_new_rows_and_leavers_are_kept_then_dropped() -> None:
    a, b, c = "tcp://h:1", "tcp://h:2", "tcp://h:3"
    script = [{a: _rec(1), b: _rec(2)}, {a: _rec(3), b: "no answer in time", c: _rec(4, "mul")},
              TimeoutError("scheduler"), {a: _rec(5), c: _rec(6)}, {a: _rec(7), c: _rec(8)},
              {a: _rec(9), c: _rec(10)}]
    s = ClusterSampler(ScriptedClient(script), interval=1.0, capacity=2)
    s.sample()
    assert {w: r.row for w, r in s.workers.items()} == {a: 0, b: 1}
    s.sample()
    assert s.workers[b].state == STALE and s.workers[c].row == 2 and s.workers[c].task == "mul"
    assert s.sample() is not None and s.error.startswith("TimeoutError")
    assert {w: r.state for w, r in s.workers.items()} == {a: STALE, b: STALE, c: STALE}
    s.sample()
    assert s.workers[b].state == GONE and s.workers[a].state == LIVE
    s.sample()
    s.sample()  # b's last answer left the window: its row goes
    assert sorted(s.workers) == [a, c]
    assert [r.index for r in s.rounds] == [4, 5]


def test_bad_arguments_are_refused() -> None:
    for bad in (0, -1, "1", True, float("nan")):
        with pytest.raises(ValueError, match="interval"):
            ClusterSampler(ScriptedClient([]), interval=bad)
    with pytest.raises(ValueError, match="capacity"):
        ClusterSampler(ScriptedClient([]), capacity=1)
    with pytest.raises(ValueError, match="timeout"):
        ClusterSampler(ScriptedClient([]), timeout=0)


# -- the widget: messages and the static bundle --------------------------------------------------

def _browser_says(widget: Any, content: dict[str, Any]) -> None:
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}},
                        "buffers": []})


def test_each_round_sends_only_itself_and_a_late_view_catches_up(monkeypatch) -> None:
    import IPython.display

    from jupyter_gpumem.notebook.cluster_live import ClusterLive

    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            updates.append((obj, kwargs))

    shown: list[Any] = []

    def show(obj: Any, display_id: bool = False) -> Handle:
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", show)
    a, b = "tcp://h:1", "tcp://h:2"
    script = [{a: _rec(i * MiB, "matmul"), b: _rec(2 * i * MiB)} for i in range(1, 5)]
    sampler = ClusterSampler(ScriptedClient(script), interval=3600)
    live = ClusterLive(None, sampler=sampler)
    live.start()
    # a round taken before the widget is shown (its saved fallback draws it), then the thread's
    _wait_for(lambda: len(sampler.rounds) == 2, "the first round")
    ((widget,),) = [shown]
    data, _ = widget._repr_mimebundle_()  # what the output saved while it runs keeps
    assert "application/vnd.jupyter.widget-view+json" in data
    check_bundle(data)
    assert data["text/plain"].startswith("gpumem cluster live view: 2 workers, ")
    sampler.sample()
    sampler.sample()
    comm = live.widget.comm
    sent = [(m, bufs) for m, bufs in comm.custom() if m["type"] == "rounds"]
    assert [m["first"] for m, _ in sent] == [0, 1, 2, 3]
    for m, bufs in sent:  # one round each: a row and FIELDS values per worker
        assert m["counts"] == [2] and len(bufs) == 2
        assert len(bufs[0]) == 2 * 4 and len(bufs[1]) == 2 * len(FIELDS) * 8
    m, bufs = sent[-1]
    values = np.frombuffer(bufs[1], dtype=np.float64).reshape(2, len(FIELDS))
    assert values[:, 0].tolist() == [4 * MiB, 8 * MiB] and m["tasks"] == ["matmul", ""]
    assert [w["name"] for w in live.widget.workers] == ["0", "1"]
    _browser_says(live.widget, {"type": "ready", "have": 1})
    m, bufs = comm.custom()[-1]
    assert m["first"] == 1 and m["counts"] == [2, 2, 2]
    live.stop()
    live.stop()  # once only
    assert not sampler.running and live.widget.running is False
    assert live.widget.comm is None  # closed: the output no longer shows it
    ((bundle, kwargs),) = updates
    assert kwargs == {"raw": True}
    check_bundle(bundle)
    assert bundle["text/plain"].startswith("gpumem cluster live view: 2 workers, 4 samples over ")
    assert "allocated peaked at 8.0 MiB on worker 1 GPU 1 (tcp://h:2)" in bundle["text/plain"]
    assert live.widget._repr_mimebundle_()[0]["text/plain"] == bundle["text/plain"]


# -- %gpumem cluster -----------------------------------------------------------------------------

def test_a_running_view_keeps_its_saved_fallback_recent(shell, monkeypatch) -> None:
    """After a cell, a running view's output is shown again (at most every 10 s) with its
    fallback brought up to date, so a notebook saved while it runs keeps a recent strip."""
    import IPython.display

    from jupyter_gpumem.notebook.cluster import refresh_live
    from jupyter_gpumem.notebook.cluster_live import ClusterLive

    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            updates.append(obj)

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    a = "tcp://h:1"
    sampler = ClusterSampler(ScriptedClient([{a: _rec(i * MiB)} for i in range(1, 9)]),
                             interval=3600)
    live = ClusterLive(None, sampler=sampler)
    live.start()
    _wait_for(lambda: len(sampler.rounds) == 2, "two rounds")
    assert refresh_live() == 0 and updates == []  # shown just now
    live._refreshed -= 10
    sampler.sample()
    assert refresh_live() == 1 and updates == [live.widget]
    data, _ = live.widget._repr_mimebundle_()
    check_bundle(data)
    assert "1 worker, 3 samples over " in data["text/plain"]
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    try:
        live._refreshed -= 10
        assert shell.run_cell("1 + 1").success
        assert updates == [live.widget, live.widget]  # the extension did it after the cell
        live.stop()
        assert refresh_live() == 0 and isinstance(updates[-1], dict)
    finally:
        shell.run_line_magic("unload_ext", "jupyter_gpumem")
        live.stop()


def test_the_magic_shows_the_table_and_starts_and_stops_the_live_view(shell, monkeypatch) -> None:
    import IPython.display
    from IPython.core.error import UsageError

    from jupyter_gpumem.notebook import cluster_live

    shown: list[Any] = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, display_id=False: shown.append(obj))
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    with distributed.LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        c.register_plugin(GpuMemPlugin(device="sim", capacity=1 << 30))
        try:
            for bad in ("--interval 0", "--interval abc", "--interval nan", "--interval -1",
                        "--no-live --interval 2", "--stop --no-live", "extra"):
                with pytest.raises(UsageError):
                    shell.run_line_magic("gpumem", f"cluster {bad}")
            with pytest.raises(UsageError, match="does not apply"):
                shell.run_line_magic("gpumem", "stats --interval 2")
            assert list(cluster_live._VIEWS) == []  # nothing started
            shell.run_line_magic("gpumem", "cluster --interval 0.2")
            (view,) = list(cluster_live._VIEWS)
            assert view.running and view.sampler.interval == 0.2
            _wait_for(lambda: len(view.sampler.rounds) >= 2, "2 rounds")
            shell.run_line_magic("gpumem", "cluster")  # a new one stops the one before
            (again,) = list(cluster_live._VIEWS)
            assert again is not view and not view.running and again.sampler.interval == 1.0
            shell.run_line_magic("gpumem", "cluster --stop")
            assert list(cluster_live._VIEWS) == [] and not again.running
            shell.run_line_magic("gpumem", "cluster --no-live")
            assert list(cluster_live._VIEWS) == []
            shell.run_line_magic("gpumem", "cluster --interval 0.5")
            (last,) = list(cluster_live._VIEWS)
            shell.run_line_magic("unload_ext", "jupyter_gpumem")  # the unload stops it too
            assert not last.running
        finally:
            cluster_live.stop_all_cluster_views()
            c.unregister_worker_plugin("jupyter_gpumem")
    tables = [o for o in shown if type(o).__name__ == "ClusterTable"]
    assert len(tables) == 4


def test_the_help_names_the_options(shell) -> None:
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    text = shell.find_line_magic("gpumem").__doc__ or ""
    from jupyter_gpumem.notebook import magics

    text += magics.GpuMemMagics.gpumem.parser.format_help()
    for option in ("--interval SECONDS", "--no-live", "--stop", "live heat strip"):
        assert option in text
