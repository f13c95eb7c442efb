"""The plain data every part of jupyter_gpumem reads: snapshot, segment, block, trace entry.

The key and action names are PyTorch's (``torch.cuda.memory._snapshot``), so a dump of ours opens
in PyTorch's memory viewer and a PyTorch pickle renders with our tools. Our own additions live in
extra keys that PyTorch's readers ignore (``cell``, ``schema``, ``jupyter_gpumem``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from itertools import chain, compress, repeat
from operator import add, itemgetter, methodcaller, ne, not_
from typing import (
    Any,
    Literal,
    NotRequired,
    Protocol,
    TypedDict,
    TypeGuard,
    cast,
    runtime_checkable,
)

from jupyter_gpumem.data.codes import OOM, TraceAction
from jupyter_gpumem.data.settings_text import from_env, key_values
from jupyter_gpumem.data.sizes import ADDRESS_LIMIT, MAX_ALLOC_SIZE, segment_type_of

#: Version of the snapshot/trace layout written by this package. Bump on any incompatible change.
SCHEMA_VERSION = 1

BlockState = Literal["active_allocated", "active_pending_free", "inactive"]
SegmentType = Literal["small", "large"]


class Frame(TypedDict):
    """One Python stack frame, innermost first in every ``frames`` list."""

    filename: str  # source file of the frame
    line: int  # line number being executed
    name: str  # function name (``<module>`` for a cell's top level)


class BlockInfo(TypedDict):
    """One block of a segment, in address order."""

    address: int  # device address of the block's first byte
    size: int  # bytes the block covers (after rounding and splitting)
    requested_size: int  # bytes the user asked for; 0 for a cached free block
    state: BlockState  # allocated, waiting on a stream, or cached free
    frames: list[Frame]  # where it was allocated (empty without stack recording)


class SegmentInfo(TypedDict):
    """One segment obtained from the device with a single device malloc."""

    device: int  # device index
    address: int  # device address of the segment
    total_size: int  # bytes of the segment
    allocated_size: int  # bytes of its blocks handed to the user
    active_size: int  # allocated plus pending-free bytes
    requested_size: int  # bytes the user asked for, summed over allocated blocks
    stream: int  # stream the segment's blocks belong to
    segment_type: SegmentType  # the pool: "small" (≤ 1 MiB requests) or "large"
    segment_pool_id: tuple[int, int]  # PyTorch's private-pool id; always (0, 0) here
    is_expandable: bool  # one mapped range of an expandable segment (engine.expandable)
    frames: list[Frame]  # where the segment was allocated
    blocks: list[BlockInfo]  # the segment's blocks, covering it exactly
    # our addition, on a mapped range of an expandable segment: the start and bytes of the
    # segment's reserved virtual range (Note [The virtual range] in whatif.program)
    virtual_address: NotRequired[int]
    virtual_size: NotRequired[int]


class TraceEntry(TypedDict):
    """One event of the allocation history."""

    action: TraceAction  # what happened
    addr: int  # block or segment address (0 for an oom)
    size: int  # requested bytes for alloc/free, segment bytes for segment events
    stream: int  # the stream of the block or segment
    time_us: int  # microseconds on the allocator's clock
    frames: list[Frame]  # the user's Python stack at the event, innermost first
    device_free: NotRequired[int]  # for an oom: bytes the device reported free
    block_size: NotRequired[int]  # our addition: bytes of the block, for alloc and free events
    cell: NotRequired[int]  # our addition: the notebook cell running at the event
    # our addition (jupyter_gpumem.dask): the Dask task(s) running at the event, an index into
    # the snapshot's jupyter_gpumem["tasks"] (lists of task keys)
    task: NotRequired[int]
    # our addition, for a segment_free: who released it ("empty_cache", "retry", "oversize", "gc")
    reason: NotRequired[str]
    requested_size: NotRequired[int]  # our addition, for an oom: the bytes asked for (size is
    # the rounded request, as PyTorch records it)
    # our additions, for a segment_map or segment_unmap: the base of the expandable segment's
    # reserved range and its pool (Note [The virtual range] in whatif.program)
    virtual_address: NotRequired[int]
    segment_type: NotRequired[SegmentType]


class Snapshot(TypedDict):
    """The allocator's whole state, plus its recorded history per device."""

    segments: list[SegmentInfo]  # every segment, in address order
    device_traces: list[Sequence[TraceEntry]]  # history per device index: ours, TraceColumns
    schema: NotRequired[int]  # our addition: SCHEMA_VERSION of the writer
    jupyter_gpumem: NotRequired[dict[str, object]]  # our addition: stats, config, device info


