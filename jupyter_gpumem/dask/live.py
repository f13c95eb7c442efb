"""Live sampling of every worker: a tiny fixed-size record per worker per round, ≥ 1 Hz.

``ClusterSampler(client, interval=1.0)`` runs a background thread that, once a round, asks every
worker for ``RECORD`` (allocated, reserved, peak allocated, device total, OOMs, retries, the GPU,
the running task's prefix: ``RECORD_BYTES`` bytes whatever the history or the snapshot holds) and
keeps the last ``capacity`` rounds. Listeners (``on_round``) get each new round as it lands.

The mechanism: one round trip through the scheduler. The client sends the scheduler one small
coroutine (``client.run_on_scheduler``); the scheduler asks each of *its current* workers for
the record concurrently, each under its own timeout, and answers with whatever came in time,
keyed by address, plus the workers' names. So

- traffic per round is bounded: one request and one answer between client and scheduler, and
  ``RECORD_BYTES`` (plus the address and Dask's framing) per worker, never history;
- a slow, hung or dying worker costs one ``timeout`` and shows as *stale* in that round; it
  never holds up the others, and the client waits at most ``timeout`` plus a margin;
- the worker set comes with every answer: workers that joined get a row, workers that left are
  marked *gone* (their row stays while it has samples in the window).

Why not Dask's own metrics: worker heartbeats carry ``metrics`` (and ``WorkerPlugin`` could add
ours through ``Worker.digests``/custom metrics), but the heartbeat interval grows with the
cluster (``distributed.worker.heartbeat``: about 1 s per 10 workers, 6.4 s at 64), so it cannot
give 1 Hz at 64 workers. Why not ``client.run`` of every worker directly: the broadcast behind it
has no per-worker timeout, so one hung worker would time out the whole round (``gather.py``
then asks each worker on its own, costing N more calls); the scheduler-side fan-out gives each
worker its own timeout in one call. When the scheduler cannot run our coroutine (a locked-down
scheduler), the sampler falls back to ``gather.gather`` with the same record function.

The coroutine is a closure, so cloudpickle ships it by value: the scheduler needs only
``distributed``, not this package. The workers need the package (they run the plugin anyway).
"""

from __future__ import annotations

import atexit
import struct
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jupyter_gpumem.dask import gather as gathering
from jupyter_gpumem.data.units import MAX_INTERVAL, check_seconds

#: The record: allocated, reserved, peak allocated, device total, OOMs, retries (int64 each),
#: the GPU index (int16; -1 unknown), then the running task's prefix as UTF-8, zero-padded.
RECORD = struct.Struct("<6qh42s")
RECORD_BYTES = RECORD.size  # 92
#: The longest task text a record carries, in bytes (longer prefixes are cut).
TASK_BYTES = 42

#: Columns of a round's ``values`` (float64, one row per worker of the round).
FIELDS = ("allocated", "reserved", "peak", "ooms", "retries", "state")
#: A worker's state in a round: answered, no answer in time (or an error), left the cluster.
LIVE, STALE, GONE = 0, 1, 2
STATE_NAMES = {LIVE: "live", STALE: "stale", GONE: "gone"}

DEFAULT_INTERVAL = 1.0
DEFAULT_CAPACITY = 600
#: The most rounds a sampler keeps (what a ``deque`` can be told to hold).
MAX_CAPACITY = sys.maxsize
#: Rounds to wait for once the answer is late, beyond the workers' timeout (scheduler, network).
_MARGIN = 2.0


def encode_record(allocated: int, reserved: int, peak: int, total: int, ooms: int,
                  retries: int, gpu: int, task: str) -> bytes:
    """One worker's record: ``RECORD_BYTES`` bytes."""
    text = task.encode("utf-8")[:TASK_BYTES]
    text = text.decode("utf-8", "ignore").encode("utf-8")  # never half a character
    return RECORD.pack(allocated, reserved, peak, total, ooms, retries,
                       max(-1, min(gpu, 32767)), text)


def decode_record(data: bytes) -> tuple[int, int, int, int, int, int, int, str]:
    """``encode_record``'s values back."""
    a, r, p, total, ooms, retries, gpu, text = RECORD.unpack(data)
    return a, r, p, total, ooms, retries, gpu, text.rstrip(b"\0").decode("utf-8", "replace")


