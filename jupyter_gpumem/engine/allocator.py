"""The caching allocator: PyTorch's CUDA caching allocator policy, over any Device.

Two cores implement the policy below with one interface: ``_pycore.PyCore``, the readable
reference, and ``_native.Core``, its translation to C, used when built (it costs a fraction of
the Python core per malloc). CachingAllocator wraps either one and adds what is not on the hot
path: configuration, history with Python stacks, watermarks, snapshots and OOM reports.

The policy, as PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` states it:

1. Rounding. A request is rounded up to a multiple of 512 B (at least 512 B). With
   ``roundup_power2_divisions = N > 1``, a request above 512·N B is rounded up to the next of N
   equal steps between the two powers of two around it.
2. Pools. A rounded size of at most 1 MiB is served from the small pool, anything larger from the
   large pool. Free blocks are kept per (pool, stream), ordered by (size, address).
3. Segments. A miss asks the device for a segment: 2 MiB for the small pool, 20 MiB for a large
   request under 10 MiB, otherwise the request rounded up to a multiple of 2 MiB.
4. Best fit. The smallest cached block of the same pool and stream that fits; among equal sizes,
   the lowest address.
5. Split. A block is split when the remainder is >= 512 B (small pool), or > 1 MiB and the
   request is below ``max_split_size`` (large pool). Freed blocks merge with free neighbours.
6. Oversize. Blocks of at least ``max_split_size`` are never split, never handed to a request
   below ``max_split_size``, and handed to a larger request only if it is less than 20 MiB
   smaller than the block.
7. The retry ladder on a miss: (garbage collection) → a new segment → release cached oversize
   blocks and retry → release every cached whole segment and retry (counted in
   ``num_alloc_retries``) → out of memory (counted in ``num_ooms``).
8. Limits. ``per_process_memory_fraction`` caps reserved bytes at fraction × device total: a
   segment that would pass the cap fails as if the device were full. With a cap and a
   ``garbage_collection_threshold``, before asking for a segment while reserved bytes exceed
   threshold × cap, whole cached large segments at least as old as the average are released.
9. ``empty_cache()`` releases every cached block that is a whole segment.

Note [No pending frees]: CuPy has no ``record_stream``, so a freed block goes back to the cache
at once: ``free_requested`` and ``free_completed`` happen together, no block is ever
"active_pending_free", and PyTorch's ``active*`` counters equal ``allocation`` and
``allocated_bytes``. We keep only the latter and report them under both names.

Note [Oversize blocks after a runtime change]: with one ``max_split_size`` for the whole run
(``max_split_size_mb`` must be above 20), a split never leaves a cached block of
``max_split_size`` or more behind, so every oversize cached block is a whole segment. Lowering
the limit at runtime breaks that: a cached piece of a segment split under the old limit can now
be oversize. Such a piece counts as oversize for reuse (never split again, given only to a
request less than 20 MiB smaller), but releasing returns only whole segments to the device:
"release cached oversize blocks" (rule 7) considers only cached blocks that are whole segments,
as ``empty_cache`` does, and skips the pieces. A piece goes back to the device once its segment's
live blocks are freed and it merges into a whole segment again. Raising the limit needs nothing:
oversize blocks stay whole segments.

Note [Device calls come last]: the device's ``free`` is Python code (CuPy's, or a test's) and
can run anything, a garbage collection included, whose finalizers may call ``malloc`` or
``free`` on this allocator in the same thread (the core's lock is re-entrant). So no release
loop walks the pools across a device call: it first picks the segments to release and takes
them off the books (pools, segment list, counters), then hands them to the device one by one,
holding only their addresses. A re-entrant call meanwhile sees a consistent allocator that no
longer has those segments. A segment merged whole by such a call is left for the next release.
If a device call (or the history recorder) raises, the remaining segments are still given back
and the first error is raised at the end. The device's ``malloc`` needs no such care: nothing
is held across it, and the new segment enters the books only after it returns.

Note [Arguments of the cores]: both cores read a size, an address or a stream the same way:
anything ``operator.index`` accepts (int, NumPy integers), never a bool (TypeError), so a
refused call changes nothing. A stream must fit in a signed 64-bit integer (ValueError). A
negative size is a ValueError; a request above ``MAX_ALLOC_SIZE`` (4 EiB, no device holds it)
is out of memory at once (counted in ``num_ooms``, recorded as an oom event) without running the
retry ladder; an address no live block has, at any size, is a ValueError. ``AllocatorConfig``
bounds every knob, so the cores' arithmetic never overflows 64 bits; for devices, reserved bytes
and counters near 2**63, see Note [Sizes near 2**63] in ``engine/stats``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.codes import NO_CELL
from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES, round_size
from jupyter_gpumem.engine.blocks import NO_LIMIT, segment_size_for
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.device import Device, DeviceOutOfMemory, vmm_of
from jupyter_gpumem.engine.expandable import page_size
from jupyter_gpumem.engine.history import (
    FrameTable,
    HistoryView,
    classify_code,
    trace_columns,
)
from jupyter_gpumem.engine.invariants import check_state
from jupyter_gpumem.engine.oom import OomReport, OutOfMemoryError
from jupyter_gpumem.engine.pycore import PyCore
from jupyter_gpumem.engine.state import AllocatorState, BlockRow, SegmentRow, state_from_tuples
from jupyter_gpumem.engine.stats import AllocatorStats, Watermark, flat_stats

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import BlockInfo, Frame, SegmentInfo, Snapshot
    from jupyter_gpumem.engine import _native

__all__ = ["CachingAllocator", "OomReport", "OutOfMemoryError", "native_core_available",
           "round_size", "segment_size_for"]


#: Picks the core when the constructor does not: "auto" (C if built), "c" or "python".
CORE_ENV = "JUPYTER_GPUMEM_CORE"


def _native_core() -> Any:
    try:
        from jupyter_gpumem.engine import _native
    except ImportError:
        return None
    return _native.Core


def native_core_available() -> bool:
    """Whether the C core is built and importable here."""
    return _native_core() is not None


class CachingAllocator:
    """PyTorch's caching-allocator policy over one device. Thread-safe.

    ``malloc`` and ``free`` go straight to the core (C when built, else Python); everything else
    reads or resets state. ``native=False`` forces the Python core, ``native=True`` requires C;
    ``None`` follows ``JUPYTER_GPUMEM_CORE`` (auto, c or python), by default C when built.
    """

    def __init__(self, device: Device, config: AllocatorConfig | None = None, *,
                 debug: bool = False,
                 oom_error: Callable[[OomReport], BaseException] = OutOfMemoryError,
                 native: bool | None = None) -> None:
        self.device = device
        #: Builds the exception raised when the retry ladder fails; the CuPy binding passes a
        #: subclass of CuPy's own OutOfMemoryError.
        self.oom_error = oom_error
        if native is None:
            choice = os.environ.get(CORE_ENV, "auto").lower()
            if choice not in ("auto", "c", "python"):
                raise ValueError(f"{CORE_ENV} must be auto, c or python, got {choice!r}")
            native = {"auto": None, "c": True, "python": False}[choice]
        core_type: Any = _native_core() if native is not False else None
        if native and core_type is None:
            raise ImportError("the C core of jupyter_gpumem (_native) is not built here")
        if core_type is None:
            core_type = PyCore
        self._core = core_type(device.malloc, device.free, DeviceOutOfMemory, self._oom)
        self.native = core_type is not PyCore
        self._debug = debug
        self._lock = threading.RLock()  # guards history and watermarks, not the core
        self._frames = FrameTable(self._core.stack)
        self._watermarks: list[Watermark] = []
        self._current_cell = NO_CELL
        # num_alloc_retries when the kept events began (None: not known). A retry that
        # releases nothing leaves no event: a snapshot says how many the trace saw
        # ("alloc_retries"), so that a replay can tell when it retried otherwise.
        self._retries_base: int | None = None
        self._config = AllocatorConfig()
        self.supports_expandable = self._attach_vmm(device)
        if not debug:
            # The hot path: no Python frame of ours between the caller and the core.
            self.malloc = self._core.malloc  # type: ignore[method-assign]
            self.free = self._core.free  # type: ignore[method-assign]
        self.set_config(config if config is not None else AllocatorConfig())

    # -- the hot path (replaced by the core's own methods unless debugging) --------------------

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """A device address of at least ``nbytes`` usable bytes on ``stream`` (0 for 0 bytes)."""
        ptr: int = self._core.malloc(nbytes, stream)
        self.check_invariants()
        return ptr

    def free(self, ptr: int) -> None:
        """Give back a block from ``malloc``; freeing 0 does nothing."""
        self._core.free(ptr)
        self.check_invariants()

    # -- configuration -------------------------------------------------------------------------

    @property
    def config(self) -> AllocatorConfig:
        return self._config

    def _attach_vmm(self, device: Device) -> bool:
        """Hand the device's virtual-memory operations to the core; whether it has them, with a
        granule that divides both pools' pages (Note [Expandable segments])."""
        vmm = vmm_of(device)
        if vmm is None:
            return False
        granule = vmm.vmm_granularity()
        if granule <= 0 or page_size(True) % granule or page_size(False) % granule:
            return False
        self._core.set_vmm(vmm.reserve, vmm.release, vmm.map, vmm.unmap,
                           device.mem_get_info()[1])
        return True

    def set_config(self, config: AllocatorConfig) -> None:
        """Apply a new configuration; counters of oversize blocks follow the new threshold.

        ``expandable_segments`` applies to segments made from now on; segments made before keep
        their kind (Note [Expandable segments] in ``engine/expandable``). A device without
        virtual-memory operations refuses it with ValueError.
        """
        if not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
        expandable = bool(config.expandable_segments)
        if expandable and not self.supports_expandable:
            raise ValueError(
                f"expandable_segments:True needs a device with virtual memory management "
                f"(reserve/map/unmap with a granule dividing 2 MiB); {self.device.name} has "
                "none, as with a pluggable allocator")
        fraction = config.per_process_memory_fraction
        # As PyTorch's setMemoryFraction: a fraction of 1 sets no cap (so no garbage collection
        # either), and the cap is rounded, not truncated.
        cap = -1 if fraction is None or fraction >= 1.0 else round(
            fraction * self.device.mem_get_info()[1])
        self._core.configure(config.max_split_size or NO_LIMIT,
                             config.roundup_power2_divisions or 0, cap,
                             config.garbage_collection_threshold or 0.0, expandable)
        self._config = config

    def set_memory_fraction(self, fraction: float | None) -> None:
        """Cap reserved bytes at ``fraction`` × device total (None removes the cap)."""
        self.set_config(self._config.with_values(per_process_memory_fraction=fraction))

    @property
    def cap(self) -> int | None:
        """The reserved-bytes cap from ``per_process_memory_fraction``, or None."""
        fraction = self._config.per_process_memory_fraction
        if fraction is None or fraction >= 1.0:
            return None
        return round(fraction * self.device.mem_get_info()[1])

    # -- out of memory -------------------------------------------------------------------------

    def _oom(self, nbytes: int, size: int, segment_size: int, stream: int) -> BaseException:
        """Called by the core, with its lock held, when the whole retry ladder failed."""
        free, total = self.device.mem_get_info()
        processes = getattr(self.device, "processes", None)
        allocated = self._core.allocated()
        reserved = self._core.reserved()
        report = OomReport(
            requested=nbytes,
            rounded=size,
            segment_size=segment_size,
            stream=stream,
            device=self.device.index,
            device_name=self.device.name,
            device_free=free,
            device_total=total,
            allocated=allocated,
            reserved=reserved,
            largest_free_block=self._core.largest_free_block(),
            free_cached=reserved - allocated,
            cap=self.cap,
            fraction=self._config.per_process_memory_fraction,
            max_split_size=self._config.max_split_size,
            processes=processes() if processes is not None else [],
        )
        return self.oom_error(report)

    # -- cache control -------------------------------------------------------------------------

    def empty_cache(self) -> int:
        """Release every cached block that is a whole segment; return the bytes released."""
        released: int = self._core.empty_cache()
        return released

    # -- history -------------------------------------------------------------------------------

    def record_history(self, enabled: bool = True, *, stacks: bool = True,
                       max_entries: int = 100_000, clear: bool = False) -> None:
        """Start (or stop, with ``enabled=False``) keeping a ring buffer of trace entries.

        ``stacks`` records the Python stack of every event; ``max_entries=0`` keeps no events
        but still records the stacks of live blocks (PyTorch's ``enabled="state"``). Calling it
        again while recording keeps the events so far unless ``clear`` is true.
        """
        if (not isinstance(max_entries, int) or isinstance(max_entries, bool)
                or not 0 <= max_entries <= MAX_HISTORY_ENTRIES):
            raise ValueError(f"max_entries must be an int in [0, {MAX_HISTORY_ENTRIES}], got "
                             f"{max_entries!r}")
        with self._lock:
            if not enabled:
                self._core.history_stop()
                self._frames.clear()  # its cached frames hold code objects
                return
            if clear:
                self._core.history_clear()
            was_recording = self.recording
            clock = self.device.clock
            self._core.history_configure(
                max_entries, bool(stacks), None if clock is time.perf_counter_ns else clock,
                classify_code, self._device_free)
            info = self._core.history_info()
            if info[3] + info[4] == 0:  # no event kept or dropped: the count starts now
                self._retries_base = self.stats.num_alloc_retries
            elif not was_recording:
                self._retries_base = None  # events of an earlier recording are kept

    def _device_free(self) -> int:
        return self.device.mem_get_info()[0]

    @property
    def recording(self) -> bool:
        return bool(self._core.history_info()[0])

    @property
    def history(self) -> HistoryView | None:
        """What is being recorded (a fresh view on each access), or None when not recording."""
        if not self.recording:
            return None
        return HistoryView(self._core, self._frames)

    @property
    def current_cell(self) -> int:
        """The notebook cell running now, tagged onto history events; set by the extension."""
        return self._current_cell

    @current_cell.setter
    def current_cell(self, cell: int) -> None:
        self._current_cell = cell
        self._core.set_cell(cell)

    # -- reading state -------------------------------------------------------------------------

    @property
    def stats(self) -> AllocatorStats:
        """A copy of every counter."""
        return AllocatorStats.from_tuple(self._core.stats())

    def memory_stats(self) -> dict[str, int]:
        """PyTorch's flat ``memory_stats()`` dict for this device. The accumulated counters
        (``*.allocated``, ``*.freed``) stop at 2**63 - 1 (Note [Sizes near 2**63] in
        ``engine/stats``)."""
        ms = self._config.max_split_size
        return flat_stats(self._core.stats(), -1 if ms is None else ms)

    def memory_allocated(self) -> int:
        allocated: int = self._core.allocated()
        return allocated

    def memory_reserved(self) -> int:
        reserved: int = self._core.reserved()
        return reserved

    def reset_peak_memory_stats(self) -> None:
        self._core.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        with self._lock:
            self._core.reset_accumulated()
            info = self._core.history_info()
            if info[0]:  # recording: retries since the trace began are known only if none yet
                self._retries_base = 0 if info[3] + info[4] == 0 else None

    def start_watermark(self, name: str) -> Watermark:
        """Track the peak of allocated and reserved bytes from now, beside the user's peaks."""
        with self._lock:
            self._fold_marks()
            w = Watermark(name, self.memory_allocated(), self.memory_reserved(),
                          refresh=self._fold_marks)
            self._watermarks.append(w)
            return w

    def stop_watermark(self, watermark: Watermark) -> Watermark:
        """Stop a watermark; its peaks are final."""
        with self._lock:
            self._fold_marks()
            watermark.stop()
            if watermark in self._watermarks:
                self._watermarks.remove(watermark)
            return watermark

    def _fold_marks(self) -> None:
        # The core keeps one peak since the last take_mark; every running watermark gets it.
        with self._lock:
            peak_allocated, peak_reserved = self._core.take_mark()
            for w in self._watermarks:
                w.observe(peak_allocated, peak_reserved)

    def state(self) -> AllocatorState:
        """Every segment and block (live and cached), in address order, and every counter,
        read in one moment under the core's lock. Unlike ``snapshot()`` it logs no history
        event and looks up no frames: blocks name their stacks by id only."""
        segments, blocks, stats = self._core.state()
        return state_from_tuples(segments, blocks, stats)

    def live_block_rows(self) -> list[tuple[int, int, int, int]]:
        """``(address, size, requested_size, stack_id)`` of every allocated block, in no
        order: ``state()``'s blocks without naming or sorting them (the per-cell ledger lists
        them after every cell)."""
        _segments, blocks, _stats = self._core.state()
        return [(addr, size, requested, stack)
                for addr, size, requested, _stream, _small, _segment, allocated, stack in blocks
                if allocated]

    def owns(self, ptr: int) -> bool:
        """Whether ``ptr`` is a live block of this allocator."""
        owned: bool = self._core.owns(ptr)
        return owned

    def block_of(self, ptr: int) -> tuple[int, int] | None:
        """``(address, size)`` of the live block holding ``ptr``, if there is one."""
        for block in self.state().blocks:
            if block.allocated and block.address <= ptr < block.address + block.size:
                return block.address, block.size
        return None

    def largest_free_block(self) -> int:
        largest: int = self._core.largest_free_block()
        return largest

    def snapshot(self, *, mark: bool = True) -> Snapshot:
        """Segments with their blocks, and the recorded history, in PyTorch's schema.

        While history is recorded, ``mark`` (the default) first logs a "snapshot" event, as
        PyTorch's ``_snapshot()`` does, so that the user's own snapshots show in the trace.
        ``mark=False`` reads the same moment and logs nothing: the tool's own views (the OOM
        panel, the magics, the timeline) pass it, so that looking at the history does not grow it.
        """
        from jupyter_gpumem.data.schema import SCHEMA_VERSION

        if not isinstance(mark, bool):
            raise TypeError(f"mark must be True or False, got {mark!r}")
        with self._lock:
            # One consistent moment: the core logs the snapshot event (if mark) and reads
            # segments, blocks, counters, events and the stacks they name under its own lock.
            (segment_rows, block_rows, stat_row, events, info, stacks,
             empty_cache_at) = self._core.snapshot(mark=mark)
            state = state_from_tuples(segment_rows, block_rows, stat_row)
            recording, dropped = info[0], info[3]
            ms = self._config.max_split_size
            stats = state.stats.as_flat_dict(-1 if ms is None else ms)
            table = self._frames
            table.trim(self._core.history_stats()[0])

            def frames(sid: int) -> list[Frame]:
                return table.frames(sid, stacks.get(sid))

            trace = trace_columns(events, frames) if recording else []
            segments = _segments(self.device.index, state, frames)
            retries_base = self._retries_base
        free, total = self.device.mem_get_info()
        traces: list[Any] = [[] for _ in range(self.device.index + 1)]  # TraceColumns: ours
        traces[self.device.index] = trace
        snap: Snapshot = {
            "segments": segments,
            "device_traces": traces,
            "schema": SCHEMA_VERSION,
            "jupyter_gpumem": {
                "device": self.device.index,
                "device_name": self.device.name,
                "device_total": total,
                "device_free": free,
                "config": self._config.as_text(),
                "stats": stats,
                "history_dropped": dropped if recording else 0,
                # Note [Recording empty_cache] in engine/history
                "empty_cache": list(empty_cache_at) if recording else [],
            },
        }
        if recording and not dropped and retries_base is not None:
            # retries of the ladder while the trace was recorded (whatif.departure)
            snap["jupyter_gpumem"]["alloc_retries"] = (state.stats.num_alloc_retries
                                                       - retries_base)
        return snap

    def memory_summary(self, abbreviated: bool = False) -> str:
        """PyTorch's ``memory_summary`` table for this device."""
        from jupyter_gpumem.render.summary import format_summary

        return format_summary(self.memory_stats(), self.device.index, abbreviated=abbreviated)

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError if the allocator's state contradicts itself."""
        self._core.check()
        check_state(self.state())

    # -- the CuPy binding ----------------------------------------------------------------------

    @property
    def native_core(self) -> _native.Core:
        """The C core itself, for the CuPy binding's C hooks and nothing else.

        ``runtime.binding`` hands it to ``_native.Hooks``, so that CuPy's malloc and free run
        the core straight from C with no Python frame in between. Everything else reads the
        allocator through its own methods (``state()``, ``stats``, ``snapshot()``), which work
        on both cores. TypeError when this allocator runs the Python core (``native`` False).
        """
        if not self.native:
            raise TypeError("this allocator runs the Python core; the C hooks need the C core")
        core: _native.Core = self._core
        return core

    def __repr__(self) -> str:
        core = "C" if self.native else "Python"
        return (
            f"<CachingAllocator device={self.device.index} ({core} core) "
            f"allocated={self.memory_allocated()} reserved={self.memory_reserved()}>"
        )