class CellRecord(TypedDict):
    """One row of the per-cell ledger: what one notebook cell did to the allocator."""

    cell: int  # the cell's execution count
    source: str  # the line that allocated most of what the cell left, else its first line of code
    allocated_delta: int  # allocated bytes after the cell minus before it
    reserved_delta: int  # reserved bytes after the cell minus before it
    peak_allocated: int  # the highest allocated bytes while the cell ran
    allocs: int  # allocations made by the cell
    frees: int  # frees made by the cell
    segments_new: int  # segments obtained from the device while the cell ran
    ooms: int  # out-of-memory errors raised while the cell ran
    wall_s: float  # wall-clock seconds the cell took
    start_event: int  # index in the trace of the cell's first event (-1 without history)
    end_event: int  # index in the trace just past the cell's last event (-1 without history)
    #: the memory source of the row when it is not our allocator ("cupy"): "torch", "jax"...
    #: (Note [Whose row] in ``notebook.ledger``)
    memory_source: NotRequired[str]
    #: False when ``peak_allocated`` is only an upper bound (Note [Cell peak from counters] in
    #: ``sources.base``)
    peak_exact: NotRequired[bool]


# -- checking what a file holds --------------------------------------------------------------
#
# A loaded file is checked against the shapes above before anything reads it. Strict on the types
# and values of the fields our renderers read; lenient on extra keys and on the optional fields
# PyTorch's own snapshots may leave out (they get defaults). The work is bounded before it is
# done: counts are summed (a shared, memo-referenced list counts every time it is referenced)
# and checked against ``LoadLimits`` before the items are walked.
#
# Note [Bounded numbers and text]: what the readers compute from a loaded file must fit their
# signed 64-bit columns, and take time and make output in proportion to the file. So a size (of
# a block, a segment, an event but an oom's request) is at most ``MAX_ALLOC_SIZE``, the largest
# the allocator takes; an address and the end of a block, segment or event (address + size)
# are below ``ADDRESS_LIMIT``; all the sizes of a file add up to at most ``MAX_ALLOC_SIZE`` (so
# no running total of allocated or reserved bytes can pass it); every other integer fits 64
# bits. A string longer than ``MAX_TEXT`` is cut to it at load (and a lone surrogate, which no
# output encodes, replaced), and the text of the stack frames and of the ``jupyter_gpumem`` dict
# is counted against ``max_bytes`` at its expanded size: a string shared by many frames (a
# pickle's memo makes that cheap) counts at each.

LIMITS_ENV_VAR = "JUPYTER_GPUMEM_LOAD_LIMITS"
_BIG = 1 << 63  # every other integer we read must fit a signed 64-bit column
_CELL_MAX = 1 << 31
#: The most characters a loaded string keeps (a frame's file or function name, a device name, a
#: Dask task key...): a longer one is cut to this, its last character "…" (Note [Bounded
#: numbers and text]).
MAX_TEXT = 1024
#: How deep the ``jupyter_gpumem`` dict of a loaded file may nest (ours nests 4 deep).
_EXTRAS_DEPTH = 32
_BLOCK_STATES = frozenset(("active_allocated", "active_pending_free", "inactive"))
_SEGMENT_TYPES = frozenset(("small", "large"))
_FRAME_REFS = "stack frame references (a shared list counts each time)"


@dataclass(frozen=True)
class LoadLimits:
    """How much a loaded file may hold; raise one with ``load_snapshot(path,
    limits=LoadLimits(max_events=...))`` or ``JUPYTER_GPUMEM_LOAD_LIMITS=max_events:50000000``."""

    max_bytes: int = 1 << 30  # the file's bytes once decompressed
    max_segments: int = 1_000_000  # segments, all devices together
    max_blocks: int = 4_000_000  # blocks of all segments
    max_events: int = 10_000_000  # trace events, all devices together
    max_frames: int = 50_000_000  # stack frames, counted once per block/event/segment using them
    max_devices: int = 1024  # per-device trace lists
    max_extras: int = 10_000_000  # items of the jupyter_gpumem dict, counted at each reference

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoadLimits:
        """The defaults, changed by ``JUPYTER_GPUMEM_LOAD_LIMITS="max_bytes:4GiB,max_events:N"``."""
        return from_env(LIMITS_ENV_VAR, cls.parse, environ)

    @classmethod
    def parse(cls, text: str) -> LoadLimits:
        """``"max_bytes:4GiB,max_blocks:10000000"``: the defaults with those keys changed."""
        from jupyter_gpumem.data.units import parse_bytes

        changes: dict[str, int] = {}
        names = [f.name for f in fields(cls)]
        for key, raw in key_values(text):
            if key not in names:
                raise ValueError(f"unknown limit {key!r} (known: {', '.join(names)})")
            value = parse_bytes(raw)
            if value < 1:
                raise ValueError(f"{key} must be at least 1, got {raw!r}")
            changes[key] = value
        return replace(cls(), **changes)


