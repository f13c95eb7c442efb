"""Our snapshot file (``.gpumem``): the traces as compressed columns, the rest as JSON.

A trace of ten million events is ten million dicts in a pickle or JSON (64.5 MB and 1.9 s to
write at one million). Here each column of a ``TraceColumns`` (``data.columns.FIELDS``) is
cut into chunks of ``CHUNK_EVENTS`` events, each encoded so that zlib finds its repeats (Note
[Chunk encoding]) and compressed on its own, so that chunks are packed and unpacked on a
thread each (numpy and zlib let go of the GIL), in the cache, straight into the arrays that
the loaded trace keeps; no Python object per event.

Layout (integers little-endian)::

    MAGIC                       b"GPUMEM\\x00" + format version (1 byte: 2)
    u64 header bytes, u64 header bytes once decompressed
    header                      zlib of UTF-8 JSON: the snapshot but its traces; ``chunk``,
                                the events a chunk; per device trace its length, stacks,
                                extra keys and, per column, per chunk ``[compressed bytes,
                                width, base, start]`` (Note [Chunk encoding])
    chunks                      zlib streams (none for a width of 0), chunk after chunk,
                                column after column, trace after trace; then the file ends

Loading checks the header's sizes against ``LoadLimits`` and the file's length before it
allocates anything, decompresses each chunk to at most its stated size (a small file cannot
unpack into much more than the limits allow), then checks the columns as
``schema.check_snapshot`` checks any trace. Nothing from the file is run or imported. Files of
format 1 (one encoding a column, ``data.trace_file_v1``) still load.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import IO, Any

import numpy as np

from jupyter_gpumem.data.columns import FIELDS, TraceColumns, as_columns
from jupyter_gpumem.data.schema import LoadLimits, SchemaError, count_within
from jupyter_gpumem.data.trace_file_v1 import count_v1, inflate, read_v1

__all__ = ["CHUNK_EVENTS", "MAGIC", "MIN_CHUNK_EVENTS", "SUFFIX", "is_trace_file",
           "read_trace_file", "write_trace_file"]

#: The file's first bytes: our name, a NUL, and the format's version (the one we write).
MAGIC = b"GPUMEM\x00\x02"
#: The versions we read.
_READS = (1, 2)
#: The suffix that picks this format when saving.
SUFFIX = ".gpumem"
_SIZES = struct.Struct("<QQ")
#: Events a chunk: a chunk's arrays stay in the cache while it is encoded and compressed.
CHUNK_EVENTS = 1 << 18
#: The fewest events a chunk of a file may hold: bounds the chunks (and the work a chunk) that
#: the events a file may hold (``LoadLimits.max_events``) can stand for.
MIN_CHUNK_EVENTS = 1 << 10
_LEVEL = 1  # zlib's fastest: the encodings leave it little to find beyond runs and repeats
_WIDTHS = (0, 1, 2, 4, 8)
_UNSIGNED: dict[int, np.dtype[Any]] = {w: np.dtype(f"u{w}") for w in _WIDTHS if w}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# Note [Chunk encoding]: a chunk of a column is stored as unsigned offsets ``o`` of ``width``
# bytes (0, 1, 2, 4 or 8: the fewest that hold them) from ``base``, either of the values
# themselves (``start`` null: v = base + o) or of their differences (v[0] = start + base + o[0],
# v[i] = v[i-1] + base + o[i]), whichever is narrower: times and cells only grow, so their
# differences fit in a byte or two, while addresses and sizes repeat and keep their values. A
# width of 0 stores nothing (a constant chunk, or a constant step). Offsets wider than a byte
# are stored byte plane by byte plane (all low bytes, then the next, ...), which turns the high
# bytes of nearby values into runs. Arithmetic wraps in 64 bits both ways, so every int64 comes
# back. Each chunk stands alone, so chunks are packed and unpacked in any order.


def is_trace_file(head: bytes) -> bool:
    """Whether a file starting with ``head`` is in this format (any version)."""
    return head.startswith(MAGIC[:-1])


def _width(span: int) -> int:
    """The fewest bytes (of ``_WIDTHS``) that hold 0..``span``."""
    return next(w for w in _WIDTHS if span < 1 << (8 * w))


def _int64(x: int) -> int:
    """``x`` modulo 2**64, as a signed 64-bit int."""
    return (x - _INT64_MIN) % (1 << 64) + _INT64_MIN


def _pack(values: np.ndarray) -> tuple[list[Any], bytes]:
    """A chunk's ``[width, base, start]`` (Note [Chunk encoding]) and its compressed bytes."""
    lo, hi = int(values.min()), int(values.max())
    width, base, start, stored = _width(hi - lo), lo, None, values
    if width > 1:  # a byte or less: the differences can hardly do better
        step = np.empty(len(values), dtype=np.int64)
        np.subtract(values[1:], values[:-1], out=step[1:], dtype=np.int64)  # wraps: fine
        step_lo, step_hi = int(step[1:].min()), int(step[1:].max())
        if _width(step_hi - step_lo) < width:
            step[0] = step_lo  # offset 0: v[0] = start + base
            width, base, start, stored = (_width(step_hi - step_lo), step_lo,
                                          _int64(int(values[0]) - step_lo), step)
    if not width:
        return [0, base, start], b""
    offsets = np.empty(len(values), dtype=_UNSIGNED[width])
    np.subtract(stored, np.int64(base), out=offsets, dtype=np.int64, casting="unsafe")
    if width > 1:  # byte planes, by shifts (faster than a transposed copy)
        planes = np.empty((width, len(values)), dtype=np.uint8)
        for k in range(width):
            np.right_shift(offsets, 8 * k, out=planes[k], casting="unsafe")
        offsets = planes
    return [width, base, start], zlib.compress(offsets.data, _LEVEL)