def _segments(device: int, state: AllocatorState,
              frames: Callable[[int], list[Frame]]) -> list[SegmentInfo]:
    """Snapshot segments from the core's rows, in address order."""
    blocks_of: dict[int, list[BlockRow]] = {seg.address: [] for seg in state.segments}
    for block in state.blocks:  # in address order, so each segment's blocks are too
        blocks_of[block.segment_address].append(block)
    out: list[SegmentInfo] = []
    for seg in state.segments:
        # Note [Expandable segments]: one snapshot segment per contiguous mapped range.
        runs: list[list[BlockRow]] = []
        for b in blocks_of[seg.address]:
            if runs and runs[-1][-1].address + runs[-1][-1].size == b.address:
                runs[-1].append(b)
            else:
                runs.append([b])
        if not seg.expandable:
            runs = [blocks_of[seg.address]]
        for run in runs:
            out.append(_segment_info(device, seg, run, frames))
    return out


def _segment_info(device: int, seg: SegmentRow, run: list[BlockRow],
                  frames: Callable[[int], list[Frame]]) -> SegmentInfo:
    infos: list[BlockInfo] = []
    allocated = requested = 0
    for b in run:
        if b.allocated:
            allocated += b.size
            requested += b.requested_size
        infos.append({
            "address": b.address,
            "size": b.size,
            "requested_size": b.requested_size,
            "state": "active_allocated" if b.allocated else "inactive",
            "frames": frames(b.stack_id) if b.allocated else [],
        })
    address = run[0].address if run else seg.address
    info: SegmentInfo = {
        "device": device,
        "address": address,
        "total_size": sum(b.size for b in run) if seg.expandable else seg.size,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": requested,
        "stream": seg.stream,
        "segment_type": "small" if seg.small else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": seg.expandable,
        # PyTorch keeps the segment's context on the block at its start only.
        "frames": frames(seg.stack_id) if address == seg.address else [],
        "blocks": infos,
    }
    if seg.expandable:  # ours: where its reserved range lies (Note [The virtual range])
        info["virtual_address"] = seg.address
        info["virtual_size"] = seg.span
    return info
