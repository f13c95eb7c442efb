"""Gathering from every worker: stats, summaries, snapshots, and one cluster snapshot.

Every call asks the workers through ``client.run`` with a small function of ``worker.py``. A
worker that fails, dies or does not answer in time is left out: the result holds the others, its
``errors`` say what happened to each missing worker, and a ``PartialResultWarning`` says it once.

Note [The gather bound]: one gather returns within ``2 * timeout`` seconds (plus a moment),
whatever the workers do. It waits at most ``timeout`` for the scheduler's list of workers and the
answers of all of them together (one broadcast), and, when someone is late, at most ``timeout``
more for each worker asked on its own, concurrently: a worker that is stopped (SIGSTOP), hung in
a task holding its event loop, or gone is then named in ``errors`` while the others answer. The
calling thread itself gives up (TimeoutError) a few seconds past the bound, should the event
loop not. The scheduler's own broadcast to a stopped worker lingers until that worker resumes or
leaves; the gather does not wait for it. ``timeout`` is checked by ``data.units.check_seconds``
(NaN once made the wait unbounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

from jupyter_gpumem.dask import worker as on_worker
from jupyter_gpumem.dask.plugin import check_flag, check_max_entries
from jupyter_gpumem.data.schema import SCHEMA_VERSION, Snapshot, TraceEntry
from jupyter_gpumem.data.units import check_seconds

T = TypeVar("T")

#: Seconds a gather waits for the workers, by default (Note [The gather bound]).
DEFAULT_TIMEOUT = 10.0
#: Seconds past ``2 * timeout`` the calling thread waits for the event loop to give up.
_MARGIN = 5.0
#: Why a worker asked for by address is not asked.
NOT_A_WORKER = "not a worker of the cluster now (it left or died, or the address is wrong)"

#: ``workers`` arguments: one worker's address, or several (None: every worker now).
Workers = str | Iterable[str] | None


class PartialResultWarning(UserWarning):
    """Some workers gave no answer; the result holds the others."""


class Gathered(dict[str, T], Generic[T]):
    """Answers keyed by worker address, and ``errors``: why each missing worker is missing."""

    def __init__(self, answers: dict[str, T], errors: dict[str, str]) -> None:
        super().__init__(sorted(answers.items()))
        self.errors = dict(sorted(errors.items()))

    @property
    def complete(self) -> bool:
        return not self.errors

    @property
    def message(self) -> str:
        """One line per missing worker ("" when every worker answered)."""
        if not self.errors:
            return ""
        head = (f"{len(self.errors)} of {len(self) + len(self.errors)} worker(s) gave no answer; "
                "the result holds the others:")
        return "\n".join([head, *(f"  {addr}: {why}" for addr, why in self.errors.items())])


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time (the worker is busy, hung or gone)"
    name = type(exc).__name__
    if name in ("CommClosedError", "OSError", "StreamClosedError", "ConnectionError"):
        return f"the worker went away while answering ({name}: {exc})"
    return f"{name}: {exc}"


def workers_of(client: Any) -> list[str]:
    """The addresses of the client's workers now, sorted."""
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def check_workers(workers: object) -> list[str] | None:
    """A ``workers`` argument as sorted distinct addresses: a str is one worker's address (as
    ``client.submit(workers=...)`` takes it), any other iterable holds addresses; None stays
    None (every worker). TypeError for anything else, before anything is asked."""
    if workers is None:
        return None
    if isinstance(workers, str):
        return [workers]
    if isinstance(workers, bytes | bytearray) or not isinstance(workers, Iterable):
        raise TypeError(f"workers must be a worker address (str) or an iterable of them, got "
                        f"{type(workers).__name__}")
    out = list(workers)
    for w in out:
        if not isinstance(w, str):
            raise TypeError(f"workers must hold worker addresses (str), got {w!r}")
    return sorted(set(out))


