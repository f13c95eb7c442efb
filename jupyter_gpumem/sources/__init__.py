"""Memory sources: where every view reads GPU memory from (``MemorySource``, the public protocol).

Built in: "cupy" (our caching allocator), "torch" (PyTorch's), "jax" (XLA's). A package adds
its own through the entry-point group ``jupyter_gpumem.sources`` or ``register_source``; then
``%gpumem source NAME`` reads it in every view. ``SourceBase`` fills most of the protocol from a
source's counters and snapshot. See ``sources.protocol`` for what each part means.
"""

from jupyter_gpumem.data.owners import Owner
from jupyter_gpumem.sources.base import SourceBase
from jupyter_gpumem.sources.protocol import (
    FEATURES,
    NO_STACK,
    CellEnd,
    CellMark,
    CellPeak,
    HistoryMode,
    LiveBlocks,
    MemorySource,
    Stacks,
    Status,
)
from jupyter_gpumem.sources.registry import (
    ENTRY_POINT_GROUP,
    SourceError,
    current_sources,
    get_source,
    register_source,
    selected,
    source,
    source_names,
    unregister_source,
    use_sources,
    use_torch,
)

__all__ = ["ENTRY_POINT_GROUP", "FEATURES", "NO_STACK", "CellEnd", "CellMark", "CellPeak",
           "HistoryMode", "LiveBlocks", "MemorySource", "Owner", "SourceBase", "SourceError",
           "Stacks", "Status", "current_sources", "get_source", "register_source", "selected",
           "source", "source_names", "unregister_source", "use_sources", "use_torch"]
