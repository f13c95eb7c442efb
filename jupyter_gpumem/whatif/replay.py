"""What if: re-run a recorded alloc/free sequence through our allocator under another config.

``replay(snapshot)`` runs the requests of a trace (ours or PyTorch's) through a
``CachingAllocator`` (the C core when built; ``JUPYTER_GPUMEM_CORE=python`` for the Python one)
on a ``SimulatedDevice`` of the recorded device's size, and reports what the policy did: peak
reserved and allocated bytes, segments, retries, out-of-memory errors, and reserved bytes and
fragmentation over time.

Exact, for a trace of ours replayed under its own config on a device of its size: the peak
reserved bytes, the segments (count, sizes, layout), retries and OOMs are those recorded. Under
another config they are those of the same program run under that config, provided the program
makes the same requests in the same order whatever their outcome. What makes this hold:

- each request is replayed at the size the user asked for, on its stream, in order; frees in
  order; ``empty_cache()`` where it was called (calls that freed nothing included);
- the layout at the trace's start is rebuilt exactly: every segment, in address order, with
  its blocks at their offsets (live ones live, free ones cached), by carving each segment with
  mallocs under the default config (``whatif.rebuild``); an expandable segment from the base of
  its reserved range, its unmapped stretches included (Note [The virtual range] in
  ``whatif.program``). The chosen config applies from the trace's start, as a runtime change
  would (Note [Oversize blocks after a runtime change] in ``engine.allocator``);
- device addresses differ from the recorded ones but keep their order, so best fit breaks ties
  the same way.

Expandable segments: ``segment_map`` / ``segment_unmap`` events are the recorded policy's own
and replay as nothing, as segment events do; a trace recorded under one setting of
``expandable_segments`` replays under the other. Peak reserved bytes are exact under the
recorded config as above (reserved bytes count mapped pages). ``num_segments`` and
``peak_segments`` count classic segments only, as PyTorch's ``segment.*`` stats do: an
expandable segment is not counted (Note [Expandable segments] in ``engine.expandable``), so a
replay under ``expandable_segments:True`` shows 0 segments for the pools it serves.

Not reproduced, and said in ``notes`` where it applies: config changes during the recording
(the snapshot holds the last config); garbage-collection ages of blocks cached before the trace
started (they start equal); device calls the recorded device refused with memory to spare (a
failed call, memory another process held for a while); a request that failed when recorded
but fits in the replay is freed at once (the recorded program went on without it); where a
trace without our keys (PyTorch's) leaves an expandable segment's base to be inferred. Under
the recorded config on its own device a replay checks its reserved bytes and failures against
the recording event by event and says where it leaves it, and why (``whatif.departure``). A
PyTorch trace lists no ``empty_cache()`` calls: they are inferred
(``program._infer_empty_cache``) and ``inferred_empty_cache`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from jupyter_gpumem.data.devices import device_trace, snapshot_device
from jupyter_gpumem.data.replay import segment_origin
from jupyter_gpumem.data.sizes import SMALL_BUFFER
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.devices.simulated import SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.blocks import segment_size_for
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.oom import OutOfMemoryError
from jupyter_gpumem.render.replay_table import device_words
from jupyter_gpumem.whatif.departure import departure
from jupyter_gpumem.whatif.program import (
    OP_EMPTY_CACHE,
    OP_FREE,
    OP_MALLOC,
    OP_PROBE,
    UNLIMITED,
    Program,
    ReplayLimitError,
    build_program,
    extension_info,
)
from jupyter_gpumem.whatif.rebuild import (
    Plan,
    absorbed_blocks,
    cached_before,
    inferred_bases,
    plan,
    rebuild,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import SegmentInfo, Snapshot

__all__ = ["UNLIMITED", "Prepared", "ReplayResult", "prepare", "replay"]

Int64s = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class ReplayResult:
    """What the allocator did when a trace was replayed under ``config``.

    Arrays have one entry per trace event: the state after that event. ``fragmentation`` is
    reserved minus allocated bytes (cached, not handed out); ``fragmentation_ratio`` is
    1 - allocated / reserved.
    """

    config: AllocatorConfig
    capacity: int  # bytes of the simulated device
    outside: int  # bytes of it held outside the allocator (another process)
    events: int
    peak_reserved: int
    peak_allocated: int
    num_segments: int  # at the end
    peak_segments: int
    num_alloc_retries: int
    num_ooms: int
    first_oom: int | None  # index of the first event whose request failed
    reserved: Int64s = field(repr=False)
    allocated: Int64s = field(repr=False)
    start_reserved: int = 0  # reserved bytes when the trace starts
    start_allocated: int = 0
    empty_cache_calls: int = 0
    inferred_empty_cache: bool = False
    unmatched_frees: int = 0  # frees of blocks the trace never allocated
    core: str = "C"
    notes: tuple[str, ...] = ()

    @property
    def fragmentation(self) -> Int64s:
        """Reserved minus allocated bytes after each event."""
        return self.reserved - self.allocated

    @property
    def fragmentation_ratio(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """1 - allocated / reserved after each event (0 where nothing is reserved)."""
        reserved = self.reserved.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = 1.0 - self.allocated / reserved
        return np.where(reserved > 0, ratio, 0.0)

    @property
    def fits(self) -> bool:
        """Whether every request succeeded."""
        return self.num_ooms == 0

    def text(self) -> str:
        """What the replay found, in words, then its notes."""
        device = device_words(None if self.capacity >= UNLIMITED else self.capacity,
                              self.outside) or " on an unlimited device"
        if self.fits:
            verdict = "fits"
        else:
            errors = "error" if self.num_ooms == 1 else "errors"
            verdict = (f"{self.num_ooms} out-of-memory {errors}, the first at event "
                       f"{self.first_oom}")
        retries = "retry" if self.num_alloc_retries == 1 else "retries"
        segments = "segment" if self.num_segments == 1 else "segments"
        lines = [f"gpumem replay of {self.events} events under "
                 f"{self.config.as_text() or 'defaults'},{device}: {verdict}",
                 f"  peak reserved {format_bytes(self.peak_reserved)}, peak allocated "
                 f"{format_bytes(self.peak_allocated)}; {self.num_segments} {segments} at the end "
                 f"(peak {self.peak_segments}); {self.num_alloc_retries} {retries}"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())


@dataclass
class Prepared:
    """A trace read once, ready to ``run`` under any number of configs."""

    program: Program
    recorded: AllocatorConfig  # the config the trace was recorded under (or taken as)
    capacity: int
    notes: list[str]
    own_device: bool = True  # replayed on the device the trace says (no capacity given)
    source: str | None = None  # the file the trace was read from, for errors to name

    def run(self, config: AllocatorConfig | str | dict[str, Any] | None = None, *,
            memory_fraction: float | None = None) -> ReplayResult:
        """The replay under ``config`` (default: the recorded one). Under the recorded config
        on its own device, a replay that leaves the recording says where and why
        (``whatif.departure``)."""
        chosen = as_config(config) if config is not None else self.recorded
        if memory_fraction is not None:
            chosen = chosen.with_values(per_process_memory_fraction=memory_fraction)
        with _naming(self.source):  # a start layout the policy cannot carve
            result = run(self.program, chosen, self.capacity, list(self.notes),
                         outside=self.program.outside)
        course = self.program.course
        if course is None or chosen != self.recorded or not self.own_device:
            return result
        gc_ages = (bool(chosen.garbage_collection_threshold)
                   and cached_before(self.program.initial))
        note = departure(course, result.reserved, result.first_oom, result.num_ooms,
                         result.num_alloc_retries, gc_ages=gc_ages)
        return result if note is None else replace(result, notes=(*result.notes, note))


@contextmanager
def _naming(source: str | os.PathLike[str] | None) -> Iterator[None]:
    """A ValueError about what a file holds, as the ``SnapshotFileError`` naming ``source``."""
    if source is None:
        yield
        return
    from jupyter_gpumem.data.files import SnapshotFileError

    try:
        yield
    except SnapshotFileError:
        raise
    except ValueError as exc:
        raise SnapshotFileError(source, str(exc)) from None


def replay(trace_or_snapshot: Snapshot | str | os.PathLike[str],
           config: AllocatorConfig | str | dict[str, Any] | None = None,
           capacity: int | None = None, *, device: int | None = None,
           memory_fraction: float | None = None) -> ReplayResult:
    """Replay a recorded trace under ``config`` (default: the recorded one).

    ``trace_or_snapshot``: a snapshot dict (ours, or PyTorch's ``_snapshot()``) or a file path.
    ``config``: an ``AllocatorConfig``, a ``"key:value,..."`` string or a dict of its fields.
    ``capacity``: the device's bytes (default: what the recorded allocator could use, Note
    [The replayed device's size] in ``whatif.program``).
    ``memory_fraction``: sets ``per_process_memory_fraction`` of the config.
    ``device``: which device of the snapshot (``data.devices.snapshot_device``).
    """
    chosen = as_config(config) if config is not None else None
    assumed = chosen if chosen is not None or memory_fraction is None else AllocatorConfig()
    if assumed is not None and memory_fraction is not None:
        assumed = assumed.with_values(per_process_memory_fraction=memory_fraction)
    prepared = prepare(trace_or_snapshot, capacity, device=device, assumed=assumed)
    return prepared.run(chosen, memory_fraction=memory_fraction)


def prepare(trace_or_snapshot: Snapshot | str | os.PathLike[str], capacity: int | None = None,
            *, device: int | None = None, assumed: AllocatorConfig | None = None) -> Prepared:
    """Read a trace once (as ``replay`` does) for replays under several configs.

    ``assumed``: the config taken as the recorded one when the trace does not say its own
    (default: the defaults). A trace read from a file that the replay cannot rebuild raises the
    ``SnapshotFileError`` naming the file and the field."""
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                 or capacity <= 0):
        raise ValueError(f"capacity must be a positive int (bytes), got {capacity!r}")
    source = trace_or_snapshot if isinstance(trace_or_snapshot, (str, os.PathLike)) else None
    with _naming(source):
        return _prepare(trace_or_snapshot, capacity, device, assumed)


def _prepare(trace_or_snapshot: Snapshot | str | os.PathLike[str], capacity: int | None,
             device: int | None, assumed: AllocatorConfig | None) -> Prepared:
    snapshot, checked = _load(trace_or_snapshot)
    device = snapshot_device(snapshot, device)
    info = extension_info(snapshot, device)
    notes: list[str] = []
    recorded = _recorded_config(snapshot, info)
    if recorded is None:
        notes.append("the trace does not say its allocator config: the config replayed is "
                     "taken as the recorded one" + (" (the defaults)" if assumed is None else ""))
        recorded = assumed or AllocatorConfig()
    fraction = info.get("memory_fraction")  # PyTorch's, read with the trace (TorchSource)
    if (isinstance(fraction, float) and 0.0 < fraction < 1.0
            and recorded.per_process_memory_fraction is None):
        recorded = recorded.with_values(per_process_memory_fraction=fraction)
        notes.append(f"the memory fraction is the one PyTorch had when the trace was read "
                     f"({fraction:g})")
    try:
        program = build_program(snapshot, device, recorded, capacity)
    except ReplayLimitError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError):
        if checked:
            raise
        # a dict is checked only when it cannot be read: the check names the bad field (or
        # fills the keys older PyTorch versions leave out), and costs seconds a million events
        from jupyter_gpumem.data.schema import check_snapshot

        snapshot = check_snapshot(snapshot)
        program = build_program(snapshot, device, recorded, capacity)
    _check_rebuildable(snapshot, device, program)
    notes.extend(program.notes)
    inferred = inferred_bases(program.initial)
    if inferred:
        notes.append(f"the trace does not say where {inferred} expandable segment(s) at its "
                     "start begin (PyTorch's does not): each is taken to begin at the lowest "
                     "address the trace shows in it, and unmapped pages before that are not "
                     "rebuilt")
    absorbed = absorbed_blocks(program.initial)
    if absorbed:
        notes.append(f"{absorbed} free block(s) of at most 1 MiB at the start of large-pool "
                     "expandable ranges at the trace's start are held with the live block "
                     "after them (nothing before them to split them from)")
    if info.get("history_dropped"):
        notes.append(f"the recording dropped its first {info['history_dropped']} events: the "
                     "replay starts from the layout after them")
    source = os.fspath(trace_or_snapshot) if isinstance(trace_or_snapshot,
                                                        (str, os.PathLike)) else None
    return Prepared(program, recorded, program.capacity, notes, own_device=capacity is None,
                    source=source)


def _check_rebuildable(snapshot: Snapshot, device: int, program: Program) -> None:
    """A ValueError naming the field, before any replay runs, if the replay's device would have
    no room or a segment of the start layout is of a size the policy never makes."""
    if program.capacity <= 0:
        ooms = [i for i, e in enumerate(device_trace(snapshot, device))
                if e["action"] == "oom" and e.get("device_free") == 0]
        where = f"device_traces[{device}][{ooms[0]}].device_free" if ooms else "device_free"
        raise ValueError(f"{where}: the allocator could use 0 bytes of the device (its reserved "
                         "bytes plus what the device had free): nothing to replay on; pass "
                         "capacity (--capacity) to replay on a device of that size")
    for seg in program.initial:
        problem = _unbuildable(seg)
        if problem:
            where = segment_origin(snapshot, device, seg["address"])
            field = ".total_size" if where.startswith("segments") else ".size"
            raise ValueError(f"{where}{field}: {problem}")


def _unbuildable(seg: SegmentInfo) -> str | None:
    """Why the start layout's rebuild (``whatif.rebuild``) cannot carve ``seg``: a size the
    policy never makes; None if it can."""
    total = seg["total_size"]
    if seg.get("is_expandable"):
        return None
    if seg["segment_type"] == "small" and total != SMALL_BUFFER:
        return (f"a small-pool segment of {total:,} bytes, which the policy never makes (only "
                f"{SMALL_BUFFER:,}): the replay cannot rebuild it")
    if seg["segment_type"] != "small" and segment_size_for(total) != total:
        return (f"a large-pool segment of {total:,} bytes, which the policy never makes "
                "(expandable segments?): the replay cannot rebuild it")
    return None


def run(program: Program, config: AllocatorConfig, capacity: int,
        notes: list[str] | None = None, *, outside: int = 0, native: bool | None = None,
        python_loop: bool = False) -> ReplayResult:
    """Run ``program`` under ``config`` on a fresh simulated device of ``capacity`` bytes.

    ``native`` picks the core as ``CachingAllocator`` does; ``python_loop`` runs the reference
    loop in Python even on the C core (tests compare the two)."""
    held = sum(seg["total_size"] for seg in program.initial)
    if held > capacity - outside:
        raise ValueError(f"replay: the segments at the trace's start hold {format_bytes(held)}, "
                         f"more than the {format_bytes(capacity - outside)} the replayed "
                         "device leaves the allocator (a larger capacity=)")
    device, allocator = _fresh(capacity, outside, native)
    all_notes = list(notes or [])
    try:
        start = rebuild(allocator, device, _plan(program, capacity, True))
    except ValueError as exc:
        if not any(seg.get("is_expandable") for seg in program.initial):
            raise
        # an inferred base (or a pool guessed in a PyTorch trace), or a device smaller than
        # the recorded one, asks for holes the policy cannot make here: no holes, then
        device, allocator = _fresh(capacity, outside, native)
        start = rebuild(allocator, device, _plan(program, capacity, False))
        all_notes.append("the unmapped stretches of the expandable segments at the trace's "
                         f"start cannot be rebuilt ({exc}): their mapped ranges are laid side "
                         "by side")
    init_recorded, init_replayed = start.recorded, start.replayed
    allocator.reset_peak_memory_stats()
    allocator.reset_accumulated_memory_stats()
    start_reserved = allocator.memory_reserved()
    start_allocated = allocator.memory_allocated()
    allocator.set_config(config)
    n = len(program)
    reserved = np.empty(n, np.int64)
    allocated = np.empty(n, np.int64)
    args = (program.ops, program.addrs, program.sizes, program.streams, init_recorded,
            init_replayed, OutOfMemoryError, reserved, allocated)
    if allocator.native and not python_loop:
        first, unmatched = allocator.native_core.replay(*args)
    else:
        first, unmatched = _replay_loop(allocator, *args)
    if program.empty_cache_at_end:
        allocator.empty_cache()
    st = allocator.stats
    if unmatched:
        all_notes.append(f"{unmatched} free(s) of blocks the trace never allocated were skipped")
    return ReplayResult(
        config=config,
        capacity=capacity,
        outside=outside,
        events=n,
        peak_reserved=st.reserved_bytes.all.peak,
        peak_allocated=st.allocated_bytes.all.peak,
        num_segments=st.segment.all.current,
        peak_segments=st.segment.all.peak,
        num_alloc_retries=st.num_alloc_retries,
        num_ooms=st.num_ooms,
        first_oom=None if first < 0 else first,
        reserved=reserved,
        allocated=allocated,
        start_reserved=start_reserved,
        start_allocated=start_allocated,
        empty_cache_calls=program.empty_cache_calls,
        inferred_empty_cache=program.inferred_empty_cache,
        unmatched_frees=unmatched,
        core="C" if allocator.native and not python_loop else "Python",
        notes=tuple(all_notes),
    )


def _plan(program: Program, capacity: int, holes: bool) -> Plan:
    """The program's start layout planned for a device of ``capacity`` bytes, made once for
    all the replays of a program (``suggest_config`` runs dozens)."""
    key = (capacity, holes)
    if key not in program.plans:
        program.plans[key] = plan(program.initial, capacity, holes=holes)
    return program.plans[key]


def _fresh(capacity: int, outside: int, native: bool | None
           ) -> tuple[SimulatedDevice, CachingAllocator]:
    """A simulated device of ``capacity`` bytes, ``outside`` of them held by another process
    (Note [The replayed device's size]), and an allocator on it."""
    device = SimulatedDevice(capacity, name="replay")
    if outside:
        device.hold_for_process(1, outside, "outside the allocator")
    return device, CachingAllocator(device, native=native)


def _replay_loop(allocator: CachingAllocator, ops: Any, addrs: Any, sizes: Any, streams: Any,
                 init_recorded: Int64s, init_replayed: Int64s, oom_type: type[BaseException],
                 reserved: Int64s, allocated: Int64s) -> tuple[int, int]:
    """The reference loop: the C core's ``replay`` (csrc/replay.c) does exactly this."""
    live: dict[int, int] = dict(zip(init_recorded.tolist(), init_replayed.tolist(), strict=True))
    first = -1
    unmatched = 0
    malloc, free = allocator.malloc, allocator.free
    for i, (op, addr, size, stream) in enumerate(zip(ops.tolist(), addrs.tolist(),
                                                     sizes.tolist(), streams.tolist(),
                                                     strict=True)):
        if op & OP_EMPTY_CACHE:
            allocator.empty_cache()
        kind = op & 7
        if kind in (OP_MALLOC, OP_PROBE):
            try:
                ptr = malloc(size, stream)
            except oom_type:
                ptr = 0
                if size > 0 and first < 0:
                    first = i
            if kind == OP_MALLOC:
                live[addr] = ptr
            elif ptr:
                free(ptr)
        elif kind == OP_FREE:
            ptr = live.pop(addr, -1)
            if ptr < 0:
                unmatched += 1
            elif ptr:
                free(ptr)
        reserved[i] = allocator.memory_reserved()
        allocated[i] = allocator.memory_allocated()
    return first, unmatched


def _load(source: Snapshot | str | os.PathLike[str]) -> tuple[Snapshot, bool]:
    """The snapshot, and whether it was checked (files are, as they load)."""
    if isinstance(source, (str, os.PathLike)):
        from jupyter_gpumem.data.files import load_snapshot

        return load_snapshot(source), True
    if isinstance(source, dict) and isinstance(source.get("segments"), list):
        return source, False
    if isinstance(source, (dict, list)):
        from jupyter_gpumem.data.schema import check_snapshot

        return check_snapshot(source), True
    raise TypeError(f"replay needs a snapshot dict or a file path, got {type(source).__name__}")


def as_config(config: AllocatorConfig | str | dict[str, Any]) -> AllocatorConfig:
    """``config`` as an ``AllocatorConfig``: one already, PyTorch's ``key:value,...`` text (or
    ``"defaults"``, as ``%gpumem replay --config`` takes it), or a dict of its fields."""
    if isinstance(config, AllocatorConfig):
        return config
    if isinstance(config, str):
        if config.strip().lower() in ("defaults", "default"):
            return AllocatorConfig()
        return AllocatorConfig.parse(config)
    if isinstance(config, dict):
        return AllocatorConfig().with_values(**config)
    raise TypeError("config must be an AllocatorConfig, a 'key:value,...' string or a dict, "
                    f"got {type(config).__name__}")


def _recorded_config(snapshot: Snapshot, info: dict[str, Any]) -> AllocatorConfig | None:
    """The config the trace was recorded under, when it says: ours does; PyTorch's
    ``allocator_settings`` (recent versions, not the memory fraction) give its keys."""
    text = info.get("config")
    if isinstance(text, str):
        try:
            return AllocatorConfig.parse(text) if text else AllocatorConfig()
        except (ValueError, TypeError) as exc:
            raise ValueError(f"jupyter_gpumem.config: {exc}") from None
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, dict):
        return _pytorch_settings(settings)
    return None


def _pytorch_settings(settings: dict[str, Any]) -> AllocatorConfig | None:
    values: dict[str, Any] = {}
    ms = settings.get("max_split_size")
    if isinstance(ms, int) and 20 << 20 < ms < 1 << 62:
        values["max_split_size_mb"] = ms >> 20
    gc = settings.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and 0 < gc < 1:
        values["garbage_collection_threshold"] = float(gc)
    div = settings.get("roundup_power2_divisions")
    if isinstance(div, dict):  # PyTorch 2.11: {"1": d, "2": d, ...} by interval (MiB)
        div = list(div.values())
    if isinstance(div, list):  # one value per power of two: one value if they agree
        nonzero = {d for d in div if isinstance(d, int) and d > 0}
        if len(nonzero) == 1:
            values["roundup_power2_divisions"] = nonzero.pop()
        elif nonzero:
            return None  # per-size divisions: not a config we can replay
    elif isinstance(div, int) and div > 1:
        values["roundup_power2_divisions"] = div
    try:
        return AllocatorConfig(**values)
    except (TypeError, ValueError):
        return None
