"""What every public Dask function does with arguments it cannot use, and with a worker that is
stopped: a bad argument is refused on the client before any worker is asked, and no gather waits
past its bound (Note [The gather bound] in ``jupyter_gpumem.dask.gather``).

The argument tests need no cluster: their client fails the test if anything asks it. The
stopped-worker tests stop one worker process of a real cluster with SIGSTOP and check that the
gathers come back, naming that worker, while it is still stopped; the bounds they check are wide
("it did not hang"), not timings.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")
import cloudpickle  # noqa: E402

from jupyter_gpumem import CachingAllocator, SimulatedDevice  # noqa: E402
from jupyter_gpumem.dask import (  # noqa: E402
    GpuMemPlugin,
    PartialResultWarning,
    cluster_snapshot,
    dump_snapshot,
    memory_stats,
    memory_summary,
    snapshot,
    start_trace,
)
from jupyter_gpumem.dask.gather import NOT_A_WORKER, gather, workers_of  # noqa: E402
from jupyter_gpumem.dask.live import ClusterSampler  # noqa: E402
from jupyter_gpumem.dask.plugin import MAX_ENTRIES  # noqa: E402
from jupyter_gpumem.dask.trace import cluster_trace  # noqa: E402
from jupyter_gpumem.dask.view import cluster_table  # noqa: E402
from jupyter_gpumem.data.sizes import MAX_DEVICE_SIZE  # noqa: E402
from tests.dask.sim_cluster import sim_cluster  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class UntouchedClient:
    """A client that fails the test when anything asks it for anything."""

    status = "running"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the client was asked for {name!r}: nothing should be asked")


def _returns_within(limit: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s value, called in a thread; fails the test if it has not returned in ``limit``
    seconds (a hang then fails instead of hanging the run)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still waiting after {limit} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# -- timeouts and intervals: refused before anything is asked ------------------------------------

NOT_SECONDS = [math.nan, math.inf, -math.inf, 0, -1, "1", True, None, 1e12]

GATHERS: dict[str, Callable[[Any, Any], Any]] = {
    "memory_stats": lambda c, t: memory_stats(c, timeout=t),
    "memory_summary": lambda c, t: memory_summary(c, timeout=t),
    "snapshot": lambda c, t: snapshot(c, timeout=t),
    "cluster_snapshot": lambda c, t: cluster_snapshot(c, timeout=t),
    "dump_snapshot": lambda c, t: dump_snapshot(c, "never-written.pickle", timeout=t),
    "start_trace": lambda c, t: start_trace(c, timeout=t),
    "gather": lambda c, t: gather(c, os.getpid, timeout=t),
    "cluster_table": lambda c, t: cluster_table(c, timeout=t),
    "cluster_trace": lambda c, t: cluster_trace(c, timeout=t),
    "ClusterSampler": lambda c, t: ClusterSampler(c, timeout=t),
}


@pytest.mark.parametrize(("name", "bad"), [
    (name, bad) for name in sorted(GATHERS) for bad in NOT_SECONDS
    if not (name == "ClusterSampler" and bad is None)])  # the sampler's None: its default
def test_every_gather_refuses_a_timeout_that_is_no_time(name: str, bad: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout must be a number of seconds in \(0, "):
        GATHERS[name](UntouchedClient(), bad)


@pytest.mark.parametrize("bad", NOT_SECONDS, ids=repr)
def test_the_sampler_refuses_an_interval_that_is_no_time(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^interval must be a number of seconds in \(0, 3600\]"):
        ClusterSampler(UntouchedClient(), interval=bad)


def test_stopping_a_sampler_with_a_bad_timeout_changes_nothing() -> None:
    sampler = ClusterSampler(UntouchedClient(), interval=1.0)
    for bad in (math.nan, math.inf, -1, "1"):
        with pytest.raises(ValueError, match="timeout"):
            sampler.stop(timeout=bad)
    assert not sampler._stop.is_set()
    sampler.stop(timeout=0)  # a sampler that never started stops at once
    assert sampler._stop.is_set()


def test_the_sampler_refuses_a_window_no_deque_can_hold() -> None:
    for bad in (2**70, 1, 2.5, True):
        with pytest.raises(ValueError, match=r"capacity must be an int of rounds in \[2, "):
            ClusterSampler(UntouchedClient(), capacity=bad)


# -- history lengths and device sizes: the engine's own limits, refused on the client -----------

@pytest.mark.parametrize("call", [
    lambda c, n: start_trace(c, max_entries=n),
    lambda c, n: cluster_trace(c, max_entries=n),
], ids=["start_trace", "cluster_trace"])
def test_a_history_longer_than_a_core_keeps_is_refused_before_any_worker_is_asked(call) -> None:
    for bad in (MAX_ENTRIES + 1, 2**70, 0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"max_entries must be an int in \[1, "):
            call(UntouchedClient(), bad)


@pytest.mark.parametrize("call", [
    lambda c, v: start_trace(c, stacks=v),
    lambda c, v: cluster_trace(c, stacks=v),
    lambda c, v: GpuMemPlugin("sim", stacks=v),
], ids=["start_trace", "cluster_trace", "GpuMemPlugin"])
def test_stacks_is_a_bool_not_a_word(call) -> None:
    for bad in ("no", "", 0, 1, None):  # "no" was read as True
        with pytest.raises(ValueError, match=rf"^stacks must be True or False, got {bad!r}$"):
            call(UntouchedClient(), bad)


def test_the_plugin_refuses_what_setup_would_fail_on() -> None:
    for bad in (MAX_DEVICE_SIZE + 1, 2**70, 0, -1, 1.5, True):
        with pytest.raises(ValueError, match=rf"capacity must be an int of bytes in \[1, "
                                             rf"{MAX_DEVICE_SIZE}\]"):
            GpuMemPlugin("sim", capacity=bad)
    for bad in (MAX_ENTRIES + 1, 2**70, 0, -1, 2.0):
        with pytest.raises(ValueError, match=r"history must be a bool or an int in \[1, "):
            GpuMemPlugin("sim", history=bad)
    plugin = GpuMemPlugin("sim", capacity=MAX_DEVICE_SIZE, history=MAX_ENTRIES)
    assert (plugin.capacity, plugin.max_entries) == (MAX_DEVICE_SIZE, MAX_ENTRIES)


@pytest.mark.parametrize("native", [None, False], ids=["default core", "Python core"])
def test_the_plugins_largest_device_is_the_largest_the_allocator_takes(native) -> None:
    a = CachingAllocator(SimulatedDevice(MAX_DEVICE_SIZE), native=native)
    a.record_history(True, max_entries=MAX_ENTRIES)
    ptr = a.malloc(3 << 20)
    a.free(ptr)
    assert a.memory_stats()["num_device_alloc"] == 1
    actions = [e["action"] for e in a.snapshot()["device_traces"][0]]
    assert actions[:2] == ["segment_alloc", "alloc"]
    if a.native:  # the C core keeps bytes in int64: one byte more does not fit
        with pytest.raises((OverflowError, ValueError)):
            CachingAllocator(SimulatedDevice(MAX_DEVICE_SIZE + 1), native=True)


# -- workers: one address, or several ---------------------------------------------------------

@pytest.mark.parametrize("bad", [b"tcp://127.0.0.1:1", 1, [1], ["tcp://a:1", None], 2.5],
                         ids=repr)
def test_workers_that_are_no_addresses_are_refused_before_anything_is_asked(bad) -> None:
    with pytest.raises(TypeError, match="workers must"):
        snapshot(UntouchedClient(), workers=bad)
    with pytest.raises(TypeError, match="workers must"):
        gather(UntouchedClient(), os.getpid, workers=bad)


# -- a scheduler that does not answer -------------------------------------------------------------

class SilentScheduler:
    """A client whose scheduler never answers (as one that is stopped would), over a real event
    loop of its own."""

    status = "running"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        class Scheduler:
            async def identity(self, **kwargs: Any) -> Any:
                await asyncio.sleep(3600)

        self.scheduler = Scheduler()

    def scheduler_info(self, **kwargs: Any) -> Any:  # a synchronous ask of the scheduler
        time.sleep(3600)

    def sync(self, fn: Callable[[], Any], callback_timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(callback_timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_a_gather_does_not_wait_past_its_bound_for_a_scheduler_that_does_not_answer() -> None:
    client = SilentScheduler()
    try:
        with pytest.raises(TimeoutError, match=r"the scheduler gave no list of its workers in "
                                               r"0\.5 s"):
            _returns_within(30, lambda: memory_stats(client, timeout=0.5))
    finally:
        client.close()


# -- on a real cluster ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with sim_cluster(2) as c:
        yield c


def _pid(dask_worker: Any = None) -> int:
    return os.getpid()


def _wait_until_everyone_answers(client: Any) -> None:
    deadline = time.monotonic() + 60
    while not gather(client, _pid, timeout=5, warn=False).complete:
        assert time.monotonic() < deadline, "gave up waiting for every worker to answer"
        time.sleep(0.1)


def test_one_address_is_one_worker(client) -> None:
    workers = workers_of(client)
    one = workers[1]
    for workers_arg in (one, [one], (one,), {one}, [one, one], iter([one])):
        got = snapshot(client, workers=workers_arg)
        assert list(got) == [one] and got.complete, workers_arg
    assert list(gather(client, _pid, workers=one)) == [one]
    assert len(snapshot(client, workers=[])) == 0


def test_an_address_that_is_no_worker_is_named_as_such(client) -> None:
    nowhere = "tcp://127.0.0.1:1"
    with pytest.warns(PartialResultWarning, match="not a worker of the cluster now"):
        got = snapshot(client, workers=[nowhere, workers_of(client)[0]])
    assert got.errors == {nowhere: NOT_A_WORKER} and list(got) == [workers_of(client)[0]]


@pytest.fixture
def stopped(client) -> Iterator[str]:
    """One worker's process stopped (SIGSTOP) for the test, resumed after it."""
    address = workers_of(client)[0]
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGSTOP)  # a worker process this module's cluster started
    try:
        yield address
    finally:
        os.kill(pid, signal.SIGCONT)
        _wait_until_everyone_answers(client)


