"""Our snapshot file (``.gpumem``): the traces as compressed columns, the rest as JSON.

A trace of ten million events is ten million dicts in a pickle or JSON (64.5 MB and 1.9 s to
write at one million). Here each column of a ``TraceColumns`` (``data.columns.FIELDS``) is
stored on its own, encoded so that zlib finds its repeats (Note [Column encoding]), and read
back into arrays without a Python object per event.

Layout (integers little-endian)::

    MAGIC                       b"GPUMEM\\x00" + format version (1 byte)
    u64 header bytes, u64 header bytes once decompressed
    header                      zlib of UTF-8 JSON: the snapshot but its traces, and per
                                device trace its length, stacks, extra keys and, per column,
                                its encoding and chunks ([compressed bytes, raw bytes], in order)
    chunks                      zlib streams, column after column

Loading checks the header's sizes against ``LoadLimits`` before it decompresses anything,
decompresses each chunk to at most its stated size (a small file cannot unpack into much more
than the limits allow), then checks the columns as ``schema.check_snapshot`` checks any trace.
Nothing from the file is run or imported.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import numpy as np

from jupyter_gpumem.data.columns import FIELDS, TraceColumns, as_columns
from jupyter_gpumem.data.schema import LoadLimits, SchemaError, count_within

__all__ = ["MAGIC", "SUFFIX", "is_trace_file", "read_trace_file", "write_trace_file"]

#: The file's first bytes: our name, a NUL, and the format's version.
MAGIC = b"GPUMEM\x00\x01"
#: The suffix that picks this format when saving.
SUFFIX = ".gpumem"
_SIZES = struct.Struct("<QQ")
#: Raw bytes per compressed chunk: columns are compressed in pieces, on several threads.
_CHUNK = 4 << 20
_LEVEL = 1  # zlib's fastest: the encodings leave it little to find beyond runs and repeats
_UNSIGNED = ("u1", "u2", "u4", "u8")

# Note [Column encoding]: a column of int values is stored as ``base`` plus unsigned offsets
# in the narrowest of u1/u2/u4/u8 that holds them, either of the values themselves or of
# their differences from the previous value (``delta``; the first from 0), whichever is
# narrower: times and cells only grow, so their differences fit in a byte or two, while
# addresses and sizes repeat and keep their values. Offsets wider than a byte are stored byte
# plane by byte plane (all low bytes, then the next, ...), which turns the high bytes of
# nearby values into runs. Arithmetic wraps in 64 bits both ways, so every int64 comes back.


def is_trace_file(head: bytes) -> bool:
    """Whether a file starting with ``head`` is in this format (any version)."""
    return head.startswith(MAGIC[:-1])


def _encode(values: np.ndarray) -> tuple[dict[str, Any], bytes]:
    """One column's encoding (Note [Column encoding]) and its raw bytes, before zlib."""
    v = values.astype(np.int64, copy=False)
    best: tuple[int, np.ndarray, bool, int] | None = None  # (width, stored, delta, base)
    for delta in (False, True):
        w = np.diff(v, prepend=np.int64(0)) if delta else v
        if not len(w):
            best = (0, w, False, 0)
            break
        lo, hi = int(w.min()), int(w.max())
        width = next(i for i, top in enumerate((0xFF, 0xFFFF, 0xFFFFFFFF, 1 << 64))
                     if hi - lo <= top)
        if best is None or width < best[0]:
            best = (width, w, delta, lo)
    assert best is not None
    width, w, delta, base = best
    offsets = (w.view(np.uint64) - np.uint64(base & 0xFFFFFFFFFFFFFFFF)).astype(_UNSIGNED[width])
    size = offsets.itemsize
    raw = (offsets.view(np.uint8).reshape(-1, size).T.tobytes() if size > 1
           else offsets.tobytes())
    return {"dtype": _UNSIGNED[width], "delta": delta, "base": base}, raw


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


def _chunks(raw: bytes) -> list[bytes]:
    return [raw[i:i + _CHUNK] for i in range(0, len(raw), _CHUNK)] or [b""]


def _workers() -> int:
    return min(len(FIELDS), os.cpu_count() or 1)


def _pack(values: np.ndarray) -> tuple[dict[str, Any], list[bytes]]:
    """A column's encoding, with its ``chunks`` sizes, and its compressed chunks."""
    enc, raw = _encode(values)
    parts = _chunks(raw)
    packed = [zlib.compress(b, _LEVEL) for b in parts]
    enc["chunks"] = [[len(z), len(b)] for z, b in zip(packed, parts, strict=True)]
    return enc, packed


