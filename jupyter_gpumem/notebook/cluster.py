"""``%gpumem cluster``: a table of the workers of the current Dask client, and their live view.

``%gpumem cluster`` shows the table and starts the live heat strip (``cluster_live``), sampling
every ``--interval`` seconds (default 1); ``--no-live`` shows the table only; ``--stop`` stops the
live view. A new ``%gpumem cluster`` stops the one before (its output keeps the static strip).
"""

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
    if args.stop:
        if args.live is False or args.interval is not None:
            raise usage_error("cluster --stop takes no other option")
        if not stop_live():
            print("no live cluster view is running")
        return None
    if args.live is False and args.interval is not None:
        raise usage_error("cluster: --interval does not go with --no-live")
    client = current_client()
    from jupyter_gpumem.dask.live import DEFAULT_INTERVAL
    from jupyter_gpumem.dask.view import cluster_table

    stop_live()
    table = cluster_table(client)
    display(table)
    if args.live is not False:
        from jupyter_gpumem.notebook.cluster_live import ClusterLive

        interval = DEFAULT_INTERVAL if args.interval is None else args.interval
        ClusterLive(client, interval).start()
    return None


def stop_live() -> int:
    """Stop every running live cluster view; how many (0 when none, or never imported)."""
    import sys

    live = sys.modules.get("jupyter_gpumem.notebook.cluster_live")
    stop_all = getattr(live, "stop_all_cluster_views", None)
    return int(stop_all()) if stop_all is not None else 0


def refresh_live() -> int:
    """Bring the saved fallback of every running live cluster view up to date (each at most
    every 10 s); how many (0 when none, or never imported)."""
    import sys

    live = sys.modules.get("jupyter_gpumem.notebook.cluster_live")
    refresh = getattr(live, "refresh_cluster_views", None)
    return int(refresh()) if refresh is not None else 0
