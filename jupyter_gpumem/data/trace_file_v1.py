"""Reading the columns of a ``.gpumem`` file of format 1 (``data.trace_file`` writes format 2).

Format 1 has the same magic, sizes and JSON header as format 2 (``data.trace_file``); per
column its header entry holds one encoding for the whole column (``dtype``: u1/u2/u4/u8,
``delta``, ``base``) and the column's byte planes, cut every 4 MiB into zlib chunks
(``chunks``: [compressed bytes, raw bytes], in order), column after column after the header.
A chunk does not end on an event, so a column is unpacked whole before it is decoded: one
thread a column.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from jupyter_gpumem.data.columns import FIELDS, TraceColumns
from jupyter_gpumem.data.schema import LoadLimits, SchemaError, count_within

_UNSIGNED = ("u1", "u2", "u4", "u8")


def inflate(data: Any, size: int, what: str) -> bytes:
    """``data`` (a zlib stream, bytes-like) decompressed, which must come to exactly ``size``
    bytes and end the stream; decompresses at most ``size + 1`` bytes whatever it holds."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size + 1)
    except zlib.error as exc:
        raise SchemaError(f"{what}: corrupt compressed data ({exc})") from None
    if len(out) != size or not d.eof or d.unused_data:
        raise SchemaError(f"{what}: its compressed data does not come to the {size:,} bytes "
                          "the header says")
    return out


def count_v1(metas: list[Any], limits: LoadLimits, unpacked: int) -> int:
    """Check the traces' header entries and count their events and raw bytes against
    ``limits`` (``unpacked``: the bytes counted so far); returns the new count of bytes."""
    events = 0
    for d, meta in enumerate(metas):
        _check_meta(meta, d)
        events = count_within(events, meta["events"], "trace events", "max_events",
                              limits.max_events)
        for enc in meta["columns"].values():
            unpacked = count_within(unpacked, sum(raw for _, raw in enc["chunks"]), "bytes",
                                    "max_bytes", limits.max_bytes)
    return unpacked


def read_v1(read: Callable[[int], bytes], metas: list[Any], workers: int) -> list[TraceColumns]:
    """The traces of ``metas`` (checked by ``count_v1``), their chunks read through
    ``read(n)``."""
    return [_read_trace(read, meta, d, workers) for d, meta in enumerate(metas)]


def _check_meta(meta: Any, d: int) -> None:
    where = f"device_traces[{d}]"
    if (type(meta) is not dict or type(meta.get("events")) is not int or meta["events"] < 0
            or type(meta.get("stacks")) is not list or type(meta.get("others")) is not dict
            or type(meta.get("columns")) is not dict or set(meta["columns"]) != set(FIELDS)):
        raise SchemaError(f"{where}: its header entry is not a trace's columns")
    n = meta["events"]
    for name, enc in meta["columns"].items():
        ok = (type(enc) is dict and enc.get("dtype") in _UNSIGNED
              and type(enc.get("delta")) is bool and type(enc.get("base")) is int
              and -(1 << 63) <= enc["base"] < (1 << 64) and type(enc.get("chunks")) is list
              and all(type(c) is list and len(c) == 2 and all(type(x) is int and x >= 0
                                                               for x in c)
                      for c in enc["chunks"]))
        if not ok:
            raise SchemaError(f"{where}: column {name!r}: a bad encoding")
        if sum(raw for _, raw in enc["chunks"]) != n * np.dtype(enc["dtype"]).itemsize:
            raise SchemaError(f"{where}: column {name!r} does not hold {n:,} values")


def _decode(enc: dict[str, Any], raw: bytes, n: int, dtype: str) -> np.ndarray:
    """A column back from its encoding and raw bytes, as ``dtype``."""
    width = np.dtype(enc["dtype"]).itemsize
    planes = np.frombuffer(raw, dtype=np.uint8)
    if width > 1:
        planes = np.ascontiguousarray(planes.reshape(width, n).T)
    offsets = planes.view(enc["dtype"]).reshape(n).astype(np.uint64)
    values = (offsets + np.uint64(int(enc["base"]) & 0xFFFFFFFFFFFFFFFF)).view(np.int64)
    if enc["delta"]:
        values = np.cumsum(values, dtype=np.int64)
    target = np.dtype(dtype)
    if target != np.int64 and len(values):
        info = np.iinfo(target)
        if int(values.min()) < info.min or int(values.max()) > info.max:
            raise SchemaError(f"a trace column holds values outside {target} "
                              f"[{info.min}, {info.max}]")
    out: np.ndarray = values.astype(target, copy=False)
    return out


def _read_trace(read: Callable[[int], bytes], meta: dict[str, Any], d: int,
                workers: int) -> TraceColumns:
    n = meta["events"]
    jobs = []
    for name, enc in meta["columns"].items():
        where = f"device_traces[{d}] column {name!r}"
        packed = []
        for z, _ in enc["chunks"]:
            data = read(z)
            if len(data) != z:
                raise SchemaError(f"truncated: it ends inside {where}")
            packed.append(data)
        jobs.append((name, enc, packed, where))

    def unpack(job: tuple[str, dict[str, Any], list[bytes], str]) -> np.ndarray:
        name, enc, packed, where = job
        raw = b"".join(inflate(z, size, where)
                       for z, (_, size) in zip(packed, enc["chunks"], strict=True))
        return _decode(enc, raw, n, FIELDS[name])

    with ThreadPoolExecutor(max_workers=workers) as pool:  # a column a thread
        cols = dict(zip(meta["columns"], pool.map(unpack, jobs), strict=True))
    try:
        others = {int(i): v for i, v in meta["others"].items() if type(v) is dict}
    except ValueError:
        raise SchemaError(f"device_traces[{d}]: its extra keys are not by event") from None
    return TraceColumns(cols, meta["stacks"], others)