def _chunks(n: int, chunk: int) -> range:
    """The first event of each chunk of a column of ``n`` events."""
    return range(0, n, chunk)


def _workers(jobs: int) -> int:
    return max(1, min(jobs, os.cpu_count() or 1))


def write_trace_file(snapshot: dict[str, Any], f: IO[bytes]) -> None:
    """Write ``snapshot`` (any traces: columns or lists of entries) to the open file ``f``."""
    rest = {k: v for k, v in snapshot.items() if k != "device_traces"}
    traces = [as_columns(t) for t in snapshot.get("device_traces") or []]
    jobs = [cols.column(name)[s:s + CHUNK_EVENTS] for cols in traces for name in FIELDS
            for s in _chunks(len(cols), CHUNK_EVENTS)]
    with ThreadPoolExecutor(max_workers=_workers(len(jobs))) as pool:
        packed = list(pool.map(_pack, jobs))
    done = iter(packed)
    meta = [{"events": len(cols), "stacks": cols.stacks,
             "others": {str(i): v for i, v in cols.others.items()},
             "columns": {name: [[len(z), *enc] for enc, z in
                                islice(done, len(_chunks(len(cols), CHUNK_EVENTS)))]
                         for name in FIELDS}}
            for cols in traces]
    header = json.dumps({"snapshot": rest, "chunk": CHUNK_EVENTS, "traces": meta},
                        separators=(",", ":"), default=_jsonable).encode("utf-8")
    packed_header = zlib.compress(header, 6)
    f.write(MAGIC + _SIZES.pack(len(packed_header), len(header)))
    f.write(packed_header)
    for _, z in packed:
        f.write(z)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def read_trace_file(f: io.BufferedIOBase, limits: LoadLimits) -> dict[str, Any]:
    """The snapshot of the file ``f`` (open, at its start), with its traces as
    ``TraceColumns``. Raises ``SchemaError`` for a malformed file and ``LimitExceeded`` past
    ``limits``; the caller checks the snapshot."""
    magic = f.read(len(MAGIC))
    version = magic[len(MAGIC) - 1] if len(magic) == len(MAGIC) else None
    if not is_trace_file(magic) or version not in _READS:
        raise SchemaError(f"a {SUFFIX} file of format version "
                          f"{'?' if version is None else version}, which this version of "
                          f"jupyter_gpumem does not read (it reads "
                          f"{' and '.join(map(str, _READS))})")
    sizes = f.read(_SIZES.size)
    if len(sizes) != _SIZES.size:
        raise SchemaError("truncated: it ends inside its header")
    packed, size = _SIZES.unpack(sizes)
    unpacked = count_within(0, size, "bytes", "max_bytes", limits.max_bytes)
    if packed > _bound(unpacked):
        raise SchemaError("its header's sizes disagree")
    head = f.read(packed)
    if len(head) != packed:
        raise SchemaError("truncated: it ends inside its header")
    try:
        header = json.loads(inflate(head, size, "the header"))
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"its header is not valid JSON ({exc})") from None
    if type(header) is not dict or type(header.get("snapshot")) is not dict \
            or type(header.get("traces")) is not list:
        raise SchemaError("its header is not a snapshot and a list of traces")
    metas: list[Any] = header["traces"]
    count_within(0, len(metas), "per-device trace lists", "max_devices", limits.max_devices)
    if version == 1:
        count_v1(metas, limits, unpacked)
        traces = read_v1(f.read, metas, _workers(len(FIELDS)))
    else:
        chunk = header.get("chunk")
        if type(chunk) is not int or chunk < MIN_CHUNK_EVENTS:
            raise SchemaError(f"its header's chunk is not a number of events of at least "
                              f"{MIN_CHUNK_EVENTS:,}: {chunk!r}")
        ends = _count(metas, chunk, limits, unpacked)
        traces = _unpack(_read_chunks(f, ends, metas), metas, chunk)
    snapshot = dict(header["snapshot"])
    snapshot["device_traces"] = traces
    return snapshot


