"""``%gpumem cluster``: a table of the workers of the current Dask client."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from jupyter_gpumem.notebook.host import Host
from jupyter_gpumem.notebook.output import display, usage_error


def current_client() -> Any:
    """The current ``distributed.Client``; UsageError without Dask or without a client."""
    try:
        from distributed import default_client
    except ImportError:
        raise usage_error('cluster needs Dask: pip install "jupyter_gpumem[dask]"') from None
    try:
        return default_client()  # type: ignore[no-untyped-call]
    except ValueError:
        raise usage_error("cluster: no Dask client; make one first, e.g. "
                          "client = distributed.Client(cluster)") from None


def do_cluster(host: Host, args: Namespace) -> Any:
    from jupyter_gpumem.dask.view import cluster_table

    table = cluster_table(current_client())
    display(table)
    return None
