"""PyTorch's ``torch.cuda.memory`` API, function by function, for CuPy and our allocators.

Every function takes ``device=None | int | "cuda:N" | cupy.cuda.Device`` and works on the current
backend (``runtime.registry``): the CUDA devices, or simulated ones after
``use_simulated_device()``.
With no GPU, the functions PyTorch answers with an empty dict or 0 do the same; the others raise
``NoDeviceError`` with one line that says why and what to do.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any, Literal

from jupyter_gpumem.data import handles
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES
from jupyter_gpumem.devices.cupy_device import NoDeviceError
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.stats import nest_stats
from jupyter_gpumem.runtime import registry

if TYPE_CHECKING:
    import os

    from jupyter_gpumem.engine.config import AllocatorConfig
    from jupyter_gpumem.whatif.replay import ReplayResult

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "change_current_allocator",
    "dump_snapshot",
    "empty_cache",
    "get_allocator_backend",
    "get_per_process_memory_fraction",
    "list_gpu_processes",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_breakdown",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "record_memory_history",
    "replay",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "snapshot",
]


def _allocator(device: Any) -> CachingAllocator:
    return registry.get_allocator(device)


# -- allocation ------------------------------------------------------------------------------------

def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocate ``size`` bytes with the caching allocator; returns the device address."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    allocator = _allocator(device)
    # A new int object for every call (a core may hand out the int it keeps for the address):
    # the variable holding this very object holds the block (``data.handles``).
    ptr: int = allocator.malloc(size, _stream_ptr(stream, allocator)) + 0
    handles.remember(ptr)
    return ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    """Free an address from ``caching_allocator_alloc``."""
    if isinstance(mem_ptr, bool) or not isinstance(mem_ptr, int):
        raise TypeError(f"mem_ptr must be an int, got {type(mem_ptr).__name__}")
    if mem_ptr == 0:
        return
    for allocator in registry.allocators().values():
        if allocator.owns(mem_ptr):
            allocator.free(mem_ptr)
            handles.forget(mem_ptr)
            return
    raise ValueError(f"{mem_ptr:#x} was not allocated by the caching allocator, or was freed")


def _stream_ptr(stream: Any, allocator: CachingAllocator) -> int:
    if stream is None:
        if registry.backend() == "sim":
            return 0
        import cupy

        with cupy.cuda.Device(allocator.device.index):
            return int(cupy.cuda.get_current_stream().ptr)
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    if type(stream).__name__ in ("Stream", "ExternalStream") and hasattr(stream, "ptr"):
        return int(stream.ptr)
    raise TypeError(
        "Invalid type for stream argument, must be `cupy.cuda.Stream` or `int` representing "
        f"a pointer to an existing stream, got {type(stream).__name__}"
    )


# -- limits and cache ------------------------------------------------------------------------------

def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap the memory our allocator may reserve on a device at ``fraction`` of its total."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _allocator(device).set_memory_fraction(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set for a device (1.0 when none is set)."""
    fraction = _allocator(device).config.per_process_memory_fraction
    return 1.0 if fraction is None else fraction


def empty_cache() -> None:
    """Release every cached block that is a whole segment, on every device."""
    if registry.no_gpu():
        return
    for allocator in registry.allocators().values():
        allocator.empty_cache()


# -- stats -----------------------------------------------------------------------------------------

