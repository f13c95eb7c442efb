"""Independent passes over a long trace run at once, on threads.

numpy lets go of the GIL inside its loops over large arrays, so passes that read the same
columns and write their own arrays (a trace's allocated bytes, its pairs, its stacks) overlap
on a machine with cores to spare: each is bound by memory, and one core does not use a
socket's memory bandwidth. A short trace runs them one after another (a thread's hand-off
costs more than the pass), as does a pass that asks for passes of its own (it would wait on
the threads it holds) and a machine with one core. A process forked from one that used the
threads starts with none (a forked child has no threads: it would wait forever)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["MIN_EVENTS", "together"]

#: Events below which passes run one after another.
MIN_EVENTS = 1 << 20
#: Threads at most, besides the caller's.
MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_on_a_pass = threading.local()  # set on the pool's threads while they run a pass


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(MAX_THREADS, os.cpu_count() or 1),
                                       thread_name_prefix="jupyter_gpumem-pass")
        return _pool


def _forget_threads() -> None:
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # (Windows does not fork)
    os.register_at_fork(after_in_child=_forget_threads)


def _run(fn: Callable[[], Any]) -> Any:
    _on_a_pass.active = True
    try:
        return fn()
    finally:
        _on_a_pass.active = False


def together(events: int, *passes: Callable[[], Any]) -> list[Any]:
    """The results of ``passes`` (functions of no argument), run at once where ``events`` (the
    trace's length) makes it worth it; the first error is raised once all have ended."""
    if (events < MIN_EVENTS or len(passes) < 2 or (os.cpu_count() or 1) < 2
            or getattr(_on_a_pass, "active", False)):
        return [p() for p in passes]
    pool = _threads()
    futures = [pool.submit(_run, p) for p in passes[1:]]
    results: list[Any] = []
    error: BaseException | None = None
    try:
        results.append(passes[0]())
    except BaseException as exc:  # raised once the others have ended
        error = exc
    for f in futures:
        try:
            results.append(f.result())
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error
    return results