def limit_hint(name: str, example: str = "N") -> str:
    """How to raise the limit ``name``, for error messages."""
    return (f"raise it with {LIMITS_ENV_VAR}={name}:{example} or "
            f"load_snapshot(path, limits=LoadLimits({name}=...))")


class LimitExceeded(ValueError):
    """A file holds more than a ``LoadLimits`` field allows; the message names the field."""

    def __init__(self, what: str, name: str, limit: int) -> None:
        super().__init__(f"holds more than {limit:,} {what} (limit {name}); {limit_hint(name)}")
        self.limit_name = name


class SchemaError(ValueError):
    """A field of a loaded snapshot has the wrong type or value; the message names the field,
    as in ``segments[3].blocks[7].size: expected a non-negative integer, got -5``."""


def describe(value: object) -> str:
    """A short description of a bad value, safe for any size or depth of value."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"
    if isinstance(value, (dict, list, tuple, set, frozenset, bytes, bytearray)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    return f"a {type(value).__name__}"


_MISSING = object()


def _bad(key: str, what: str, value: object) -> str:
    return f".{key}: expected {what}, got {describe(value)}"


def _uint(d: dict[str, object], key: str, required: bool = False,
          top: int = _BIG - 1) -> str | None:
    """None if ``d[key]`` is an int in [0, top] (or absent and optional), else the problem."""
    v = d.get(key, _MISSING)
    if type(v) is int and 0 <= v <= top:
        return None
    if v is _MISSING:
        return f": missing {key!r}" if required else None
    big = type(v) is int and v > 0
    bound = (" up to 2**62 (the largest size the allocator takes)" if top == MAX_ALLOC_SIZE
             else " below 2**63")
    return _bad(key, "a non-negative integer" + (bound if big else ""), v)


def _size(d: dict[str, object], key: str, required: bool = False) -> str | None:
    """None if ``d[key]`` is a size in bytes the allocator could hold (or absent and optional)."""
    return _uint(d, key, required, MAX_ALLOC_SIZE)


def _end_problem(address: int, key: str, size: int) -> str | None:
    """The problem if a range at ``address`` of ``size`` bytes ends past ``ADDRESS_LIMIT``."""
    if address + size < ADDRESS_LIMIT:
        return None
    return (f": its address {address:#x} plus its {key} of {size:,} bytes pass 2**63, the end "
            "of the address space")


def _int(d: dict[str, object], key: str, lo: int = -_BIG, hi: int = _BIG) -> str | None:
    v = d.get(key, _MISSING)
    if v is _MISSING or (type(v) is int and lo <= v < hi):
        return None
    return _bad(key, f"an integer in [{lo}, {hi})" if hi != _BIG else "an integer", v)


def _one_of(d: dict[str, object], key: str, allowed: frozenset[str]) -> str | None:
    v = d.get(key, _MISSING)
    if type(v) is str and v in allowed:
        return None
    if v is _MISSING:
        return f": missing {key!r}"
    return _bad(key, " or ".join(map(repr, sorted(allowed))), v)


def _frames_of(d: dict[str, object]) -> int:
    """Fill ``frames``; return how many it holds (-1 if it is not a list)."""
    frames = d.setdefault("frames", [])
    return len(frames) if type(frames) is list else -1


def _block_problem(b: object) -> str | None:
    if type(b) is not dict:
        return f": expected a dict, got {describe(b)}"
    return (_size(b, "size", True) or _one_of(b, "state", _BLOCK_STATES) or _uint(b, "address")
            or _size(b, "requested_size"))


def _segment_problem(seg: dict[str, object]) -> str | None:
    problem = (_uint(seg, "address", True) or _size(seg, "total_size", True)
               or _uint(seg, "device") or _int(seg, "stream") or _size(seg, "allocated_size")
               or _size(seg, "active_size") or _size(seg, "requested_size")
               or _end_problem(cast(int, seg["address"]), "total_size",
                               cast(int, seg["total_size"])))
    if problem or "segment_type" not in seg:
        return problem
    return _one_of(seg, "segment_type", _SEGMENT_TYPES)


def _check_segment(seg: dict[str, object], where: str) -> int:
    """Check and fill one segment and its blocks; return the frames they refer to."""
    problem = _segment_problem(seg)
    if problem:
        raise SchemaError(where + problem)
    total = cast(int, seg["total_size"])  # checked just above
    seg.setdefault("device", 0)
    seg.setdefault("stream", 0)
    seg.setdefault("segment_type", segment_type_of(total))
    frames = _frames_of(seg)
    if frames < 0:
        raise SchemaError(where + _bad("frames", "a list of frames", seg["frames"]))
    start = cast(int, seg["address"])
    cursor = start
    covered = 0
    misplaced = None
    blocks = seg["blocks"]
    assert isinstance(blocks, list)
    for j, b in enumerate(blocks):
        problem = _block_problem(b)
        if problem:
            raise SchemaError(f"{where}.blocks[{j}]{problem}")
        size = b["size"]
        b.setdefault("address", cursor)
        b.setdefault("requested_size", size if b["state"] != "inactive" else 0)
        n = _frames_of(b)
        if n < 0:
            raise SchemaError(f"{where}.blocks[{j}]" + _bad("frames", "a list of frames",
                                                            b["frames"]))
        if misplaced is None and not cursor <= b["address"] <= start + total - size:
            misplaced = (f"{where}.blocks[{j}]: {size:,} bytes at {b['address']:#x} "
                         + ("overlap the block before them" if start <= b["address"] < cursor
                            else f"lie outside the segment ({start:#x} to "
                                 f"{start + total:#x})"))
        frames += n
        cursor = b["address"] + size
        covered += size
    if covered > total:
        raise SchemaError(f"{where}.blocks: their sizes add up to {covered:,} bytes, more than "
                          f"the segment's total_size of {total:,}")
    if misplaced is not None:
        raise SchemaError(misplaced)
    return frames


def _event_problem(e: object) -> str | None:
    if type(e) is not dict:
        return f": expected a dict, got {describe(e)}"
    action = e.get("action", _MISSING)
    if type(action) is not str:
        return ": missing 'action'" if action is _MISSING else _bad("action", "a string", action)
    oom = action == "oom"
    # PyTorch (2.11) writes no address on an oom entry; an oom's size is the request, which may
    # pass the largest the allocator takes (it is out of memory at once)
    return (_uint(e, "addr", not oom) or (_uint if oom else _size)(e, "size", True)
            or _int(e, "stream") or _int(e, "time_us") or _uint(e, "device_free")
            or _size(e, "block_size") or _uint(e, "requested_size")
            or _int(e, "cell", -1, _CELL_MAX) or _int(e, "task", 0, _CELL_MAX)
            or (None if oom else _end_problem(cast(int, e["addr"]), "size",
                                                cast(int, e["size"]))))


def _frame_problem(f: object) -> str | None:
    if type(f) is not dict:
        return f": expected a dict with filename, line and name, got {describe(f)}"
    for key in ("filename", "name"):
        v = f.get(key, _MISSING)
        if type(v) is not str:
            return f": missing {key!r}" if v is _MISSING else _bad(key, "a string", v)
    if "line" not in f:
        return ": missing 'line'"
    return _int(f, "line")


def _frames_problem(frames: list[object], seen: set[int]) -> str | None:
    """The first bad frame of ``frames``; a list or frame shared by several blocks or events
    (PyTorch and live snapshots share them) is checked once."""
    if id(frames) in seen:
        return None
    seen.add(id(frames))
    for k, f in enumerate(frames):
        if id(f) in seen:
            continue
        problem = _frame_problem(f)
        if problem:
            return f".frames[{k}]{problem}"
        seen.add(id(f))
    return None


# Column checks: one C-level pass per field over a whole trace (``map``/``itemgetter``), the
# fast path for a million events. When one fails, the per-item checks above find and name the
# field.

def _column(items: list[Any], key: str, default: object = _MISSING) -> list[Any] | None:
    """``key`` of every item, or None if an item lacks it."""
    try:
        if default is _MISSING:
            return list(map(itemgetter(key), items))
        return list(map(methodcaller("get", key, default), items))
    except KeyError:
        return None


def _ints_in(values: list[Any] | None, lo: int, hi: int) -> bool:
    return values is not None and (not values or (
        set(map(type, values)) == {int} and lo <= min(values) and max(values) < hi))


_EVENT_KEYS = ("action", "addr", "size", "stream", "time_us", "frames")


def _trace_ok(trace: list[Any]) -> int:
    """The frames ``trace``'s entries refer to (defaults filled), or -1 if some entry is bad."""
    if not trace:
        return 0
    if set(map(type, trace)) != {dict}:
        return -1
    try:
        rows = list(map(itemgetter(*_EVENT_KEYS), trace))  # one pass over the dicts
    except KeyError:
        for e in trace:
            if e.get("action") == "oom":  # PyTorch (2.11) writes no address on an oom entry
                e.setdefault("addr", 0)
            e.setdefault("stream", 0)
            e.setdefault("time_us", 0)
            e.setdefault("frames", [])
        try:
            rows = list(map(itemgetter(*_EVENT_KEYS), trace))
        except KeyError:  # no action, addr or size
            return -1
    action, addr, size, stream, time_us, frames = (list(map(itemgetter(k), rows))
                                                   for k in range(len(_EVENT_KEYS)))
    del rows
    ok = (set(map(type, action)) == {str} and _ints_in(addr, 0, _BIG)
          and _ints_in(size, 0, MAX_ALLOC_SIZE + 1)  # an oom's may be more: the slow path
          and max(map(add, addr, size)) < ADDRESS_LIMIT
          and _ints_in(stream, -_BIG, _BIG)
          and _ints_in(time_us, -_BIG, _BIG) and set(map(type, frames)) == {list}
          and _ints_in(_column(trace, "cell", -1), -1, _CELL_MAX)
          and _ints_in(_column(trace, "task", 0), 0, _CELL_MAX)
          and _ints_in(_column(trace, "block_size", 0), 0, MAX_ALLOC_SIZE + 1)
          and _ints_in(_column(trace, "requested_size", 0), 0, _BIG)
          and _ints_in(_column(trace, "device_free", 0), 0, _BIG))
    return sum(map(len, frames)) if ok else -1