def test_a_stopped_worker_is_named_within_the_bound_while_still_stopped(client, stopped) -> None:
    others = [w for w in workers_of(client) if w != stopped]
    with pytest.warns(PartialResultWarning, match=stopped):
        got = _returns_within(30, lambda: memory_stats(client, timeout=1.0))
    assert sorted(got) == others
    assert list(got.errors) == [stopped] and "no answer in time" in got.errors[stopped]
    alone = _returns_within(30, lambda: gather(client, _pid, workers=stopped, timeout=1.0,
                                               warn=False))
    assert len(alone) == 0 and list(alone.errors) == [stopped]


def test_a_nan_timeout_cannot_wait_for_a_stopped_worker(client, stopped) -> None:
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="timeout"):
            _returns_within(30, lambda bad=bad: memory_stats(client, timeout=bad))


def test_a_cluster_trace_with_a_stopped_worker_ends_within_its_bound(client, stopped) -> None:
    def traced() -> Any:
        with cluster_trace(client, timeout=1.0, plot=False) as t:
            pass
        return t

    t = _returns_within(60, traced)  # at most 2 s to enter, 4 s to leave
    assert list(t.errors) == [stopped]
    assert [one.worker for one in t.workers] == [w for w in workers_of(client) if w != stopped]


def test_the_sampler_marks_a_stopped_worker_stale_within_its_bound(client, stopped) -> None:
    from jupyter_gpumem.dask.live import LIVE, STALE

    sampler = ClusterSampler(client, interval=1.0, timeout=0.5)
    _returns_within(30, sampler.sample)
    assert sampler.error == ""
    assert sampler.workers[stopped].state == STALE
    assert all(w.state == LIVE for a, w in sampler.workers.items() if a != stopped)


def _recording(client: Any, address: str) -> list[bool]:
    from jupyter_gpumem.dask.worker import plugin_info

    return client.run(plugin_info, workers=[address])[address]["recording"]


def test_a_worker_stopped_during_a_trace_stops_recording_once_it_resumes(client) -> None:
    address = workers_of(client)[0]
    trace = start_trace(client, timeout=1.0)
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.warns(PartialResultWarning, match=address):
            _returns_within(60, trace.stop)  # two gathers: at most 4 s here
        assert list(trace.errors) == [address]
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait_until_everyone_answers(client)
    deadline = time.monotonic() + 60
    while _recording(client, address) != [False]:  # the stop sent without waiting lands
        assert time.monotonic() < deadline, "the resumed worker still records"
        time.sleep(0.1)


def test_a_late_stop_stops_no_newer_trace(client) -> None:
    from jupyter_gpumem.dask import worker as on_worker

    old = start_trace(client)
    old.stop()
    new = start_trace(client)
    try:
        late = gather(client, on_worker.stop_history, trace=old.name)
        assert late.complete and set(late.values()) == {False}
        assert all(_recording(client, w) == [True] for w in workers_of(client))
    finally:
        new.stop()
    assert all(_recording(client, w) == [False] for w in workers_of(client))
