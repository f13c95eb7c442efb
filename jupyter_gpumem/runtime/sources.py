"""Where the views read GPU memory from: our caching allocator (CuPy's, "cupy") or PyTorch's own
allocator ("torch"), or both at once.

Every view (the status line, the per-cell footer and ledger, the live widget, ``%gpumem
summary/stats/snapshot/plot/cells/diff``, ``%%gpumem_trace`` and the OOM explainer) reads a
``MemorySource``: PyTorch's data model is ours (the flat ``memory_stats()`` keys, the snapshot
schema, the trace events), so PyTorch's allocator is read directly, with nothing installed into
PyTorch. ``AllocatorSource`` adapts our ``CachingAllocator``; ``TorchSource`` wraps
``torch.cuda.memory`` (injected: tests pass a fake module; ``torch`` itself is imported only when
a ``TorchSource`` is made without one).

``use_sources(("torch",))`` (``%gpumem source torch``, ``jupyter_gpumem.use_torch()``) picks the
sources; ``selected()`` says which are on. See Note [Cell peak under PyTorch].
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from jupyter_gpumem.render.summary import format_summary
from jupyter_gpumem.runtime import registry

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.engine.stats import Watermark

__all__ = ["LABELS", "AllocatorSource", "CellMark", "CellPeak", "MemorySource", "TorchSource",
           "cupy_allocator", "current_sources", "selected", "torch_source", "use_sources",
           "use_torch"]

Label = Literal["cupy", "torch"]
LABELS: tuple[Label, ...] = ("cupy", "torch")


@dataclass(frozen=True)
class CellPeak:
    """The highest allocated bytes while a cell ran: exactly ``bytes``, or at most ``bytes``
    when ``exact`` is false (Note [Cell peak under PyTorch])."""

    bytes: int
    exact: bool = True
    how: str = "counter"  # "counter", "watermark", "history" or "bound"

    def text(self, format_bytes: Callable[[int], str]) -> str:
        return format_bytes(self.bytes) if self.exact else f"≤ {format_bytes(self.bytes)}"


@dataclass
class CellMark:
    """What a source read at the start of a cell, to work out its peak at the end."""

    allocated: int  # c0: allocated bytes at the start
    peak: int  # p0: the peak counter at the start
    start_us: int  # the clock at the start (µs), to cut the history's events
    token: Any = None  # the source's own (our allocator: the Watermark)


class MemorySource(Protocol):
    """What the views need of a memory source."""

    label: str  # "cupy" or "torch": the name in labelled rows

    @property
    def device_index(self) -> int: ...

    @property
    def device_name(self) -> str: ...

    def memory_stats(self) -> dict[str, int]:
        """PyTorch's flat ``memory_stats()`` keys."""

    def memory_allocated(self) -> int: ...

    def memory_reserved(self) -> int: ...

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device."""

    def snapshot(self) -> Snapshot:
        """Segments, blocks and the recorded trace, in our schema (PyTorch's). Views call it:
        where the source can, reading adds no "snapshot" event to the user's history."""

    def memory_summary(self, abbreviated: bool = False) -> str: ...

    def history_on(self) -> bool:
        """Whether trace events are being recorded."""

    def record_history(self, enabled: bool, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None: ...

    def start_cell(self) -> CellMark: ...

    def cell_peak(self, mark: CellMark) -> CellPeak: ...

    @property
    def oom_errors(self) -> tuple[type[BaseException], ...]:
        """The out-of-memory exception classes of this source."""


def _wall_us() -> int:
    return time.time_ns() // 1000


# -- our allocator -------------------------------------------------------------------------------

class AllocatorSource:
    """Our ``CachingAllocator`` as a ``MemorySource`` ("cupy"): the cell peak is a watermark."""

    label = "cupy"

    def __init__(self, allocator: CachingAllocator) -> None:
        self.allocator = allocator

    @property
    def device_index(self) -> int:
        return int(self.allocator.device.index)

    @property
    def device_name(self) -> str:
        return str(self.allocator.device.name)

    def memory_stats(self) -> dict[str, int]:
        return self.allocator.memory_stats()

    def memory_allocated(self) -> int:
        return self.allocator.memory_allocated()

    def memory_reserved(self) -> int:
        return self.allocator.memory_reserved()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.allocator.device.mem_get_info()
        return int(free), int(total)

    def snapshot(self) -> Snapshot:
        return self.allocator.snapshot(mark=False)  # a view's read: the user's trace stays

    def memory_summary(self, abbreviated: bool = False) -> str:
        return self.allocator.memory_summary(abbreviated=abbreviated)

    def history_on(self) -> bool:
        h = self.allocator.history
        return h is not None and h.max_entries > 0

    def record_history(self, enabled: bool, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        self.allocator.record_history(enabled, stacks=stacks, max_entries=max_entries)

    def start_cell(self) -> CellMark:
        st = self.allocator.stats
        return CellMark(st.allocated_bytes.all.current, st.allocated_bytes.all.peak, _wall_us(),
                        self.allocator.start_watermark("cell"))

    def cell_peak(self, mark: CellMark) -> CellPeak:
        watermark: Watermark = self.allocator.stop_watermark(mark.token)
        return CellPeak(watermark.peak_allocated, True, "watermark")

    @property
    def oom_errors(self) -> tuple[type[BaseException], ...]:
        from jupyter_gpumem.engine.oom import OutOfMemoryError

        return (OutOfMemoryError,)


# -- PyTorch's allocator -------------------------------------------------------------------------

class TorchSource:
    """PyTorch's CUDA caching allocator as a ``MemorySource`` ("torch").

    ``memory_module`` is ``torch.cuda.memory`` (imported when not given); ``cuda_module`` is what
    answers ``current_device``, ``get_device_name`` and ``OutOfMemoryError`` (``torch.cuda``;
    by default the memory module when one is given, so a fake is one object). Nothing is
    installed into PyTorch and its peak counters are never reset."""

    label = "torch"

    def __init__(self, memory_module: Any = None, *, device: int | None = None,
                 cuda_module: Any = None, clock_us: Callable[[], int] = _wall_us) -> None:
        if memory_module is None:
            import torch.cuda
            import torch.cuda.memory

            memory_module = torch.cuda.memory
            cuda_module = cuda_module or torch.cuda
        self.memory = memory_module
        self.cuda = cuda_module if cuda_module is not None else memory_module
        self._device = device
        self._clock_us = clock_us
        self._ours = False  # history is on because we turned it on (and off again after)
        #: the trace of the last ``%%gpumem_trace`` cell (its history may be off again since)
        self.last_trace: Snapshot | None = None

    @property
    def device_index(self) -> int:
        if self._device is not None:
            return self._device
        return int(self.cuda.current_device())

    @property
    def device_name(self) -> str:
        try:
            return str(self.cuda.get_device_name(self.device_index))
        except Exception:  # a fake or an uninitialised CUDA: the number is enough
            return f"cuda:{self.device_index}"

    def memory_stats(self) -> dict[str, int]:
        # An allocator that has allocated nothing yet answers {}.
        return {str(k): int(v) for k, v in self.memory.memory_stats(self.device_index).items()
                if isinstance(v, int)}

    def _stat(self, key: str) -> int:
        return self.memory_stats().get(key, 0)

    def memory_allocated(self) -> int:
        return int(self.memory.memory_allocated(self.device_index))

    def memory_reserved(self) -> int:
        return int(self.memory.memory_reserved(self.device_index))

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.memory.mem_get_info(self.device_index)
        return int(free), int(total)

    def snapshot(self) -> Snapshot:
        from jupyter_gpumem.data.schema import check_snapshot

        # PyTorch's _snapshot() logs a "snapshot" trace entry whenever history is on and has no
        # way to read without one: a view of PyTorch's allocator marks the user's trace.
        index = self.device_index
        raw = self.memory._snapshot(index)
        snap = dict(raw)  # PyTorch's own dict may carry extra keys: keep them
        snap["segments"] = list(raw.get("segments", []))
        snap["device_traces"] = [list(t) for t in raw.get("device_traces", [])]
        if "jupyter_gpumem" not in snap:  # what PyTorch's snapshot does not say: the device
            free, total = self.mem_get_info()
            info: dict[str, Any] = {"device": index, "device_name": self.device_name,
                                    "device_total": total, "device_free": free,
                                    "source": "torch"}
            fraction = self.memory_fraction()
            if fraction is not None:
                info["memory_fraction"] = fraction
            snap["jupyter_gpumem"] = info
        return check_snapshot(snap)

    def memory_fraction(self) -> float | None:
        """The per-process memory fraction PyTorch has now, when it is below 1 and PyTorch can
        say (``get_per_process_memory_fraction``, PyTorch 2.9 and later); else None."""
        read = getattr(self.memory, "get_per_process_memory_fraction", None)
        if read is None:
            return None
        try:
            fraction = float(read(self.device_index))
        except Exception:  # an uninitialised device, or a fake without it
            return None
        return fraction if 0.0 < fraction < 1.0 else None

    def memory_summary(self, abbreviated: bool = False) -> str:
        return format_summary(self.memory_stats(), self.device_index, abbreviated=abbreviated)

    # -- history ---------------------------------------------------------------------------

    def history_on(self) -> bool:
        """Whether PyTorch records trace events now: asked of PyTorch where it can say
        (``_cuda_isHistoryEnabled``), else whether the last snapshot holds any event."""
        probe = getattr(self.memory, "_cuda_isHistoryEnabled", None)
        if probe is None:
            probe = getattr(getattr(self.memory, "_C", None), "_cuda_isHistoryEnabled", None)
        if probe is not None:
            return bool(probe())
        if self._ours:
            return True
        # a last resort (an old PyTorch): this read marks the trace, as snapshot() does
        traces = self.memory._snapshot(self.device_index).get("device_traces", [])
        return any(len(t) for t in traces)

    def record_history(self, enabled: bool, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        record = self.memory._record_memory_history
        if not enabled:
            record(enabled=None)
            self._ours = False
            return
        kwargs: dict[str, Any] = {"enabled": "all", "context": "all" if stacks else None,
                                  "stacks": "python", "max_entries": max_entries}
        if _accepts(record, "clear_history"):
            kwargs["clear_history"] = True  # only this recording's events in the trace
        record(**kwargs)
        self._ours = True

    @property
    def recording_ours(self) -> bool:
        """Whether the history on now was turned on by us (``record_history``)."""
        return self._ours

    # -- the cell peak: Note [Cell peak under PyTorch] ----------------------------------------

    def start_cell(self) -> CellMark:
        st = self.memory_stats()
        return CellMark(st.get("allocated_bytes.all.current", 0),
                        st.get("allocated_bytes.all.peak", 0), self._clock_us(), None)

    def cell_peak(self, mark: CellMark, snapshot: Snapshot | None = None) -> CellPeak:
        st = self.memory_stats()
        c1 = st.get("allocated_bytes.all.current", 0)
        p1 = st.get("allocated_bytes.all.peak", 0)
        if p1 > mark.peak:
            return CellPeak(p1, True, "counter")
        low = max(mark.allocated, c1)
        if low >= mark.peak:
            return CellPeak(low, True, "counter")
        found = self._peak_from_history(mark, snapshot)
        if found is not None:
            return CellPeak(found, True, "history")
        return CellPeak(mark.peak, False, "bound")

    def _peak_from_history(self, mark: CellMark, snapshot: Snapshot | None) -> int | None:
        if snapshot is None:
            if not self.history_on():
                return None
            snapshot = self.snapshot()
        return history_peak(snapshot, self.device_index, mark.start_us, mark.allocated)

    @property
    def oom_errors(self) -> tuple[type[BaseException], ...]:
        found = getattr(self.cuda, "OutOfMemoryError", None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return (found,)
        return ()


def history_peak(snapshot: Snapshot, device: int, start_us: int, start_allocated: int
                 ) -> int | None:
    """The highest allocated bytes over the events of ``snapshot``'s trace from ``start_us`` on,
    when those events account for the whole time since (the allocated bytes they work back to
    at their start equal ``start_allocated``); None otherwise."""
    from jupyter_gpumem.data.timeline import build_timeline

    traces = snapshot["device_traces"]
    if device >= len(traces):
        return None
    events = [e for e in traces[device] if e["time_us"] >= start_us and e["action"] != "snapshot"]
    window: Snapshot = {"segments": snapshot["segments"],
                        "device_traces": [events if i == device else []
                                          for i in range(len(traces))]}
    tl = build_timeline(window, device)
    if tl.start_allocated != start_allocated:
        return None  # events before the cell's start are missing: not the whole cell
    return max(start_allocated, int(tl.allocated.max()) if len(tl) else start_allocated)


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# -- which sources are on ------------------------------------------------------------------------

_lock = threading.RLock()
_selected: tuple[Label, ...] = ("cupy",)
_torch: TorchSource | None = None


def selected() -> tuple[Label, ...]:
    """The sources the views read, in order (``("cupy",)`` until told otherwise)."""
    return _selected


def use_sources(labels: tuple[str, ...] | list[str], *, memory_module: Any = None) -> None:
    """Point every view at ``labels`` (``"cupy"``, ``"torch"`` or both). A torch source is made
    on first use (``memory_module``: what to read in place of ``torch.cuda.memory``); it raises
    ``ImportError`` when PyTorch is missing, and nothing changes."""
    global _selected, _torch
    wanted = tuple(dict.fromkeys(labels))
    if not wanted or any(label not in LABELS for label in wanted):
        raise ValueError(f"sources must be some of {LABELS}, got {tuple(labels)!r}")
    with _lock:
        torch = _torch
        if "torch" in wanted and (torch is None or memory_module is not None):
            torch = TorchSource(memory_module)
        _torch = torch
        _selected = tuple(label for label in LABELS if label in wanted)


def use_torch(memory_module: Any = None, *, also_cupy: bool = False) -> None:
    """Point every view at PyTorch's allocator (``%gpumem source torch``); with ``also_cupy``,
    at both (``%gpumem source both``)."""
    use_sources(("cupy", "torch") if also_cupy else ("torch",), memory_module=memory_module)


def torch_source() -> TorchSource | None:
    """The torch source when it is selected, else None."""
    return _torch if "torch" in _selected else None


def cupy_allocator() -> CachingAllocator | None:
    """Our current allocator when the "cupy" source is selected (and there is one), else None:
    the ledger's and the cell hooks' view of CuPy."""
    return registry.current_allocator() if "cupy" in _selected else None


def current_sources() -> Iterator[MemorySource]:
    """The selected sources that can be read now, in ``LABELS`` order."""
    allocator = cupy_allocator()
    if allocator is not None:
        yield AllocatorSource(allocator)
    torch = torch_source()
    if torch is not None:
        yield torch


# Note [Cell peak under PyTorch]: the footer and the ledger show each cell's peak allocated bytes
# without calling ``reset_peak_memory_stats`` (the user's own peak stays theirs). At the cell's
# start the source reads c0 (``allocated_bytes.all.current``) and p0 (``.peak``); at its end c1
# and p1. If p1 > p0, the peak was passed while the cell ran, so the cell's peak is p1 exactly.
# Otherwise it is at most p0 and at least max(c0, c1): exact when those are equal. Else, when
# PyTorch records history, the events since the cell's start (by ``time_us``) give it exactly,
# provided they reach back to the start (they work back to c0); else the footer and the ledger
# show the bound, "≤ p0", and ``CellRecord["peak_exact"]`` is false. A reset of the peak inside
# the cell keeps the rule true: p1 > p0 is still a high reached in the cell.