def _columns_frames(trace: Any, d: int) -> int:
    """Check a trace held as columns (``data.columns.TraceColumns``) by each column's least
    and greatest value, and event by event only if those do not settle it; raise for the
    first bad event, named as ``_event_problem`` names it, else return the frames its events
    refer to."""
    import numpy as np

    c = trace.columns
    if not _columns_in_range(c, len(trace.stacks)):
        _columns_problem(trace, d)
    lengths = np.array([len(f) for f in trace.stacks] + [0], dtype=np.int32)
    block = 1 << 16  # a gather a block, in the cache: twice as fast as one over the column
    return sum(int(np.take(lengths, c["stack"][i:i + block]).sum(dtype=np.int64))
               for i in range(0, len(trace), block))


def _columns_in_range(c: Any, stacks: int) -> bool:
    """Whether every event of these columns is in range by the least and greatest value of
    each column alone (passes without temporaries), as if none were an oom (whose size may
    be more); False: look event by event."""
    if not len(c["action"]):
        return True
    lo = {k: int(c[k].min()) for k in ("addr", "size", "cell", "task", "extra", "device_free",
                                       "stack")}
    hi = {k: int(c[k].max()) for k in ("addr", "size", "extra", "stack")}
    return (min(lo["addr"], lo["size"], lo["extra"], lo["device_free"]) >= 0
            and min(lo["cell"], lo["task"], lo["stack"]) >= -1 and hi["stack"] < stacks
            and max(hi["size"], hi["extra"]) <= MAX_ALLOC_SIZE
            and hi["addr"] + hi["size"] < ADDRESS_LIMIT)