def gather(client: Any, function: Any, *args: Any, workers: Workers = None,
           timeout: float = DEFAULT_TIMEOUT, warn: bool = True, **kwargs: Any) -> Gathered[Any]:
    """``function(*args, **kwargs)`` on each of ``workers`` (one address or several; default:
    every worker now), as ``Gathered``; ``workers`` not in the cluster are reported, not asked.
    Returns within ``2 * timeout`` seconds (Note [The gather bound]); a worker that has not
    answered by then is named in ``errors``. TimeoutError when the scheduler does not answer."""
    timeout = check_seconds("timeout", timeout)
    wanted = check_workers(workers)

    async def ask(addrs: list[str], within: float) -> dict[str, Any]:
        out: dict[str, Any] = await asyncio.wait_for(
            client._run(function, *args, workers=addrs, on_error="return", **kwargs), within)
        return out

    async def run() -> tuple[list[str], dict[str, Any]]:
        start = time.monotonic()
        try:
            info = await asyncio.wait_for(client.scheduler.identity(n_workers=-1), timeout)
        except TimeoutError:
            raise TimeoutError(f"the scheduler gave no list of its workers in {timeout:g} s"
                               ) from None
        current = sorted(info["workers"])
        asked = current if wanted is None else [a for a in wanted if a in info["workers"]]
        if not asked:
            return current, {}
        try:
            return current, await ask(asked, max(timeout - (time.monotonic() - start), 1e-3))
        except TimeoutError:
            pass
        # someone is late: ask each worker on its own, so that the others still answer
        ones = await asyncio.gather(*(ask([a], timeout) for a in asked), return_exceptions=True)
        merged: dict[str, Any] = {}
        for addr, one in zip(asked, ones, strict=True):
            if isinstance(one, BaseException):
                merged[addr] = one
            else:
                merged.update(one)
        return current, merged

    current, results = client.sync(run, callback_timeout=2 * timeout + _MARGIN)
    errors = {addr: NOT_A_WORKER for addr in wanted or () if addr not in current}
    answers: dict[str, Any] = {}
    for addr in current if wanted is None else wanted:
        if addr in errors:
            continue
        value = results.get(addr, _MISSING)
        if value is _MISSING:
            errors[addr] = "no answer (the worker left while answering)"
        elif isinstance(value, BaseException):
            errors[addr] = _why(value)
        else:
            answers[addr] = value
    out: Gathered[Any] = Gathered(answers, errors)
    if warn and out.errors:
        warnings.warn(out.message, PartialResultWarning, stacklevel=3)
    return out


_MISSING = object()


def _send_later(client: Any, function: Any, *args: Any, workers: list[str],
                **kwargs: Any) -> None:
    """Send ``function(*args, **kwargs)`` to ``workers`` and wait for nothing: a stopped worker
    runs it when it resumes; what it answers, or why it cannot, is dropped."""

    async def send() -> None:
        with contextlib.suppress(Exception):
            await client._run(function, *args, workers=workers, on_error="return", **kwargs)

    client.loop.add_callback(send)


