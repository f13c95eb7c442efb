"""A LocalCluster of worker processes on simulated devices, with our plugin, for the Dask tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import distributed

from jupyter_gpumem.dask import GpuMemPlugin

#: Each simulated worker's device.
CAPACITY = 1 << 32


@contextmanager
def sim_cluster(n_workers: int) -> Iterator[Any]:
    """A client of ``n_workers`` worker processes (one thread each) with ``GpuMemPlugin("sim")``."""
    # An IPython shell made by an earlier test put its user module in sys.modules["__main__"],
    # with no __spec__: spawn reads it to prepare a worker process. None means "nothing to run".
    main = sys.modules["__main__"]
    patched = not hasattr(main, "__spec__")
    if patched:
        main.__spec__ = None
    cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=50)
    c = distributed.Client(cluster)
    c.register_plugin(GpuMemPlugin(device="sim", capacity=CAPACITY))
    try:
        yield c
    finally:
        c.close()
        cluster.close()
        if patched and "__spec__" in vars(main):
            del main.__spec__