def _columns_problem(trace: Any, d: int) -> None:
    """Raise for the first bad event of a trace held as columns, if any (one numpy pass per
    field over the whole trace)."""
    import numpy as np

    c = trace.columns
    action, addr, size = c["action"], c["addr"], c["size"]
    oom = action == OOM
    # the columns' dtypes hold only ints (streams and times may be any int64)
    bad = ((addr < 0) | (size < 0) | (~oom & (size > MAX_ALLOC_SIZE))
           | (~oom & (addr > ADDRESS_LIMIT - 1 - np.minimum(size, ADDRESS_LIMIT - 1)))
           | (c["cell"] < -1) | (c["task"] < -1) | (c["extra"] < 0) | (c["device_free"] < 0)
           | (c["stack"] < -1) | (c["stack"] >= len(trace.stacks))
           | (~oom & (c["extra"] > MAX_ALLOC_SIZE)))
    if bad.any():
        j = int(np.argmax(bad))
        e = trace.entry(j)
        problem = (_event_problem(e) if 0 <= c["stack"][j] < len(trace.stacks) or
                   c["stack"][j] == -1 else f": stack index {c['stack'][j]} is not one of "
                   f"its {len(trace.stacks)} stacks")
        raise SchemaError(f"device_traces[{d}][{j}]" + (problem or ": a value out of range"))


@runtime_checkable
class ColumnarTrace(Protocol):
    """A device's trace held as columns, as the checks here read it (``data.columns.TraceColumns``
    is one; this module stays below it): a numpy array a field, the interned frame lists its
    ``stack`` column indexes, and one event as a trace entry."""

    stacks: list[list[Frame]]

    @property
    def columns(self) -> Mapping[str, Any]: ...

    def entry(self, index: int) -> TraceEntry: ...

    def __len__(self) -> int: ...


def _is_columns(trace: object) -> TypeGuard[ColumnarTrace]:
    return isinstance(trace, ColumnarTrace)


