"""What JupyterLab's panel and badges are told, built from the ledger's rows and the sources
(``data.lab_schema`` has the shapes): a cell's badge, the devices and the sources (a sample of
a source is the live view's ``reading``). Every number is read through ``sources``
(``MemorySource``), never an allocator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from jupyter_gpumem.data.lab_schema import (
    LAB_SCHEMA,
    BadgeRecord,
    CellBadge,
    DeviceUse,
    SourceInfo,
    SourceUse,
)
from jupyter_gpumem.notebook.advice import held_by
from jupyter_gpumem.notebook.ledger_table import row_source

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord
    from jupyter_gpumem.notebook.advice import CellCause
    from jupyter_gpumem.sources.protocol import MemorySource

__all__ = ["badge_record", "cell_badge", "device_uses", "source_infos"]


def badge_record(row: CellRecord, cause: CellCause | None, device: int, device_name: str
                 ) -> BadgeRecord:
    """The badge's record of one ledger row (``held_by`` names who holds what it left)."""
    return {"source": row_source(row), "device": device, "device_name": device_name,
            "allocated_delta": row["allocated_delta"], "reserved_delta": row["reserved_delta"],
            "peak_allocated": row["peak_allocated"], "peak_exact": row.get("peak_exact", True),
            "ooms": row["ooms"], "holders": held_by(cause) if cause is not None else "",
            "wall_s": round(row["wall_s"], 6)}


def cell_badge(records: Sequence[BadgeRecord], execution_count: int) -> CellBadge:
    """A cell's metadata: its records, of the run ``execution_count``."""
    return {"version": LAB_SCHEMA, "execution_count": execution_count, "records": list(records)}


def _processes(src: MemorySource) -> int | None:
    listed = getattr(src, "device_processes", None)
    if listed is None:
        return None
    try:
        rows = listed()
    except Exception:  # a source that cannot say now
        return None
    return None if rows is None else sum(int(n) for _, _, n in rows)


def device_uses(sources: Iterable[MemorySource]) -> list[DeviceUse]:
    """Each device the sources are on: its total and free bytes, each source's share, the other
    processes' bytes, and the rest of this process (used, less the sources' reserved and the
    other processes). A source that cannot be read now is left out."""
    by_device: dict[int, DeviceUse] = {}
    for src in sources:
        try:
            index, name = int(src.device_index), str(src.device_name)
            use: SourceUse = {"source": src.name, "allocated": int(src.memory_allocated()),
                              "reserved": int(src.memory_reserved())}
        except Exception:  # e.g. PyTorch without a usable CUDA
            continue
        dev = by_device.get(index)
        if dev is None:
            dev = by_device[index] = {"device": index, "device_name": name, "total": None,
                                      "free": None, "sources": [], "other_processes": None,
                                      "rest_of_process": None}
        dev["sources"].append(use)
        if dev["total"] is None:
            with contextlib.suppress(Exception):  # a library that cannot say
                free, total = src.mem_get_info()
                dev["free"], dev["total"] = int(free), int(total)
        if dev["other_processes"] is None:
            dev["other_processes"] = _processes(src)
    for dev in by_device.values():
        size, left, others = dev["total"], dev["free"], dev["other_processes"]
        if size is not None and left is not None:
            reserved = sum(s["reserved"] for s in dev["sources"])
            dev["rest_of_process"] = max(0, size - left - reserved - (others or 0))
    return [by_device[i] for i in sorted(by_device)]


def source_infos(sources: Iterable[MemorySource]) -> list[SourceInfo]:
    """The sources read, with their history and config, as the status line words them."""
    out: list[SourceInfo] = []
    for src in sources:
        try:
            status = src.status()
        except Exception:  # a source that cannot be read now: named, with nothing more
            out.append({"name": src.name, "title": src.title, "history": "cannot be read now",
                        "notes": [], "config": None})
            continue
        get_config = getattr(src, "allocator_config", None)
        try:
            config = get_config() if get_config is not None else None
        except Exception:
            config = None
        out.append({"name": src.name, "title": src.title, "history": status.history,
                    "notes": list(status.notes), "config": config})
    return out