def memory_stats(client: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Gathered[dict[str, Any]]:
    """Each worker's ``{"gpu": {...}, "stats": memory_stats()}``, keyed by its address, within
    ``2 * timeout`` seconds (Note [The gather bound])."""
    return gather(client, on_worker.worker_stats, timeout=timeout)


def memory_summary(client: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Gathered[dict[str, Any]]:
    """Each worker's ``{"gpu": {...}, "summary": memory_summary()}``, keyed by its address,
    within ``2 * timeout`` seconds."""
    return gather(client, on_worker.worker_summary, timeout=timeout)


def snapshot(client: Any, *, workers: Workers = None,
             timeout: float = DEFAULT_TIMEOUT) -> Gathered[Snapshot]:
    """Each worker's snapshot (segments, recorded history with task keys, its GPU), keyed by
    its address, within ``2 * timeout`` seconds; ``workers``: one address or several (default:
    every worker)."""
    return gather(client, on_worker.worker_snapshot, workers=workers, timeout=timeout)


def merge_snapshots(snapshots: dict[str, Snapshot],
                    errors: dict[str, str] | None = None) -> Snapshot:
    """One snapshot of several workers, in our schema: worker ``k`` (in address order) is device
    ``k``, its segments carry ``device = k`` and its trace is ``device_traces[k]``.
    ``jupyter_gpumem["devices"][str(k)]`` is the worker's own extra (stats, config, GPU) plus
    ``worker``; ``jupyter_gpumem["workers"]`` maps addresses to device indexes; trace entries'
    ``task`` index the merged ``jupyter_gpumem["tasks"]``; ``errors`` lists missing workers."""
    segments: list[Any] = []
    traces: list[Sequence[TraceEntry]] = []
    devices: dict[str, Any] = {}
    workers: dict[str, int] = {}
    tasks: list[list[str]] = []
    task_index: dict[tuple[str, ...], int] = {}
    for k, addr in enumerate(sorted(snapshots)):
        one = snapshots[addr]
        extra = dict(one.get("jupyter_gpumem") or {})
        own = extra.get("device", 0)
        theirs = extra.pop("tasks", [])
        remap = []
        for label in theirs if isinstance(theirs, list) else []:
            key = tuple(label)
            at = task_index.get(key)
            if at is None:
                at = task_index[key] = len(tasks)
                tasks.append(list(key))
            remap.append(at)
        for seg in one["segments"]:
            segments.append({**seg, "device": k})
        dt = one.get("device_traces") or []
        trace = dt[own] if isinstance(own, int) and 0 <= own < len(dt) else []
        import numpy as np

        from jupyter_gpumem.data.columns import NO_TASK, as_columns

        cols = as_columns(trace)
        task = cols.column("task")
        moved = np.append(np.asarray(remap, dtype=np.int32), NO_TASK)  # NO_TASK picks the last
        traces.append(cols.with_columns(task=moved[task]) if len(remap) else cols)
        extra["worker"] = addr
        devices[str(k)] = extra
        workers[addr] = k
    info: dict[str, object] = {"devices": devices, "workers": workers, "tasks": tasks,
                               "cluster": True}
    if errors:
        info["missing_workers"] = dict(errors)
    return {"segments": segments, "device_traces": traces, "schema": SCHEMA_VERSION,
            "jupyter_gpumem": info}


def cluster_snapshot(client: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Snapshot:
    """Every worker's snapshot as one multi-device snapshot (``merge_snapshots``), which the
    renderers, ``python -m jupyter_gpumem summary`` and ``save_snapshot`` take as they are;
    within ``2 * timeout`` seconds."""
    got = snapshot(client, timeout=timeout)
    return merge_snapshots(got, got.errors)


def dump_snapshot(client: Any, filename: str = "dump_snapshot.pickle", *,
                  timeout: float = DEFAULT_TIMEOUT) -> None:
    """Save ``cluster_snapshot(client)`` as a pickle, as ``jupyter_gpumem.dump_snapshot``."""
    from jupyter_gpumem.data.files import save_snapshot

    save_snapshot(cluster_snapshot(client, timeout=timeout), filename, pickled=True)


class ClusterTrace:
    """History recorded on every worker between ``start_trace`` and ``stop``."""

    def __init__(self, client: Any, workers: list[str], errors: dict[str, str],
                 timeout: float, name: str = "") -> None:
        self.client = client
        #: What the workers know this trace by (so that a late stop stops no newer trace).
        self.name = name
        #: The workers recording (those that started).
        self.workers = workers
        #: Workers that could not start, and why.
        self.start_errors = errors
        self.timeout = timeout
        self.snapshot: Snapshot | None = None
        self.errors: dict[str, str] = {}

    def stop(self) -> Snapshot:
        """Gather every recording worker's snapshot, stop their recording, merge: a worker that
        died, left or did not answer meanwhile is named in ``errors`` (and the snapshot's
        ``missing_workers``). Two gathers: returns within ``4 * timeout``."""
        got = gather(self.client, on_worker.worker_snapshot, workers=self.workers,
                     timeout=self.timeout, warn=False)
        gather(self.client, on_worker.stop_history, workers=sorted(got), timeout=self.timeout,
               warn=False, trace=self.name)
        late = [w for w in self.workers if w not in got]
        if late:  # stopped or hung: they still record. Tell them to stop, without waiting.
            _send_later(self.client, on_worker.stop_history, workers=late, trace=self.name)
        self.errors = {**self.start_errors, **got.errors}
        self.snapshot = merge_snapshots(got, self.errors)
        if self.errors:
            message = Gathered(dict(got), self.errors).message
            warnings.warn(f"cluster trace: {message}", PartialResultWarning, stacklevel=2)
        return self.snapshot


def start_trace(client: Any, *, max_entries: int = 100_000, stacks: bool = True,
                timeout: float = DEFAULT_TIMEOUT) -> ClusterTrace:
    """Start recording history afresh on every worker; ``.stop()`` gathers it. Returns within
    ``2 * timeout`` (Note [The gather bound]); workers that could not start are in
    ``start_errors``."""
    check_max_entries("max_entries", max_entries)
    check_flag("stacks", stacks)
    name = uuid.uuid4().hex
    got = gather(client, on_worker.start_history, max_entries, stacks, timeout=timeout,
                 warn=False, trace=name)
    return ClusterTrace(client, sorted(got), dict(got.errors), timeout, name)