def _trace_bytes(trace: list[Any]) -> int:
    """The bytes of a checked trace's events and their block sizes, but an oom's request."""
    if _is_columns(trace):
        c = trace.columns
        sizes, extra = c["size"], c["extra"]  # checked: in [0, 2**62] but an oom's
        if (c["action"] == OOM).any():
            not_oom = c["action"] != OOM
            sizes, extra = sizes[not_oom], extra[not_oom]
        if float(sizes.sum(dtype="f8")) + float(extra.sum(dtype="f8")) < 2.0 ** 62:
            return int(sizes.sum()) + int(extra.sum())  # exact: no int64 sum can wrap here
        return int(sizes.sum(dtype=object)) + int(extra.sum(dtype=object))
    sizes = map(itemgetter("size"), trace)
    not_oom = map(ne, map(itemgetter("action"), trace), repeat("oom"))
    return int(sum(compress(sizes, not_oom))
               + sum(map(methodcaller("get", "block_size", 0), trace)))


def _frame_text(lists: Iterable[list[Any]], limits: LoadLimits, extras: int) -> bool:
    """Whether every frame of these (distinct) lists is a dict with filename, line and name.
    If so, the names are cleaned (``clean_text``), and their characters (a string shared
    by several frames counted at each) plus ``extras`` must be within ``max_bytes``."""
    flat = list(chain.from_iterable(lists))
    if not flat:
        return True
    if set(map(type, flat)) != {dict}:
        return False
    names = _column(flat, "filename")
    funcs = _column(flat, "name")
    if not (names is not None and set(map(type, names)) == {str} and funcs is not None
            and set(map(type, funcs)) == {str} and _ints_in(_column(flat, "line"), -_BIG, _BIG)):
        return False
    texts = names + funcs
    lengths = list(map(len, texts))
    if sum(lengths) + extras > limits.max_bytes:  # a frame shared by several lists counts once
        distinct = list(dict(zip(map(id, flat), flat, strict=True)).values())
        text = (sum(map(len, map(itemgetter("filename"), distinct)))
                + sum(map(len, map(itemgetter("name"), distinct))))
        count_within(extras, text, _TEXT, "max_bytes", limits.max_bytes)
    odd = set(compress(texts, map(not_, map(str.isascii, texts))))  # few distinct ones
    if max(lengths) > MAX_TEXT or not all(map(_encodes, odd)):
        for f in flat:
            f["filename"], f["name"] = clean_text(f["filename"]), clean_text(f["name"])
    return True


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str, most: int = MAX_TEXT) -> str:
    """``text`` cut to ``most`` characters (the last one "…") if it is longer, and with any
    lone surrogate (which no output can encode) replaced by U+FFFD."""
    if len(text) > most:
        text = text[:most - 1] + "…"
    if text.isascii() or _encodes(text):
        return text
    return _SURROGATE.sub("\ufffd", text)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unclean(value: object) -> bool:
    return type(value) is str and (len(value) > MAX_TEXT or not (value.isascii()
                                                                or _encodes(value)))


def _clean_any(value: Any) -> Any:
    return clean_text(value) if type(value) is str else value


_TEXT = ("characters of text (a string shared by several stack frames or places counts at "
         "each)")
_IN_PROGRESS = (-1, -1)


def _walk_extras(root: object, limits: LoadLimits) -> int:
    """The characters of the strings in ``root`` (the ``jupyter_gpumem`` dict), each counted at
    every place it is used; its strings cleaned (``clean_text``), in place, in its lists and
    dicts (keys too). Items are counted at every reference against ``max_extras``, and each
    distinct list or dict is walked once, so a memo-shared list costs what its file does."""
    memo: dict[int, tuple[int, int]] = {}  # id -> (items, characters) at expanded size

    def walk(node: object, depth: int) -> tuple[int, int]:
        if type(node) is str:
            return 1, len(node)
        if not isinstance(node, (dict, list, tuple, set, frozenset)):
            return 1, 0
        known = memo.get(id(node))
        if known is _IN_PROGRESS:
            raise SchemaError("jupyter_gpumem: holds a list or dict that contains itself")
        if known is not None:
            return known
        if depth > _EXTRAS_DEPTH:
            raise SchemaError(f"jupyter_gpumem: nested more than {_EXTRAS_DEPTH} deep")
        memo[id(node)] = _IN_PROGRESS
        items, chars = 1, 0
        parts = chain.from_iterable(node.items()) if isinstance(node, dict) else node
        for part in parts:
            n, c = walk(part, depth + 1)
            items, chars = items + n, chars + c
            if items > limits.max_extras:
                raise LimitExceeded("items in the jupyter_gpumem dict (a list or dict used in "
                                    "several places counts at each)", "max_extras",
                                    limits.max_extras)
        if type(node) is dict and any(map(_unclean, chain.from_iterable(node.items()))):
            cleaned = {_clean_any(k): _clean_any(v) for k, v in node.items()}
            node.clear()
            node.update(cleaned)
        elif type(node) is list and any(map(_unclean, node)):
            node[:] = map(_clean_any, node)
        memo[id(node)] = (items, chars)
        return items, chars

    return walk(root, 0)[1]