def worker_record(device: int | None = None) -> bytes:
    """Run on a worker: its record (``NoPluginError`` without the plugin)."""
    import os

    from dask.utils import key_split

    from jupyter_gpumem.dask.plugin import process_state
    from jupyter_gpumem.dask.worker import _allocator

    allocator = _allocator(device)
    s = allocator.memory_stats()
    state = process_state()
    running = state.labels.running() if state is not None else []
    task = " | ".join(dict.fromkeys(key_split(k) for k in running))
    gpu = allocator.device.index
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if visible.isdigit():  # dask-cuda rotates it: its first entry is the physical GPU
        gpu = int(visible)
    return encode_record(s.get("allocated_bytes.all.current", 0),
                         s.get("reserved_bytes.all.current", 0),
                         s.get("allocated_bytes.all.peak", 0),
                         allocator.device.mem_get_info()[1],
                         s.get("num_ooms", 0), s.get("num_alloc_retries", 0), gpu, task)


def _fan_out_coroutine() -> Callable[..., Any]:
    """The coroutine the scheduler runs (a closure: shipped by value, see the module notes)."""

    async def fan_out(function: bytes, timeout: float, dask_scheduler: Any = None
                      ) -> tuple[dict[str, Any], dict[str, str]]:
        import asyncio

        from distributed.protocol.serialize import Serialize, Serialized, deserialize

        msg = {"op": "run", "function": function, "args": b"", "kwargs": b"", "wait": True}
        addrs = list(dask_scheduler.workers)

        async def ask(addr: str) -> Any:
            try:
                got = await asyncio.wait_for(
                    dask_scheduler.broadcast(msg=msg, workers=[addr], on_error="return"),
                    timeout)
            except TimeoutError:
                return "no answer in time"
            except Exception as exc:  # the worker went away while answering
                return f"{type(exc).__name__}: {exc}"[:200]
            resp = got.get(addr)
            if isinstance(resp, dict) and resp.get("status") == "OK":
                result = resp.get("result")
                if isinstance(result, Serialized):  # the worker's bytes, framed by Dask
                    result = deserialize(result.header, result.frames)  # type: ignore[no-untyped-call]
                elif isinstance(result, Serialize):  # not framed: an in-process worker
                    result = result.data
                return result if isinstance(result, bytes) else "not a record"

            if isinstance(resp, dict):
                return f"{resp.get('exception_text') or 'error'}"[:200]
            return f"{type(resp).__name__}: {resp}"[:200]

        answers = await asyncio.gather(*(ask(a) for a in addrs))
        names = {a: str(getattr(dask_scheduler.workers.get(a), "name", a))[:64] for a in addrs}
        return dict(zip(addrs, answers, strict=True)), names

    return fan_out


@dataclass
class WorkerRow:
    """A worker the sampler has seen: its row (stable, in order of arrival), name, GPU."""

    address: str
    row: int
    name: str
    gpu: int = -1
    total: int = 0
    state: int = LIVE
    why: str = ""  # why it is stale or gone
    last_round: int = -1  # the last round it answered
    gone_round: int = -1  # the round it was first missing from the cluster
    task: str = ""

    @property
    def short_name(self) -> str:
        """The worker's name when short (LocalCluster's 0, 1, ...; dask-cuda's), else its port."""
        if self.name and self.name != self.address and len(self.name) <= 16:
            return self.name
        tail = self.address.rsplit(":", 1)[-1]
        return f":{tail}" if tail.isdigit() else self.address[-16:]

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, "address": self.address, "name": self.short_name,
                "gpu": self.gpu, "total": self.total, "state": STATE_NAMES[self.state],
                "why": self.why}


@dataclass
class Round:
    """One sampling round: its time (seconds since start), and a row of ``values`` (``FIELDS``)
    and a task per worker in it (``rows``: the workers' row numbers)."""

    index: int
    t: float
    rows: np.ndarray  # int32, the workers' row numbers
    values: np.ndarray  # float64, len(rows) x len(FIELDS)
    tasks: list[str] = field(default_factory=list)


