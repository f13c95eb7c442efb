"""PyTorch's CUDA caching allocator as a ``MemorySource``: "torch".

PyTorch's data model is ours (the flat ``memory_stats()`` keys, the snapshot schema, the trace
events), so PyTorch's allocator is read directly, with nothing installed into PyTorch, and its
peak counters are never reset: each cell's peak follows Note [Cell peak from counters]
(``sources.base``). ``torch.cuda.memory`` is injected (tests pass a fake module); ``torch``
itself is imported only when a ``TorchSource`` is made without one.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.owners import TORCH_TENSOR
from jupyter_gpumem.sources.base import SourceBase, wall_us
from jupyter_gpumem.sources.protocol import HistoryMode

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.engine.oom import OomReport

__all__ = ["TORCH_OWNERS", "TorchSource", "torch_oom_report"]


#: PyTorch's tensors (by their surface: torch is never imported for it; ``data.owners``).
TORCH_OWNERS = (TORCH_TENSOR,)

_TRIED = re.compile(r"Tried to allocate ([0-9.]+ ?[KMGT]?i?B)")


def torch_oom_report(exc: BaseException, source: SourceBase) -> OomReport | None:
    """An ``OomReport`` for PyTorch's error: the request from its message ("Tried to allocate
    2.00 GiB", so to PyTorch's two decimals), the rest from the source's stats and snapshot now.
    None when the message names no request."""
    from jupyter_gpumem.data.sizes import round_size
    from jupyter_gpumem.data.units import parse_bytes
    from jupyter_gpumem.engine.blocks import segment_size_for
    from jupyter_gpumem.engine.oom import OomReport

    m = _TRIED.search(str(exc))
    if m is None:
        return None
    try:
        requested = parse_bytes(m.group(1).replace(" ", ""))
    except ValueError:
        return None
    st = source.memory_stats()
    free, total = source.mem_get_info()
    cached = [b["size"] for seg in source.snapshot()["segments"] for b in seg["blocks"]
              if b["state"] == "inactive"]
    allocated = st.get("allocated_bytes.all.current", 0)
    reserved = st.get("reserved_bytes.all.current", 0)
    split = st.get("max_split_size", -1)
    rounded = round_size(requested)
    return OomReport(requested=requested, rounded=rounded,
                     segment_size=segment_size_for(rounded), stream=0,
                     device=source.device_index, device_name=source.device_name,
                     device_free=free, device_total=total, allocated=allocated,
                     reserved=reserved, largest_free_block=max(cached, default=0),
                     free_cached=reserved - allocated, cap=None, fraction=None,
                     max_split_size=split if split > 0 else None)


class TorchSource(SourceBase):
    """PyTorch's CUDA caching allocator as a ``MemorySource`` (see the module docstring).

    ``memory_module`` is ``torch.cuda.memory`` (imported when not given); ``cuda_module`` is what
    answers ``current_device``, ``get_device_name`` and ``OutOfMemoryError`` (``torch.cuda``;
    by default the memory module when one is given, so a fake is one object)."""

    name = "torch"
    title = "PyTorch's allocator (torch.cuda.memory)"
    shows = MappingProxyType({
        "stats": "yes", "blocks": "yes", "stacks": "yes, while PyTorch records history",
        "history": "yes (`_record_memory_history`; `%gpumem history on` turns it on)",
        "cell_peak": "yes; a bound (≤) where the counters cannot tell and no history is recorded",
        "oom": "yes",
        "holders": "yes: tensors, parameters, gradients, optimizer state, autograd graphs",
        "replay": "yes, as `PYTORCH_CUDA_ALLOC_CONF`"})
    owners = TORCH_OWNERS
    trace_bands = "holder"  # parameters, gradients, optimizer state: a training step's parts
    library_files = ("/torch/", "\\torch\\")

    def __init__(self, memory_module: Any = None, *, device: int | None = None,
                 cuda_module: Any = None, clock_us: Callable[[], int] = wall_us) -> None:
        super().__init__(clock_us=clock_us)
        if memory_module is None:
            import torch.cuda
            import torch.cuda.memory

            memory_module = torch.cuda.memory
            cuda_module = cuda_module or torch.cuda
        self.memory = memory_module
        self.cuda = cuda_module if cuda_module is not None else memory_module
        self._device = device
        self._ours = False  # history is on because we turned it on (and off again after)

    def unavailable(self) -> str | None:
        available = getattr(self.cuda, "is_available", None)
        if callable(available):
            try:
                if not available():
                    return "PyTorch sees no CUDA device"
            except Exception as exc:
                return f"PyTorch cannot reach CUDA ({exc})"
        return None

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

    # -- history ---------------------------------------------------------------------------

    def history_on(self) -> bool:
        """Whether PyTorch records trace events now: asked of PyTorch where it can say
        (``_cuda_isHistoryEnabled``), else whether the last snapshot holds any event. Before
        CUDA starts nothing is recorded, and PyTorch's probe must not be asked: it reads a
        device's allocator that does not exist yet and crashes the process (PyTorch 2.11)."""
        started = getattr(self.cuda, "is_initialized", None)
        if callable(started) and not started():
            return False
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

    def record_history(self, mode: HistoryMode, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        """PyTorch records every event or none: "state" leaves its recording as it is."""
        if mode == "state":
            return
        record = self.memory._record_memory_history
        if mode == "off":
            record(enabled=None)
            self._ours = False
            return
        kwargs: dict[str, Any] = {"enabled": "all", "context": "all" if stacks else None,
                                  "stacks": "python", "max_entries": max_entries}
        if _accepts(record, "clear_history"):
            kwargs["clear_history"] = True  # only this recording's events in the trace
        start = getattr(self.cuda, "init", None)
        if callable(start):
            start()  # PyTorch records in each device's allocator, made when CUDA starts
        record(**kwargs)
        self._ours = True

    @property
    def recording_ours(self) -> bool:
        """Whether the history on now was turned on by us (``record_history``)."""
        return self._ours

    def recorded_trace(self) -> Snapshot | str:
        if not self.history_on():
            return ("gpumem: PyTorch has recorded no events; `%gpumem history on` records them, "
                    "or trace a cell with `%%gpumem_trace`.")
        return super().recorded_trace()

    # -- out of memory -------------------------------------------------------------------------

    @property
    def oom_errors(self) -> tuple[type[BaseException], ...]:  # type: ignore[override]
        found = getattr(self.cuda, "OutOfMemoryError", None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return (found,)
        return ()

    def is_oom(self, exc: BaseException) -> bool:
        """PyTorch's ``torch.OutOfMemoryError`` (by name: torch is not imported for it)."""
        return super().is_oom(exc) or any(
            c.__name__ == "OutOfMemoryError" and c.__module__.split(".")[0] == "torch"
            for c in type(exc).__mro__)

    def oom_report(self, exc: BaseException) -> OomReport | None:
        return torch_oom_report(exc, self)

    def replay_setting(self) -> str | None:
        return "`PYTORCH_CUDA_ALLOC_CONF` (before PyTorch first allocates)"


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False