def _first_bad(items: Iterable[tuple[str, object]], ok: Callable[[object], bool]
               ) -> tuple[str, object] | None:
    """The first ``(where, value)`` whose value is not ``ok``."""
    return next(((where, v) for where, v in items if not ok(v)), None)


def _index(v: object) -> bool:
    return type(v) is int and 0 <= v < _BIG


def _is_str(v: object) -> bool:
    return type(v) is str


def _check_info(info: dict[str, Any], where: str) -> None:
    """The fields of a ``jupyter_gpumem`` dict (or one device's, in its ``devices``) that
    readers use: device figures, and the Dask ``workers``, ``missing_workers`` and ``tasks``."""
    for key in ("device", "device_total", "device_free", "history_dropped"):
        problem = _uint(info, key)
        if problem:
            raise SchemaError(where + problem)
    for key, what, value_ok in (
            ("workers", "a device index", _index),
            ("missing_workers", "a string saying what went wrong", _is_str)):
        found = info.get(key, _MISSING)
        if found is _MISSING:
            continue
        _expect(type(found) is dict, f"{where}.{key}", "a dict keyed by worker address", found)
        assert isinstance(found, dict)
        bad = _first_bad(((f"[{describe(k)}]", k) for k in found), _is_str)
        _expect(bad is None, f"{where}.{key}", "worker addresses (strings) as keys",
                bad and bad[1])
        bad = _first_bad(((f"[{describe(k)}]", v) for k, v in found.items()), value_ok)
        if bad is not None:
            _expect(False, f"{where}.{key}{bad[0]}", what, bad[1])
    tasks = info.get("tasks", _MISSING)
    if tasks is not _MISSING:
        _expect(type(tasks) is list, f"{where}.tasks", "a list of task labels", tasks)
        assert isinstance(tasks, list)
        bad = _first_bad(((f"[{i}]", label) for i, label in enumerate(tasks)),
                         lambda v: type(v) is list)
        if bad is not None:
            _expect(False, f"{where}.tasks{bad[0]}", "a list of task keys", bad[1])
        bad = _first_bad(((f"[{i}][{j}]", key) for i, label in enumerate(tasks)
                          for j, key in enumerate(label)), _is_str)
        if bad is not None:
            _expect(False, f"{where}.tasks{bad[0]}", "a task key (a string)", bad[1])


def _check_extras(obj: dict[str, Any], limits: LoadLimits) -> int:
    """Check ``obj["jupyter_gpumem"]`` (our additions) and cut its long strings; return the
    characters of its text, counted at every place a string is used."""
    info = obj.get("jupyter_gpumem", {})
    _expect(type(info) is dict, "jupyter_gpumem", "a dict", info)
    chars = count_within(0, _walk_extras(info, limits), _TEXT, "max_bytes", limits.max_bytes)
    _check_info(info, "jupyter_gpumem")
    devices = info.get("devices")
    if devices is not None:
        _expect(type(devices) is dict, "jupyter_gpumem.devices", "a dict of per-device dicts",
                devices)
        for key, one in devices.items():
            where = f"jupyter_gpumem.devices[{describe(key)}]"
            _expect(type(one) is dict, where, "a dict", one)
            _check_info(one, where)
    return chars


def count_within(running: int, more: int, what: str, name: str, limit: int) -> int:
    """``running + more``; ``LimitExceeded`` (``what``, limit field ``name``) past ``limit``."""
    running += more
    if running > limit:
        raise LimitExceeded(what, name, limit)
    return running


def _trace_problem(trace: list[Any], d: int) -> int:
    """Check and fill one device's trace entry by entry: raise for the first bad one, else
    return the frames they refer to."""
    frames = 0
    for j, e in enumerate(trace):
        problem = _event_problem(e)
        n = -1 if problem else _frames_of(e)
        if n < 0:
            raise SchemaError(f"device_traces[{d}][{j}]" + (
                problem or _bad("frames", "a list of frames", e["frames"])))
        e.setdefault("stream", 0)
        e.setdefault("time_us", 0)
        frames += n
    return frames


def _frames_problems(segments: list[Any], traces: list[Any]) -> None:
    """Raise for the first bad frame, named by the first block or event that refers to it."""
    seen: set[int] = set()
    for i, seg in enumerate(segments):
        problem = _frames_problem(seg["frames"], seen)
        if problem:
            raise SchemaError(f"segments[{i}]{problem}")
        for j, b in enumerate(seg["blocks"]):
            problem = _frames_problem(b["frames"], seen)
            if problem:
                raise SchemaError(f"segments[{i}].blocks[{j}]{problem}")
    for d, trace in enumerate(traces):
        for j, e in enumerate(trace):  # columns: each event's frames are a stack's shared list
            problem = _frames_problem(e["frames"], seen)
            if problem:
                raise SchemaError(f"device_traces[{d}][{j}]{problem}")