def _bound(raw: int) -> int:
    """More than zlib ever makes of ``raw`` bytes."""
    return raw + raw // 8 + 1024


def _count(metas: list[Any], chunk: int, limits: LoadLimits, unpacked: int) -> list[int]:
    """Check the traces' header entries and count their events and raw bytes against
    ``limits``; returns where each trace's chunks end, in bytes after the header."""
    events, end, ends = 0, 0, []
    for d, meta in enumerate(metas):
        where = f"device_traces[{d}]"
        if (type(meta) is not dict or type(meta.get("events")) is not int
                or meta["events"] < 0 or type(meta.get("stacks")) is not list
                or type(meta.get("others")) is not dict or type(meta.get("columns")) is not dict
                or list(meta["columns"]) != list(FIELDS)):
            raise SchemaError(f"{where}: its header entry is not a trace's columns")
        n = meta["events"]
        events = count_within(events, n, "trace events", "max_events", limits.max_events)
        starts = _chunks(n, chunk)
        for name, encs in meta["columns"].items():
            if type(encs) is not list or len(encs) != len(starts):
                raise SchemaError(f"{where}: column {name!r} does not hold {n:,} values in "
                                  f"chunks of {chunk:,}")
            for s, enc in zip(starts, encs, strict=True):
                if not _valid(enc):
                    raise SchemaError(f"{where}: column {name!r}: a bad encoding")
                raw = (min(n, s + chunk) - s) * enc[1]
                unpacked = count_within(unpacked, raw, "bytes", "max_bytes", limits.max_bytes)
                if enc[0] > _bound(raw) or (enc[0] == 0) != (raw == 0):
                    raise SchemaError(f"{where}: column {name!r}: its sizes disagree")
                end += enc[0]
        ends.append(end)
    return ends


def _valid(enc: Any) -> bool:
    """Whether a chunk's header entry is ``[compressed bytes, width, base, start]``."""
    return (type(enc) is list and len(enc) == 4 and type(enc[0]) is int and enc[0] >= 0
            and enc[1] in _WIDTHS and type(enc[1]) is int
            and type(enc[2]) is int and _INT64_MIN <= enc[2] <= _INT64_MAX
            and (enc[3] is None
                 or (type(enc[3]) is int and _INT64_MIN <= enc[3] <= _INT64_MAX)))


