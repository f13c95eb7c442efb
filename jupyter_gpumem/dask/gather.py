"""Gathering from every worker: stats, summaries, snapshots, and one cluster snapshot.

Every call asks the workers through ``client.run`` with a small function of ``worker.py`` and
waits at most ``timeout`` seconds. A worker that fails, dies or does not answer in time is left
out: the result holds the others, its ``errors`` say what happened to each missing worker, and a
``PartialResultWarning`` says it once. Nothing waits longer than about twice ``timeout``.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any, Generic, TypeVar

from jupyter_gpumem.dask import worker as on_worker
from jupyter_gpumem.data.schema import SCHEMA_VERSION, Snapshot, TraceEntry

T = TypeVar("T")

#: Seconds a gather waits for the workers, by default.
DEFAULT_TIMEOUT = 10.0


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


def gather(client: Any, function: Any, *args: Any, workers: list[str] | None = None,
           timeout: float = DEFAULT_TIMEOUT, warn: bool = True, **kwargs: Any) -> Gathered[Any]:
    """``function(*args, **kwargs)`` on each worker (default: all of them now), as
    ``Gathered``. ``workers`` that are no longer in the cluster are reported, not asked."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    current = workers_of(client)
    wanted = current if workers is None else sorted(workers)
    errors = {addr: "not in the cluster any more (the worker left or died)"
              for addr in wanted if addr not in current}
    asked = [addr for addr in wanted if addr in current]

    async def ask(addrs: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = await asyncio.wait_for(
            client._run(function, *args, workers=addrs, on_error="return", **kwargs), timeout)
        return out

    async def run() -> dict[str, Any]:
        if not asked:
            return {}
        try:
            return await ask(asked)
        except TimeoutError:
            pass
        # someone is slow: ask each worker on its own, so the others still answer
        ones = await asyncio.gather(*(ask([a]) for a in asked), return_exceptions=True)
        merged: dict[str, Any] = {}
        for addr, one in zip(asked, ones, strict=True):
            if isinstance(one, BaseException):
                merged[addr] = one
            else:
                merged.update(one)
        return merged

    results: dict[str, Any] = client.sync(run)
    answers: dict[str, Any] = {}
    for addr in asked:
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


def memory_stats(client: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Gathered[dict[str, Any]]:
    """Each worker's ``{"gpu": {...}, "stats": memory_stats()}``, keyed by its address."""
    return gather(client, on_worker.worker_stats, timeout=timeout)


def memory_summary(client: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Gathered[dict[str, Any]]:
    """Each worker's ``{"gpu": {...}, "summary": memory_summary()}``, keyed by its address."""
    return gather(client, on_worker.worker_summary, timeout=timeout)


def snapshot(client: Any, *, workers: list[str] | None = None,
             timeout: float = DEFAULT_TIMEOUT) -> Gathered[Snapshot]:
    """Each worker's snapshot (segments, recorded history with task keys, its GPU), keyed by
    its address."""
    return gather(client, on_worker.worker_snapshot, workers=workers, timeout=timeout)


def merge_snapshots(snapshots: dict[str, Snapshot],
                    errors: dict[str, str] | None = None) -> Snapshot:
    """One snapshot of several workers, in our schema: worker ``k`` (in address order) is device
    ``k``, its segments carry ``device = k`` and its trace is ``device_traces[k]``.
    ``jupyter_gpumem["devices"][str(k)]`` is the worker's own extra (stats, config, GPU) plus
    ``worker``; ``jupyter_gpumem["workers"]`` maps addresses to device indexes; trace entries'
    ``task`` index the merged ``jupyter_gpumem["tasks"]``; ``errors`` lists missing workers."""
    segments: list[Any] = []
    traces: list[list[TraceEntry]] = []
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
        traces.append([  # copies of the entries whose task index changes
            {**entry, "task": remap[entry["task"]]} if "task" in entry else entry
            for entry in trace])
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
    renderers, ``python -m jupyter_gpumem summary`` and ``save_snapshot`` take as they are."""
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
                 timeout: float) -> None:
        self.client = client
        #: The workers recording (those that started).
        self.workers = workers
        #: Workers that could not start, and why.
        self.start_errors = errors
        self.timeout = timeout
        self.snapshot: Snapshot | None = None
        self.errors: dict[str, str] = {}

    def stop(self) -> Snapshot:
        """Gather every recording worker's snapshot, stop their recording, merge: a worker that
        died or left meanwhile is named in ``errors`` (and the snapshot's ``missing_workers``)."""
        got = gather(self.client, on_worker.worker_snapshot, workers=self.workers,
                     timeout=self.timeout, warn=False)
        gather(self.client, on_worker.stop_history, workers=sorted(got), timeout=self.timeout,
               warn=False)
        self.errors = {**self.start_errors, **got.errors}
        self.snapshot = merge_snapshots(got, self.errors)
        if self.errors:
            message = Gathered(dict(got), self.errors).message
            warnings.warn(f"cluster trace: {message}", PartialResultWarning, stacklevel=2)
        return self.snapshot


def start_trace(client: Any, *, max_entries: int = 100_000, stacks: bool = True,
                timeout: float = DEFAULT_TIMEOUT) -> ClusterTrace:
    """Start recording history afresh on every worker; ``.stop()`` gathers it."""
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
    got = gather(client, on_worker.start_history, max_entries, bool(stacks), timeout=timeout,
                 warn=False)
    return ClusterTrace(client, sorted(got), dict(got.errors), timeout)