def _expect(cond: bool, where: str, what: str, value: object) -> None:
    if not cond:
        raise SchemaError(f"{where}: expected {what}, got {describe(value)}")


def check_snapshot(obj: object, limits: LoadLimits | None = None) -> Snapshot:
    """``obj`` (what a file held: ours, PyTorch's, or a saved trace result) as a Snapshot, with
    the keys older PyTorch versions leave out filled in.

    Raises ``SchemaError`` naming the first bad field, or ``LimitExceeded``; nothing is walked
    before its size is counted against ``limits``."""
    limits = limits or LoadLimits()
    if type(obj) is dict and type(obj.get("snapshot")) is dict:
        obj = obj["snapshot"]  # a saved TraceResult
    if type(obj) is list:  # very old PyTorch: a bare list of segments
        obj = {"segments": obj, "device_traces": []}
    if type(obj) is not dict or "segments" not in obj:
        raise SchemaError("not a memory snapshot: expected a dict with 'segments', got "
                          + describe(obj))
    assert isinstance(obj, dict)
    segments = obj["segments"]
    _expect(type(segments) is list, "segments", "a list", segments)
    traces = obj.setdefault("device_traces", [])
    _expect(type(traces) is list, "device_traces", "a list of lists (one per device)", traces)
    extras = _check_extras(obj, limits)
    _expect(type(obj.get("schema", 0)) is int, "schema", "an integer", obj.get("schema"))
    # Count first: a memo-shared list counts once per reference, so a small file cannot
    # stand for more work than the limits allow.
    count_within(0, len(segments), "segments", "max_segments", limits.max_segments)
    count_within(0, len(traces), "per-device trace lists", "max_devices", limits.max_devices)
    blocks = events = 0
    for i, seg in enumerate(segments):
        if type(seg) is not dict or type(seg.get("blocks")) is not list:
            _expect(type(seg) is dict, f"segments[{i}]", "a dict", seg)
            if "blocks" not in seg:
                raise SchemaError(f"segments[{i}]: missing 'blocks'")
            _expect(False, f"segments[{i}].blocks", "a list", seg["blocks"])
        blocks = count_within(blocks, len(seg["blocks"]), "blocks", "max_blocks", limits.max_blocks)
    for d, trace in enumerate(traces):
        if type(trace) is not list and not _is_columns(trace):
            _expect(False, f"device_traces[{d}]", "a list of trace entries", trace)
        events = count_within(events, len(trace), "trace events", "max_events", limits.max_events)
    # Then check each item's fields, counting the frames they refer to.
    frames = 0
    for i, seg in enumerate(segments):
        frames = count_within(frames, _check_segment(seg, f"segments[{i}]"), _FRAME_REFS,
                        "max_frames", limits.max_frames)
    for d, trace in enumerate(traces):
        n = _columns_frames(trace, d) if _is_columns(trace) else _trace_ok(trace)
        if n < 0:
            n = _trace_problem(trace, d)
        frames = count_within(frames, n, _FRAME_REFS, "max_frames", limits.max_frames)
    _check_total(segments, traces)
    # Last, the frames themselves: each distinct list once (PyTorch and live snapshots share
    # them), and only if the fast check finds something wrong, where it is.
    refs = [seg["frames"] for seg in segments]
    refs += [b["frames"] for seg in segments for b in seg["blocks"]]
    for trace in traces:
        refs += trace.stacks if _is_columns(trace) else map(itemgetter("frames"), trace)
    lists = dict(zip(map(id, refs), refs, strict=True))
    del refs
    if not _frame_text(lists.values(), limits, extras):
        _frames_problems(segments, traces)
    return cast(Snapshot, obj)


def _check_total(segments: list[Any], traces: list[Any]) -> None:
    """A SchemaError if the sizes of a checked file add up to more than ``MAX_ALLOC_SIZE``
    (Note [Bounded numbers and text])."""
    total = sum(map(itemgetter("total_size"), segments))
    if total > MAX_ALLOC_SIZE:
        raise SchemaError(f"segments: their total_size add up to {total:,} bytes, more than "
                          "2**62 (the largest size the allocator takes)")
    for d, trace in enumerate(traces):
        total += _trace_bytes(trace)
        if total > MAX_ALLOC_SIZE:
            raise SchemaError(f"device_traces[{d}]: the sizes of its events (and of the "
                              "segments) add up to more than 2**62 bytes (the largest size "
                              "the allocator takes)")