class ClusterSampler:
    """Sample every worker of ``client`` every ``interval`` seconds in a background thread.

    ``timeout`` (default ``min(interval, 1)`` × 0.8) bounds each worker's answer; ``capacity``
    rounds are kept (the window). ``clock`` gives seconds (injectable for tests). The thread
    stops on ``stop()``, when the client closes, and at interpreter exit.
    """

    def __init__(self, client: Any, interval: float = DEFAULT_INTERVAL, *,
                 timeout: float | None = None, capacity: int = DEFAULT_CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        interval = check_seconds("interval", interval, most=MAX_INTERVAL)
        timeout = check_seconds("timeout", 0.8 * min(interval, 1.0) if timeout is None
                                else timeout)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                not 2 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be an int of rounds in [2, {MAX_CAPACITY}], got "
                             f"{capacity!r}")
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.capacity = capacity
        self.clock = clock
        self.rounds: deque[Round] = deque(maxlen=capacity)
        self.workers: dict[str, WorkerRow] = {}
        #: The last round's failure as a whole (the scheduler did not answer), "" when none.
        self.error = ""
        #: Bytes of the last answer's records (``RECORD_BYTES`` per answering worker).
        self.last_bytes = 0
        self.mode = "scheduler"  # or "run": the fallback through client.run
        #: The last exception a listener raised (sampling goes on), None when none.
        self.listener_error: BaseException | None = None
        self._listeners: list[Callable[[ClusterSampler, Round], None]] = []
        self._on_end: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: float | None = None  # the clock at the first round
        self._next_row = 0
        self._index = 0
        self._fan_out = _fan_out_coroutine()
        from distributed.protocol.pickle import dumps

        self._function: bytes = dumps(worker_record)  # type: ignore[no-untyped-call]

    # -- listeners and life ----------------------------------------------------------------

    def on_round(self, callback: Callable[[ClusterSampler, Round], None]) -> None:
        """Call ``callback(sampler, round)`` after each round (in the sampler's thread)."""
        self._listeners.append(callback)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the sampling thread ends (stopped, or the client closed)."""
        self._on_end.append(callback)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> ClusterSampler:
        """Sample now and then every ``interval`` seconds, in a background thread."""
        if self._thread is not None:
            raise RuntimeError("this ClusterSampler was already started")
        self._thread = threading.Thread(target=self._run, name="jupyter_gpumem-cluster-sampler",
                                        daemon=True)
        _SAMPLERS.add(self)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it: at most ``timeout`` seconds (default: about one
        round, ``self.timeout`` plus a margin)."""
        if timeout is not None:
            timeout = check_seconds("timeout", timeout, least_ok=True)
        self._stop.set()
        _SAMPLERS.discard(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timeout + _MARGIN + 1 if timeout is None else timeout)

    def _client_closed(self) -> bool:
        return str(getattr(self.client, "status", "running")) in ("closing", "closed")

    def _run(self) -> None:
        next_at = self.clock()
        while not self._stop.is_set():
            if self._client_closed():
                break
            self.sample()
            next_at = max(next_at + self.interval, self.clock())
            if self._stop.wait(max(0.0, next_at - self.clock())):
                break
        self._stop.set()
        _SAMPLERS.discard(self)
        for callback in list(self._on_end):
            try:
                callback()
            except Exception as exc:  # e.g. the kernel is shutting down its output
                self.listener_error = exc

    # -- one round ---------------------------------------------------------------------------

    def _ask(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Every worker's answer (record bytes, or why not) and the workers' names."""
        if self.mode == "scheduler":
            try:
                return self._ask_scheduler()
            except (TimeoutError, OSError):
                raise
            except Exception:  # the scheduler would not run it: ask the workers directly
                if self._client_closed():
                    raise
                self.mode = "run"
        got = gathering.gather(self.client, worker_record, timeout=self.timeout, warn=False)
        answers: dict[str, Any] = dict(got)
        answers.update(got.errors)
        return answers, {}

    def _ask_scheduler(self) -> tuple[dict[str, Any], dict[str, str]]:
        import asyncio

        client = self.client

        async def ask() -> Any:
            return await asyncio.wait_for(
                client._run_on_scheduler(self._fan_out, self._function, self.timeout),
                self.timeout + _MARGIN)

        # the calling thread's own bound too, should the event loop not give up in time
        answers, names = client.sync(ask, callback_timeout=self.timeout + 2 * _MARGIN)
        return dict(answers), dict(names)

    def sample(self) -> Round | None:
        """Take one round now (the thread does this every ``interval``); None if the scheduler
        gave no answer (``error`` says why; every worker is then stale)."""
        if self._t0 is None:
            self._t0 = self.clock()
        t = self.clock() - self._t0
        try:
            answers, names = self._ask()
            self.error = ""
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            answers, names = None, {}
        with self._lock:
            rnd = self._record(t, answers, names)
        for callback in list(self._listeners):
            try:
                callback(self, rnd)
            except Exception as exc:  # a listener's trouble (a closed widget) stops no sampling
                self.listener_error = exc
        return rnd

    def _record(self, t: float, answers: dict[str, Any] | None, names: dict[str, str]) -> Round:
        index = self._index
        self._index += 1
        rows: list[int] = []
        values: list[tuple[float, ...]] = []
        tasks: list[str] = []
        seen = set(answers or ())
        nbytes = 0
        for addr in sorted(seen):
            w = self.workers.get(addr)
            if w is None:
                w = self.workers[addr] = WorkerRow(addr, self._next_row, names.get(addr, addr))
                self._next_row += 1
            elif names.get(addr):
                w.name = names[addr]
            answer = answers[addr] if answers is not None else None
            if isinstance(answer, bytes | bytearray) and len(answer) == RECORD_BYTES:
                a, r, p, total, ooms, retries, gpu, task = decode_record(bytes(answer))
                nbytes += RECORD_BYTES
                w.state, w.why, w.gpu, w.total, w.last_round, w.task = \
                    LIVE, "", gpu, total, index, task
                values.append((a, r, p, ooms, retries, LIVE))
            else:
                w.state, w.why = STALE, _why_text(answer)
                values.append((np.nan, np.nan, np.nan, np.nan, np.nan, STALE))
            rows.append(w.row)
            tasks.append(w.task if w.state == LIVE else "")
        for addr, w in list(self.workers.items()):
            if addr in seen:
                continue
            if answers is None:  # the scheduler did not answer: nothing is known of anyone
                w.state, w.why = (STALE, self.error) if w.state != GONE else (GONE, w.why)
            elif w.state != GONE:
                w.state, w.why, w.gone_round = GONE, "left the cluster", index
            if w.state == GONE and index - max(w.last_round, w.gone_round) >= self.capacity:
                del self.workers[addr]  # its last answer and its leaving left the window
                continue
            rows.append(w.row)
            values.append((np.nan, np.nan, np.nan, np.nan, np.nan, w.state))
            tasks.append("")
        self.last_bytes = nbytes
        rnd = Round(index, t, np.asarray(rows, dtype=np.int32),
                    np.asarray(values, dtype=np.float64).reshape(len(rows), len(FIELDS)), tasks)
        self.rounds.append(rnd)
        return rnd

    # -- reading what was sampled ----------------------------------------------------------------

    def snapshot_rounds(self) -> tuple[list[Round], list[WorkerRow]]:
        """The rounds in the window and the workers (by row), consistent with each other."""
        with self._lock:
            return list(self.rounds), sorted(self.workers.values(), key=lambda w: w.row)

    def series(self, address: str, field_name: str = "allocated") -> tuple[np.ndarray, np.ndarray]:
        """``(times, values)`` of one worker's field over the window (NaN where it was stale)."""
        col = FIELDS.index(field_name)
        rounds, workers = self.snapshot_rounds()
        row = next((w.row for w in workers if w.address == address), None)
        ts, vs = [], []
        for rnd in rounds:
            hit = np.flatnonzero(rnd.rows == row)
            if len(hit):
                ts.append(rnd.t)
                vs.append(rnd.values[hit[0], col])
        return np.asarray(ts, dtype=np.float64), np.asarray(vs, dtype=np.float64)

    def __enter__(self) -> ClusterSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _why_text(answer: object) -> str:
    if answer is None:
        return "no answer"
    if isinstance(answer, BaseException):
        return f"{type(answer).__name__}: {answer}"[:200]
    return str(answer)[:200]


_SAMPLERS: weakref.WeakSet[ClusterSampler] = weakref.WeakSet()


def stop_all_samplers() -> int:
    """Stop every running sampler (kernel shutdown, the extension's unload); how many."""
    samplers = list(_SAMPLERS)
    for s in samplers:
        s.stop()
    return len(samplers)


def _at_exit() -> None:
    stop_all_samplers()


atexit.register(_at_exit)
