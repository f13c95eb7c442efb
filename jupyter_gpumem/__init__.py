"""jupyter_gpumem: see where your GPU memory goes, from a notebook.

``%load_ext jupyter_gpumem`` installs a caching allocator with PyTorch's policy into CuPy and adds
the ``%gpumem`` and ``%%gpumem_trace`` magics. Importing this package imports none of CuPy,
IPython, matplotlib or ipywidgets.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpumem._version import __version__
from jupyter_gpumem.data.sizes import round_size
from jupyter_gpumem.devices.simulated import ManualClock, SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.blocks import segment_size_for
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.device import DeviceOutOfMemory
from jupyter_gpumem.engine.oom import OomReport, OutOfMemoryError
from jupyter_gpumem.engine.stats import Watermark

__all__ = [
    "AllocatorConfig",
    "CachingAllocator",
    "DeviceOutOfMemory",
    "ManualClock",
    "OomReport",
    "OutOfMemoryError",
    "SimulatedDevice",
    "Watermark",
    "__version__",
    "load_ipython_extension",
    "replay_segments",
    "round_size",
    "segment_size_for",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_gpumem``."""
    from jupyter_gpumem.notebook.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext jupyter_gpumem``: undo exactly what loading did."""
    from jupyter_gpumem.notebook.extension import unload

    unload(ipython)


_LAZY = {
    # the torch.cuda.memory-compatible API and the CuPy binding: CuPy is imported only on use
    **{name: "api" for name in (
        "caching_allocator_alloc", "caching_allocator_delete", "change_current_allocator",
        "dump_snapshot", "empty_cache", "get_allocator_backend",
        "get_per_process_memory_fraction", "list_gpu_processes", "max_memory_allocated",
        "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory_allocated",
        "memory_breakdown", "memory_cached", "memory_reserved", "memory_snapshot", "memory_stats",
        "memory_stats_as_nested_dict", "memory_summary", "record_memory_history",
        "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
        "reset_peak_memory_stats", "set_per_process_memory_fraction", "snapshot", "replay",
    )},
    "install": "runtime.binding",
    # one cache for CuPy and PyTorch: torch is imported only by install_torch
    "install_torch": "runtime.torch_share",
    "torch_share_state": "runtime.torch_share",
    "TorchTooLate": "runtime.torch_share",
    "uninstall": "runtime.binding",
    "using_allocator": "runtime.binding",
    "PluggableAllocator": "devices.pluggable",
    "NoDeviceError": "devices.cupy_device",
    "use_simulated_device": "runtime.registry",
    "use_cuda": "runtime.registry",
    # PyTorch's allocator as a source: torch is imported only on use
    "use_torch": "sources.registry",
    "use_sources": "sources.registry",
    "register_source": "sources.registry",
    "unregister_source": "sources.registry",
    "get_allocator": "runtime.registry",
    # the notebook side: IPython is imported only by the magics
    "trace": "notebook.trace",
    "forget_error": "notebook.forget",
    "Ledger": "notebook.ledger",
    # the live widget: anywidget and IPython are imported only on use
    "LiveSession": "notebook.widget",
    "MemoryWidget": "notebook.widget",
    "stop_all_sessions": "notebook.widget",
    # renderers and files: numpy and matplotlib are imported only on use
    "plot_timeline": "render.plots",
    "plot_segments": "render.plots",
    "plot_cells": "render.plots",
    "save_html": "render.html",
    "render_html": "render.html",
    "load_snapshot": "data.files",
    "replay_segments": "data.replay",
    "plain_snapshot": "data.columns",
    "TraceColumns": "data.columns",
    "save_snapshot": "data.files",
    "SnapshotFileError": "data.files",
    "LoadLimits": "data.schema",
    "SnapshotView": "render.display",
    "TraceResult": "render.trace_result",
    # what-if replay of a trace (``replay`` is in api): numpy is imported only on use
    "ReplayResult": "whatif.replay",
    "compare": "whatif.compare",
    "suggest_config": "whatif.compare",
    "ReplayComparison": "whatif.compare",
    "Suggestion": "whatif.compare",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jupyter_gpumem' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