def _read_chunks(f: io.BufferedIOBase, ends: list[int], metas: list[Any]) -> memoryview:
    """The rest of the file, which must be the chunks, read in one piece."""
    total = ends[-1] if ends else 0
    try:
        left = os.fstat(f.fileno()).st_size - f.tell()
    except (AttributeError, OSError, ValueError):  # not a file on disk: read and see
        left = total
    if left < total:  # before allocating anything
        raise SchemaError(f"truncated: it ends inside {_where(left, ends, metas)}")
    data = memoryview(bytearray(total))
    got = 0
    while got < total and (n := f.readinto(data[got:])):
        got += n
    if got < total:
        raise SchemaError(f"truncated: it ends inside {_where(got, ends, metas)}")
    if f.read(1):
        raise SchemaError("it goes on after its last column")
    return data


def _where(offset: int, ends: list[int], metas: list[Any]) -> str:
    """The column of the chunk at byte ``offset`` after the header."""
    start = 0
    for d, (end, meta) in enumerate(zip(ends, metas, strict=True)):
        if offset < end:
            for name, encs in meta["columns"].items():
                start += sum(enc[0] for enc in encs)
                if offset < start:
                    return f"device_traces[{d}] column {name!r}"
        start = end
    return "its columns"


def _unpack(data: memoryview, metas: list[Any], chunk: int) -> list[TraceColumns]:
    """The traces of ``metas`` (checked by ``_count``) from their chunks, ``data``."""
    jobs = []
    traces: list[TraceColumns] = []
    at = 0
    for d, meta in enumerate(metas):
        n = meta["events"]
        cols = {name: np.empty(n, dtype=dtype) for name, dtype in FIELDS.items()}
        for name, encs in meta["columns"].items():
            for i, (s, enc) in enumerate(zip(_chunks(n, chunk), encs, strict=True)):
                jobs.append((cols[name][s:s + chunk], enc, data[at:at + enc[0]],
                             f"device_traces[{d}] column {name!r} chunk {i}"))
                at += enc[0]
        others = _others(meta["others"], n, d)
        traces.append(TraceColumns(cols, meta["stacks"], others))
    with ThreadPoolExecutor(max_workers=_workers(len(jobs))) as pool:
        for _ in pool.map(_unpack_chunk, jobs):
            pass
    return traces


def _others(others: dict[str, Any], n: int, d: int) -> dict[int, dict[str, Any]]:
    """A trace's extra keys by event, from the header's ``{"event index": {key: value}}``."""
    try:
        by_event = {int(i): v for i, v in others.items() if type(v) is dict}
    except ValueError:
        by_event = None
    if by_event is None or any(not 0 <= i < n for i in by_event):
        raise SchemaError(f"device_traces[{d}]: its extra keys are not by event")
    return by_event


def _unpack_chunk(job: tuple[np.ndarray, list[Any], memoryview, str]) -> None:
    """Decompress and decode one chunk into ``out`` (its slice of the column)."""
    out, (_, width, base, start), packed, where = job
    m = len(out)
    offsets: np.ndarray | None = None
    if width:
        planes = np.frombuffer(inflate(packed, m * width, where),
                               dtype=np.uint8).reshape(width, m)
        offsets = planes[-1].astype(_UNSIGNED[width], copy=False)  # a byte: no copy
        for plane in planes[-2::-1]:  # the bytes back together, high to low, by shifts
            offsets <<= 8
            offsets |= plane
    target = out.dtype
    narrow = target != np.int64
    if start is None and (not narrow or _holds(target, base, base + (1 << 8 * width) - 1)):
        values = out  # no value can fall outside ``target``
    else:
        values = np.empty(m, dtype=np.int64) if narrow else out
    if offsets is None:
        values.fill(base)
    else:
        np.add(offsets, np.int64(base), out=values, dtype=np.int64, casting="unsafe")
    if start is not None:
        np.cumsum(values, out=values)
        values += np.int64(start)
    if values is not out:
        if m and not _holds(target, int(values.min()), int(values.max())):
            info = np.iinfo(target)
            raise SchemaError(f"{where}: holds values outside {target} "
                              f"[{info.min}, {info.max}]")
        out[...] = values


def _holds(dtype: np.dtype, lo: int, hi: int) -> bool:
    info = np.iinfo(dtype)
    return info.min <= lo and hi <= info.max
