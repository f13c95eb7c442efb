"""Passes over a long trace run at once on threads (``data.together``), and the views read
from them are the same as when they run one after another."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from random_traces import CASES, random_timeline

from jupyter_gpumem.data import together as together_module
from jupyter_gpumem.data.codes import SEGMENT_ALLOC, SEGMENT_UNMAP
from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.timeline import _rare_events, oom_indices
from jupyter_gpumem.data.together import together

many_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="passes run at once only "
                                "where there are two cores or more")


@pytest.fixture
def long_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any trace counts as long: its passes run on threads."""
    monkeypatch.setattr(together_module, "MIN_EVENTS", 0)


@many_cores
def test_passes_run_at_once_and_answer_in_order(long_enough: None) -> None:
    met = threading.Barrier(3, timeout=10)  # passes one after another would never meet

    def meet(k: int) -> int:
        met.wait()
        return k * 10

    assert together(10, *(lambda k=k: meet(k) for k in range(3))) == [0, 10, 20]


def test_a_short_trace_runs_its_passes_in_the_callers_thread() -> None:
    here = threading.get_ident()
    assert together(1000, threading.get_ident, threading.get_ident) == [here, here]


@many_cores
def test_an_error_is_raised_once_every_pass_has_ended(long_enough: None) -> None:
    ended = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        ended.set()

    def bad() -> None:
        raise ValueError("a bad pass")

    with pytest.raises(ValueError, match="a bad pass"):
        together(10, bad, slow)
    assert ended.is_set()
    with pytest.raises(ValueError, match="a bad pass"):  # a pass on a thread, too
        together(10, slow, bad)


def _arrays(obj: object) -> dict[str, np.ndarray]:
    return {k: v for k, v in vars(obj).items() if isinstance(v, np.ndarray)}


@pytest.mark.parametrize(("seed", "damaged", "requests"), CASES)
def test_threads_give_the_timeline_and_lives_of_one_thread(
        seed: int, damaged: bool, requests: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, alone = random_timeline(seed, damaged, requests)
    monkeypatch.setattr(together_module, "MIN_EVENTS", 0)
    _, _, threaded = random_timeline(seed, damaged, requests)
    for name, col in _arrays(alone).items():
        assert np.array_equal(col, getattr(threaded, name)), name
    assert threaded.stacks == alone.stacks and threaded.sites == alone.sites
    assert np.array_equal(threaded.matched.end, alone.matched.end)
    assert np.array_equal(threaded.matched.orphan, alone.matched.orphan)
    assert np.array_equal(oom_indices(threaded), oom_indices(alone))
    for name, col in _arrays(live_intervals(alone)).items():
        assert np.array_equal(col, getattr(live_intervals(threaded), name)), name


def test_the_rare_events_are_those_with_a_segments_or_an_ooms_code() -> None:
    action = np.random.default_rng(5).integers(-128, 128, 100_000).astype(np.int8)
    wanted = np.flatnonzero((action >= SEGMENT_ALLOC) & (action <= SEGMENT_UNMAP))
    assert np.array_equal(_rare_events(action), wanted)


@many_cores
def test_a_pass_that_asks_for_passes_runs_them_itself(long_enough: None) -> None:
    def inner() -> list[int]:
        return together(10, *(lambda k=k: k for k in range(2 * together_module.MAX_THREADS)))

    # every thread of the pool waiting on passes queued behind it would never end
    found = together(10, *(inner for _ in range(2 * together_module.MAX_THREADS)))
    assert found == [list(range(2 * together_module.MAX_THREADS))] * (
        2 * together_module.MAX_THREADS)


@many_cores
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks only where the OS forks")
def test_a_forked_process_runs_passes_of_its_own(long_enough: None) -> None:
    assert together(10, lambda: 1, lambda: 2) == [1, 2]  # the parent's threads exist
    pid = os.fork()
    if pid == 0:  # the child: its passes must not wait on the parent's threads
        code = 1
        try:
            done = threading.Event()
            threading.Thread(target=lambda: (together(10, lambda: 1, lambda: 2), done.set()),
                             daemon=True).start()
            code = 0 if done.wait(10) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