def memory_stats(device: Any = None) -> dict[str, int]:
    """PyTorch's flat stats dict (``"allocated_bytes.all.current"``, ...); {} with no GPU.

    The accumulated counters (``*.allocated``, ``*.freed``) stop at 2**63 - 1 rather than
    wrap."""
    if registry.no_gpu():
        return {}
    return _allocator(device).memory_stats()


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """``memory_stats`` as nested dicts; {} with no GPU."""
    return nest_stats(memory_stats(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the "allocated" and "freed" counters and the retry/OOM counts."""
    _allocator(device).reset_accumulated_memory_stats()


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set every "peak" counter to its current value."""
    _allocator(device).reset_peak_memory_stats()


def reset_max_memory_allocated(device: Any = None) -> None:
    """Deprecated in PyTorch: resets /all/ peak stats, as ``reset_peak_memory_stats`` does."""
    warnings.warn(
        "jupyter_gpumem.reset_max_memory_allocated now calls reset_peak_memory_stats, "
        "which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated in PyTorch: resets /all/ peak stats, as ``reset_peak_memory_stats`` does."""
    warnings.warn(
        "jupyter_gpumem.reset_max_memory_cached now calls reset_peak_memory_stats, "
        "which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def memory_allocated(device: Any = None) -> int:
    """Bytes in blocks handed out now."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    """Peak of ``memory_allocated`` since start or the last peak reset."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes in segments the allocator holds."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    """Peak of ``memory_reserved`` since start or the last peak reset."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device: Any = None) -> int:
    """Deprecated alias of ``memory_reserved``."""
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated alias of ``max_memory_reserved``."""
    return max_memory_reserved(device)


# -- snapshots -------------------------------------------------------------------------------------

def memory_snapshot() -> list[Any]:
    """The segments of every device, as ``snapshot()["segments"]``; [] with no GPU."""
    if registry.no_gpu():
        return []
    return list(snapshot()["segments"])


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """PyTorch's table of the allocator's counters for a device."""
    return _allocator(device).memory_summary(abbreviated=abbreviated)


def snapshot(device: Any = None) -> Snapshot:
    """Segments, blocks and recorded history of every device (or only ``device``).

    While history is recorded, each call first logs a "snapshot" event in the trace, as
    PyTorch's ``torch.cuda.memory._snapshot()`` does, so that the user's own snapshots show on
    the timeline (``dump_snapshot`` too). The extension's views read without one
    (``CachingAllocator.snapshot(mark=False)``): looking at the history does not grow it.

    Each device's trace is a ``TraceColumns``: its events as arrays, read as a sequence of
    PyTorch's trace-entry dicts (``len``, indexing, iteration build them on access), so a
    snapshot of millions of events costs no dict per event. ``plain_snapshot(snap)`` gives
    the same with lists of dicts, for ``json.dumps`` or code that edits the entries.
    """
    if device is not None:
        return _allocator(device).snapshot()
    allocators = registry.allocators()
    if not allocators:
        return _allocator(None).snapshot()
    return registry.snapshot_of(allocators)


def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Save ``snapshot()`` as a pickle that PyTorch's memory viewer opens."""
    from jupyter_gpumem.data.files import save_snapshot

    save_snapshot(snapshot(), filename, pickled=True)  # always a pickle, as PyTorch writes


def record_memory_history(
    enabled: Literal["state", "all"] | bool | None = "all",
    context: Literal["state", "alloc", "all"] | None = "all",
    stacks: Literal["python", "all"] = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
) -> None:
    """Start or stop recording, with PyTorch's arguments.

    ``enabled="all"`` keeps a history of up to ``max_entries`` events; ``"state"`` keeps only
    the stacks of live blocks; ``None`` or ``False`` stops. ``context=None`` records no stacks.
    """
    if enabled not in ("state", "all", True, False, None):
        raise ValueError(f"enabled must be 'state', 'all' or None, got {enabled!r}")
    if context not in ("state", "alloc", "all", None):
        raise ValueError(f"context must be 'state', 'alloc', 'all' or None, got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if (isinstance(max_entries, bool) or not isinstance(max_entries, int)
            or not 1 <= max_entries <= MAX_HISTORY_ENTRIES):
        raise ValueError(f"max_entries must be an int in [1, {MAX_HISTORY_ENTRIES}], got "
                         f"{max_entries!r}")
    allocator = _allocator(device)
    if enabled in (None, False):
        allocator.record_history(False)
        return
    entries = 0 if enabled == "state" else max_entries
    allocator.record_history(True, stacks=context is not None, max_entries=entries)


# -- device and processes --------------------------------------------------------------------------

def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the whole device, from cudaMemGetInfo."""
    return _allocator(device).device.mem_get_info()


def list_gpu_processes(device: Any = None) -> str:
    """PyTorch's text listing of the processes on a device and their memory, from NVML."""
    from jupyter_gpumem.devices import nvml

    if registry.no_gpu():
        return f"GPU:{device if isinstance(device, int) else 0}\n{registry.no_gpu_reason()}"
    allocator = _allocator(device)
    index = allocator.device.index
    lister = getattr(allocator.device, "nvml_processes", None)
    if lister is None:  # a simulated device plays NVML itself
        rows = list(getattr(allocator.device, "processes", list)())
        return nvml.format_processes(index, rows)
    try:
        return nvml.format_processes(index, lister())
    except nvml.NvmlUnavailable as exc:
        return f"GPU:{index}\n{exc}"


def memory_breakdown(device: Any = None) -> dict[str, int | str | None]:
    """Where a device's memory is: ours (allocated, cached) and outside our allocator.

    ``outside_allocator`` is device memory in use that our allocator did not reserve: the CUDA
    context, library workspaces (cuBLAS, cuFFT), other allocators such as PyTorch's, and other
    processes. NVML splits off ``other_processes`` where it can.
    """
    allocator = _allocator(device)
    free, total = allocator.device.mem_get_info()
    reserved = allocator.memory_reserved()
    allocated = allocator.memory_allocated()
    out: dict[str, int | str | None] = {
        "total": total,
        "free": free,
        "used": total - free,
        "allocated": allocated,
        "cached_free": reserved - allocated,
        "reserved": reserved,
        "outside_allocator": total - free - reserved,
        "other_processes": None,
        "this_process_outside_allocator": None,
        "nvml": None,
    }
    lister = getattr(allocator.device, "nvml_processes", None)
    if lister is None:
        others = sum(size for _, _, size in getattr(allocator.device, "processes", list)())
        out["other_processes"] = others
        out["this_process_outside_allocator"] = total - free - reserved - others
        return out
    from jupyter_gpumem.devices import nvml

    try:
        rows = lister()
    except nvml.NvmlUnavailable as exc:
        out["nvml"] = str(exc)
        return out
    import os

    me = os.getpid()
    others = sum(used for pid, _, used in rows if pid != me)
    out["other_processes"] = others
    out["this_process_outside_allocator"] = total - free - reserved - others
    return out


# -- backend ---------------------------------------------------------------------------------------

def get_allocator_backend() -> str:
    """What allocates CuPy's memory in this thread: "jupyter_gpumem", "pluggable", "cupy"
    (CuPy's MemoryPool or another allocator), "cudaMalloc" (no pool), or "simulated"."""
    if registry.backend() == "sim":
        return "simulated"
    from jupyter_gpumem.runtime.binding import current_backend_name

    return current_backend_name()


def change_current_allocator(allocator: Any) -> None:
    """Make a ``PluggableAllocator`` (or any CuPy allocator callable) CuPy's allocator.

    Arrays made before keep going back to the allocator that made them.
    """
    from jupyter_gpumem.devices.pluggable import PluggableAllocator

    if isinstance(allocator, PluggableAllocator):
        fn = allocator.malloc
    elif callable(allocator):
        fn = allocator
    elif hasattr(allocator, "malloc"):
        fn = allocator.malloc
    else:
        raise TypeError(
            f"expected a PluggableAllocator or a CuPy allocator, got {type(allocator).__name__}"
        )
    from jupyter_gpumem.devices.cupy_device import require_cuda

    require_cuda()
    import cupy

    cupy.cuda.set_allocator(fn)


_ = NoDeviceError  # re-exported through the package


# -- what if -------------------------------------------------------------------------------------

def replay(trace_or_snapshot: Snapshot | str | os.PathLike[str],
           config: AllocatorConfig | str | dict[str, Any] | None = None,
           capacity: int | None = None, *, device: int | None = None,
           memory_fraction: float | None = None) -> ReplayResult:
    """Re-run a recorded trace (a snapshot dict, ours or PyTorch's, or a file) through our
    allocator on a simulated device of the recorded device's size (``capacity`` overrides),
    under ``config`` (an ``AllocatorConfig``, ``"key:value,..."`` or a dict; default: the
    recorded one). See ``jupyter_gpumem.whatif.replay`` for what is exact and what inferred."""
    from jupyter_gpumem.whatif.replay import replay as run

    return run(trace_or_snapshot, config, capacity, device=device,
               memory_fraction=memory_fraction)
