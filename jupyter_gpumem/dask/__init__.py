"""The same memory views for every GPU worker of a Dask cluster (``pip install
"jupyter_gpumem[dask]"``).

>>> client.register_plugin(GpuMemPlugin())       # our allocator on every worker, now and later
>>> memory_stats(client)                          # {worker address: {"gpu": ..., "stats": ...}}
>>> cluster_snapshot(client)                      # one snapshot, a device per worker

Importing ``jupyter_gpumem`` imports none of this; importing ``jupyter_gpumem.dask`` imports
``distributed``.
"""

from __future__ import annotations

from jupyter_gpumem.dask.gather import (
    ClusterTrace,
    Gathered,
    PartialResultWarning,
    cluster_snapshot,
    dump_snapshot,
    memory_stats,
    memory_summary,
    merge_snapshots,
    snapshot,
    start_trace,
)
from jupyter_gpumem.dask.plugin import GpuMemPlugin
from jupyter_gpumem.dask.worker import NoPluginError

__all__ = [
    "ClusterTrace",
    "Gathered",
    "GpuMemPlugin",
    "NoPluginError",
    "PartialResultWarning",
    "cluster_snapshot",
    "dump_snapshot",
    "memory_stats",
    "memory_summary",
    "merge_snapshots",
    "snapshot",
    "start_trace",
]
