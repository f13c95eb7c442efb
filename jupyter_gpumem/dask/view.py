"""The workers of a cluster as one table: a row per worker, from gathered stats."""

from __future__ import annotations

from typing import Any

from jupyter_gpumem.dask.gather import DEFAULT_TIMEOUT, Gathered, memory_stats
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.render.table import Table

HEADER = ("worker", "GPU", "allocated", "reserved", "peak allocated", "OOMs", "retries")


class ClusterTable:
    """Each worker's allocated, reserved and peak bytes, OOMs and retries; the workers that
    gave no answer below. Shows as text and as an HTML table."""

    def __init__(self, stats: Gathered[dict[str, Any]]) -> None:
        self.stats = stats
        rows = []
        for addr, one in stats.items():
            s, gpu = one["stats"], one["gpu"]
            visible = gpu.get("cuda_visible_devices")
            where = f"{gpu['name']} ({gpu['index']}" + (
                f", CUDA_VISIBLE_DEVICES={visible.split(',')[0]}" if visible else "") + ")"
            rows.append((addr, where,
                         format_bytes(s.get("allocated_bytes.all.current", 0)),
                         format_bytes(s.get("reserved_bytes.all.current", 0)),
                         format_bytes(s.get("allocated_bytes.all.peak", 0)),
                         str(s.get("num_ooms", 0)), str(s.get("num_alloc_retries", 0))))
        self.table = Table(HEADER, rows, "<<>>>>>", "jupyter-gpumem-cluster")

    def __repr__(self) -> str:
        text = self.table.text() if self.stats else "(no worker answered)"
        return text + ("\n" + self.stats.message if self.stats.errors else "")

    def _repr_html_(self) -> str:
        import html

        note = "".join(f"<p>{html.escape(line)}</p>"
                       for line in self.stats.message.splitlines())
        return self.table.html() + note


def cluster_table(client: Any, *, timeout: float = DEFAULT_TIMEOUT) -> ClusterTable:
    """``memory_stats(client)`` as a table of workers (what ``%gpumem cluster`` shows)."""
    return ClusterTable(memory_stats(client, timeout=timeout))
