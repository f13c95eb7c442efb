"""PyTorch's memory functions answered from our books, while PyTorch allocates from our cache.

Under a pluggable allocator PyTorch's own C++ answers "does not yet support" (or does nothing)
for every question about its memory. Each ``torch.cuda`` memory function calls one function of
``torch._C`` when it runs, so replacing those (``TorchBooks.install``) answers every Python
caller, PyTorch's own helpers, Lightning's and accelerate's included, from the allocator each
device shares with CuPy, in PyTorch's schema: the nested ``memory_stats`` (our flat keys are
PyTorch's), the ``_snapshot`` dict with plain lists of trace entries (its pickle opens in
PyTorch's viewer), ``_record_memory_history`` with PyTorch's arguments and its legacy form.

``ANSWERED`` is the list, by ``torch._C`` name, with the ``torch.cuda`` functions each serves
(the README's table is read from it). The functions stay in place for the rest of the process:
PyTorch keeps allocating from our cache (its allocator cannot change back), so they stay true.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES
from jupyter_gpumem.engine.stats import nest_stats
from jupyter_gpumem.runtime import registry

if TYPE_CHECKING:
    from jupyter_gpumem.engine.allocator import CachingAllocator

__all__ = ["ANSWERED", "HistorySetting", "TorchBooks"]

#: ``torch._C`` function → the ``torch.cuda`` functions that reach it, answered by us.
ANSWERED: dict[str, str] = {
    "_cuda_memoryStats": "memory_stats, memory_stats_as_nested_dict, memory_allocated, "
                         "max_memory_allocated, memory_reserved, max_memory_reserved, "
                         "memory_summary (and memory_cached, max_memory_cached)",
    "_cuda_resetPeakMemoryStats": "reset_peak_memory_stats (and reset_max_memory_allocated, "
                                  "reset_max_memory_cached)",
    "_cuda_resetAccumulatedMemoryStats": "reset_accumulated_memory_stats",
    "_cuda_memorySnapshot": "memory_snapshot, memory._snapshot, memory._dump_snapshot",
    "_cuda_record_memory_history": "memory._record_memory_history",
    "_cuda_record_memory_history_legacy": "memory._record_memory_history(True | False, ...)",
    "_cuda_isHistoryEnabled": "whether history is recorded (PyTorch's own checks)",
    "_cuda_emptyCache": "empty_cache",
    "_cuda_setMemoryFraction": "set_per_process_memory_fraction",
    "_cuda_getMemoryFraction": "get_per_process_memory_fraction",
}

_ENABLED = (None, "state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")


@dataclass(frozen=True)
class HistorySetting:
    """What PyTorch last asked to record: applied to every allocator, those made later too."""

    stacks: bool
    max_entries: int  # 0: the stacks of live blocks only (PyTorch's enabled="state")


class TorchBooks:
    """The ``torch._C`` functions of ``ANSWERED``, over our allocators.

    ``allocator_for(device)`` gives (making it if needed) the allocator of a CUDA device;
    ``allocators()`` those made so far, by device; ``current_device()`` PyTorch's current
    device, for a call that names none. Defaults: the CUDA allocators of ``runtime.registry``.
    """

    def __init__(self, allocator_for: Callable[[int], CachingAllocator] | None = None,
                 allocators: Callable[[], Mapping[int, CachingAllocator]] | None = None,
                 current_device: Callable[[], int] | None = None) -> None:
        self.allocator_for = allocator_for or registry.cuda_allocator
        self.allocators = allocators or registry.cuda_allocators
        self.current_device = current_device or (lambda: 0)
        #: What ``_record_memory_history`` last set; None: off (or never asked).
        self.history: HistorySetting | None = None
        self._saved: dict[str, Any] = {}  # the torch._C functions replaced, to put back (tests)
        self._before_empty: list[Callable[[], None]] = []

    # -- installing -------------------------------------------------------------------------

    def install(self, torch_c: Any) -> None:
        """Replace ``torch._C``'s functions of ``ANSWERED`` (those it has) with ours."""
        for name in ANSWERED:
            if name in self._saved:
                continue
            if hasattr(torch_c, name):
                self._saved[name] = getattr(torch_c, name)
            setattr(torch_c, name, getattr(self, name))

    def remove(self, torch_c: Any) -> None:
        """Put PyTorch's own functions back (only for tests: in a process where PyTorch
        allocates from our cache they raise or do nothing)."""
        for name in ANSWERED:
            if name in self._saved:
                setattr(torch_c, name, self._saved.pop(name))
            elif hasattr(torch_c, name) and getattr(torch_c, name) == getattr(self, name):
                delattr(torch_c, name)

    def before_empty_cache(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` first on every ``empty_cache`` (blocks held back for a stream go first)."""
        self._before_empty.append(fn)

    def adopt(self, allocator: CachingAllocator) -> None:
        """Give an allocator bound to PyTorch for the first time the history PyTorch asked
        for, unless it records already."""
        if self.history is not None and allocator.history is None:
            allocator.record_history(True, stacks=self.history.stacks,
                                     max_entries=self.history.max_entries)

    def _allocator(self, device: Any) -> CachingAllocator:
        index = self.current_device() if device is None else int(device)
        return self.allocator_for(index)

    # -- counters ---------------------------------------------------------------------------

    def _cuda_memoryStats(self, device: Any = None) -> dict[str, Any]:
        return nest_stats(self._allocator(device).memory_stats())

    def _cuda_resetPeakMemoryStats(self, device: Any = None) -> None:
        self._allocator(device).reset_peak_memory_stats()

    def _cuda_resetAccumulatedMemoryStats(self, device: Any = None) -> None:
        self._allocator(device).reset_accumulated_memory_stats()

    # -- the cache and its cap --------------------------------------------------------------

    def _cuda_emptyCache(self) -> None:
        for fn in self._before_empty:
            fn()
        for allocator in self.allocators().values():
            allocator.empty_cache()

    def _cuda_setMemoryFraction(self, fraction: float, device: Any = None) -> None:
        self._allocator(device).set_memory_fraction(float(fraction))

    def _cuda_getMemoryFraction(self, device: Any = None) -> float:
        fraction = self._allocator(device).config.per_process_memory_fraction
        return 1.0 if fraction is None else float(fraction)

    # -- snapshots and history --------------------------------------------------------------

    def _cuda_memorySnapshot(self, which: Any = None, *rest: Any) -> dict[str, Any]:
        """PyTorch's snapshot of every device: ``which`` is None, a memory pool's id, or (with
        PyTorch 2.10 and later) ``(pool, pool, include_traces)``. Our segments are all in the
        default pool (0, 0): another pool has none."""
        from jupyter_gpumem.data.columns import plain_snapshot

        include_traces = True
        pool: tuple[Any, ...] = (0, 0)
        if isinstance(which, tuple | list):
            pool = tuple(which[:2])
            if len(which) > 2:
                include_traces = bool(which[2])
        allocators = dict(self.allocators())
        if not allocators:
            allocators = {self.current_device(): self._allocator(None)}
        snap = plain_snapshot(registry.snapshot_of(allocators, mark=True))
        if tuple(pool) != (0, 0):
            snap["segments"] = []
        if not include_traces:
            snap["device_traces"] = [[] for _ in snap["device_traces"]]
        return snap

    def _cuda_isHistoryEnabled(self) -> bool:
        return any(a.history is not None for a in self.allocators().values())

    def _cuda_record_memory_history(self, enabled: str | None = "all",
                                    context: str | None = "all", stacks: str = "all",
                                    max_entries: int = sys.maxsize, clear_history: bool = False,
                                    *rest: Any, **kwargs: Any) -> None:
        """PyTorch's ``_record_memory_history(enabled, context, stacks, max_entries,
        clear_history, ...)``: "all" keeps up to ``max_entries`` events, "state" only the
        stacks of live blocks, None stops; ``context=None`` records no stacks. Our stacks are
        Python's (``stacks="all"`` adds no C++ frames); the arguments after ``clear_history``
        (compile context, annotations, actions to skip) are accepted and not used."""
        if enabled not in _ENABLED:
            raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
        if context not in _CONTEXT:
            raise ValueError(f"context must be None, 'state', 'alloc' or 'all', got {context!r}")
        if stacks not in _STACKS:
            raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
        if enabled is None:
            self._set_history(None, clear=False)
            return
        entries = _entries(max_entries) if enabled == "all" else 0
        self._set_history(HistorySetting(context is not None, entries), clear=bool(clear_history))

    def _cuda_record_memory_history_legacy(self, enabled: bool, record_context: bool = True,
                                           trace_alloc_max_entries: int = 1,
                                           trace_alloc_record_context: bool = False,
                                           record_context_cpp: bool = False,
                                           clear_history: bool = False, *rest: Any,
                                           **kwargs: Any) -> None:
        """PyTorch's older form, ``_record_memory_history(True | False, record_context,
        trace_alloc_max_entries, trace_alloc_record_context, ...)``: events (up to
        ``trace_alloc_max_entries``) only with ``trace_alloc_record_context``."""
        if not enabled:
            self._set_history(None, clear=False)
            return
        entries = _entries(trace_alloc_max_entries) if trace_alloc_record_context else 0
        self._set_history(HistorySetting(bool(record_context), entries),
                          clear=bool(clear_history))

    def _set_history(self, setting: HistorySetting | None, *, clear: bool) -> None:
        self.history = setting
        for allocator in self.allocators().values():
            if setting is None:
                allocator.record_history(False)
            else:
                allocator.record_history(True, stacks=setting.stacks,
                                         max_entries=setting.max_entries, clear=clear)


def _entries(value: Any) -> int:
    """A ``max_entries`` as our history takes it: PyTorch's default (``sys.maxsize``) and
    anything above our ring's limit are the limit."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_entries must be a positive int, got {value!r}")
    return min(value, MAX_HISTORY_ENTRIES)
