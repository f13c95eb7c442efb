"""jupyter_gpumem: see where your GPU memory goes, from a notebook.

``%load_ext jupyter_gpumem`` installs a caching allocator with PyTorch's policy into CuPy and adds
the ``%gpumem`` and ``%%gpumem_trace`` magics. Importing this package imports none of CuPy,
IPython, matplotlib or ipywidgets.
"""

from __future__ import annotations

from typing import Any

from ._allocator import CachingAllocator
from ._blocks import round_size, segment_size_for
from ._config import AllocatorConfig
from ._device import DeviceOutOfMemory, ManualClock, SimulatedDevice
from ._oom import OomReport, OutOfMemoryError
from ._replay import replay_segments
from ._stats import Watermark

__version__ = "0.1.0"

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
    from ._extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext jupyter_gpumem``: undo exactly what loading did."""
    from ._extension import unload

    unload(ipython)