def write_trace_file(snapshot: dict[str, Any], f: IO[bytes]) -> None:
    """Write ``snapshot`` (any traces: columns or lists of entries) to the open file ``f``."""
    rest = {k: v for k, v in snapshot.items() if k != "device_traces"}
    traces = [as_columns(t) for t in snapshot.get("device_traces") or []]
    pieces: list[bytes] = []
    meta: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        for cols in traces:
            columns: dict[str, Any] = {}
            # a column a thread: numpy and zlib let go of the GIL for their loops
            for name, (enc, packed) in zip(FIELDS, pool.map(_pack, (cols.column(name)
                                                                   for name in FIELDS)),
                                           strict=True):
                columns[name] = enc
                pieces += packed
            meta.append({"events": len(cols), "stacks": cols.stacks,
                         "others": {str(i): v for i, v in cols.others.items()},
                         "columns": columns})
    header = json.dumps({"snapshot": rest, "traces": meta}, separators=(",", ":"),
                        default=_jsonable).encode("utf-8")
    packed_header = zlib.compress(header, 6)
    f.write(MAGIC + _SIZES.pack(len(packed_header), len(header)))
    f.write(packed_header)
    for piece in pieces:
        f.write(piece)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def _inflate(data: bytes, size: int, what: str) -> bytes:
    """``data`` decompressed, which must come to exactly ``size`` bytes."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size + 1)
    except zlib.error as exc:
        raise SchemaError(f"{what}: corrupt compressed data ({exc})") from None
    if len(out) != size or not d.eof:
        raise SchemaError(f"{what}: its compressed data does not come to the {size:,} bytes "
                          "the header says")
    return out


def read_trace_file(read: Callable[[int], bytes], limits: LoadLimits) -> dict[str, Any]:
    """The snapshot of a file in this format, read through ``read(n)`` (the file's next ``n``
    bytes; fewer at its end), with its traces as ``TraceColumns``. Raises ``SchemaError`` for
    a malformed file and ``LimitExceeded`` past ``limits``; the caller checks the snapshot."""
    magic = read(len(MAGIC))
    if magic != MAGIC:
        version = magic[len(MAGIC) - 1:] or b"?"
        raise SchemaError(f"a {SUFFIX} file of format version {version[0]}, which this version "
                          f"of jupyter_gpumem does not read (it reads {MAGIC[-1]})")
    sizes = read(_SIZES.size)
    if len(sizes) != _SIZES.size:
        raise SchemaError("truncated: it ends inside its header")
    packed, size = _SIZES.unpack(sizes)
    unpacked = count_within(0, size, "bytes", "max_bytes", limits.max_bytes)
    if packed > unpacked + 1024 + unpacked // 8:  # zlib never grows data that much
        raise SchemaError("its header's sizes disagree")
    head = read(packed)
    if len(head) != packed:
        raise SchemaError("truncated: it ends inside its header")
    try:
        header = json.loads(_inflate(head, size, "the header"))
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"its header is not valid JSON ({exc})") from None
    if type(header) is not dict or type(header.get("snapshot")) is not dict \
            or type(header.get("traces")) is not list:
        raise SchemaError("its header is not a snapshot and a list of traces")
    metas: list[Any] = header["traces"]
    count_within(0, len(metas), "per-device trace lists", "max_devices", limits.max_devices)
    events = 0
    for d, meta in enumerate(metas):
        _check_meta(meta, d)
        events = count_within(events, meta["events"], "trace events", "max_events",
                        limits.max_events)
        for enc in meta["columns"].values():
            unpacked = count_within(unpacked, sum(raw for _, raw in enc["chunks"]), "bytes",
                              "max_bytes", limits.max_bytes)
    traces = [_read_trace(read, meta, d) for d, meta in enumerate(metas)]
    snapshot = dict(header["snapshot"])
    snapshot["device_traces"] = traces
    return snapshot


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


def _read_trace(read: Callable[[int], bytes], meta: dict[str, Any], d: int) -> TraceColumns:
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
        raw = b"".join(_inflate(z, size, where)
                       for z, (_, size) in zip(packed, enc["chunks"], strict=True))
        return _decode(enc, raw, n, FIELDS[name])

    with ThreadPoolExecutor(max_workers=_workers()) as pool:  # a column a thread
        cols = dict(zip(meta["columns"], pool.map(unpack, jobs), strict=True))
    try:
        others = {int(i): v for i, v in meta["others"].items() if type(v) is dict}
    except ValueError:
        raise SchemaError(f"device_traces[{d}]: its extra keys are not by event") from None
    return TraceColumns(cols, meta["stacks"], others)
