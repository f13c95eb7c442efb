"""The caching allocator: PyTorch's CUDA caching allocator policy, over any Device.

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

Note [Oversize blocks are whole segments]: ``max_split_size_mb`` must be above 20, so a split
never leaves a block of ``max_split_size`` or more behind. Releasing an oversize cached block
therefore always returns a whole segment to the device.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._blocks import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    NO_LIMIT,
    SMALL_SIZE,
    Block,
    BlockPool,
    Segment,
    round_size,
    segment_size_for,
)
from ._config import AllocatorConfig
from ._device import Device, DeviceOutOfMemory
from ._history import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_CELL,
    NO_STACK,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SNAPSHOT,
    History,
)
from ._oom import OomReport, OutOfMemoryError
from ._stats import AllocatorStats, Watermark

if TYPE_CHECKING:
    from ._schema import BlockInfo, SegmentInfo, Snapshot, TraceEntry

__all__ = ["CachingAllocator", "OomReport", "OutOfMemoryError", "round_size", "segment_size_for"]


class CachingAllocator:
    """PyTorch's caching-allocator policy over one device. Thread-safe.

    ``malloc`` and ``free`` are the hot path; everything else reads or resets state.
    """

    def __init__(self, device: Device, config: AllocatorConfig | None = None, *,
                 debug: bool = False,
                 oom_error: Callable[[OomReport], Exception] = OutOfMemoryError) -> None:
        self.device = device
        #: Builds the exception raised when the retry ladder fails; the CuPy binding passes a
        #: subclass of CuPy's own OutOfMemoryError.
        self.oom_error = oom_error
        self.stats = AllocatorStats()
        self._lock = threading.Lock()
        self._small = BlockPool(small=True)
        self._large = BlockPool(small=False)
        self._active: dict[int, Block] = {}  # address -> block handed to the user
        self._segments: dict[int, Segment] = {}  # address -> live segment
        self._reserved = 0
        self._watermarks: list[Watermark] = []
        self._history: History | None = None
        self._debug = debug
        #: The notebook cell running now; tagged onto history events. Set by the extension.
        self.current_cell = NO_CELL
        self._config = AllocatorConfig()
        self._max_split = NO_LIMIT
        self._divisions = 0
        self._cap: int | None = None
        self._gc_threshold = 0.0
        self.set_config(config if config is not None else AllocatorConfig())

    # -- configuration -------------------------------------------------------------------------

    @property
    def config(self) -> AllocatorConfig:
        return self._config

    def set_config(self, config: AllocatorConfig) -> None:
        """Apply a new configuration; counters of oversize blocks follow the new threshold."""
        if not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
        with self._lock:
            self._config = config
            self._max_split = config.max_split_size or NO_LIMIT
            self._divisions = config.roundup_power2_divisions or 0
            fraction = config.per_process_memory_fraction
            # As PyTorch's setMemoryFraction: a fraction of 1 sets no cap (so no garbage
            # collection either), and the cap is rounded, not truncated.
            self._cap = (None if fraction is None or fraction >= 1.0
                         else round(fraction * self.device.mem_get_info()[1]))
            self._gc_threshold = config.garbage_collection_threshold or 0.0
            self._recount_oversize()

    def set_memory_fraction(self, fraction: float | None) -> None:
        """Cap reserved bytes at ``fraction`` × device total (None removes the cap)."""
        self.set_config(self._config.with_values(per_process_memory_fraction=fraction))

    def _recount_oversize(self) -> None:
        ms = self._max_split
        for stat, current in (
            (self.stats.oversize_allocations,
             sum(1 for b in self._active.values() if b.size >= ms)),
            (self.stats.oversize_segments,
             sum(1 for s in self._segments.values() if s.size >= ms)),
        ):
            if current > stat.current:
                stat.increase(current - stat.current)
            elif current < stat.current:
                stat.decrease(stat.current - current)

    # -- the hot path --------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """A device address of at least ``nbytes`` usable bytes on ``stream`` (0 for 0 bytes)."""
        if nbytes <= 0:
            if nbytes == 0:
                return 0
            raise ValueError(f"cannot allocate a negative size ({nbytes} B)")
        size = round_size(nbytes, self._divisions)
        small = size <= SMALL_SIZE
        with self._lock:
            pool = self._small if small else self._large
            block = self._get_free_block(pool, size, stream)
            if block is None:
                block = self._alloc_after_miss(pool, nbytes, size, stream)
            return self._alloc_found_block(block, pool, size, nbytes)

    def free(self, ptr: int) -> None:
        """Give back a block from ``malloc``; freeing 0 does nothing."""
        if ptr == 0:
            return
        with self._lock:
            block = self._active.pop(ptr, None)
            if block is None:
                raise ValueError(
                    f"free of address {ptr:#x}, which this allocator did not hand out "
                    "or which was already freed"
                )
            st = self.stats
            small = block.small
            st.allocation.decrease(small, 1)
            st.allocated_bytes.decrease(small, block.size)
            if block.size >= self._max_split:
                st.oversize_allocations.decrease(1)
            history = self._history
            if history is not None:
                stack = self._record(FREE_REQUESTED, block.addr, block.requested, block.size,
                                     block.stream)
                self._record(FREE_COMPLETED, block.addr, block.requested, block.size,
                             block.stream, stack=stack)
            self._free_block(block)
            if self._debug:
                self._check_locked()

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self._gc_threshold and self._cap is not None:
            pool.searches += 1
        lst = pool.by_stream.get(stream)
        if not lst:
            return None
        i = bisect_left(lst, (size, 0))
        if i == len(lst):
            return None
        found_size, addr = lst[i]
        ms = self._max_split
        if size < ms:
            if found_size >= ms:
                return None  # no oversize block for a small request
        elif found_size >= size + LARGE_BUFFER:
            return None  # too much of an oversize block would go unused
        del lst[i]
        return pool.blocks.pop(addr)

    def _alloc_found_block(self, block: Block, pool: BlockPool, size: int, requested: int) -> int:
        # See Note [Stats of a split].
        st = self.stats
        small = pool.small
        remaining = block.size - size
        already_split = block.prev is not None or block.next is not None
        if (remaining >= MIN_BLOCK_SIZE) if small else (
            size < self._max_split and remaining > SMALL_SIZE
        ):
            rest = Block(block.addr + size, remaining, block.stream, small, block.segment)
            rest.prev = block
            rest.next = block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
            if already_split:
                st.inactive_split_bytes.decrease(small, size)
            else:
                st.inactive_split_bytes.increase(small, remaining)
                st.inactive_split.increase(small, 1)
        elif already_split:
            st.inactive_split_bytes.decrease(small, block.size)
            st.inactive_split.decrease(small, 1)
        block.allocated = True
        block.requested = requested
        self._active[block.addr] = block
        st.allocation.increase(small, 1)
        st.allocated_bytes.increase(small, block.size)
        st.requested_bytes.increase(small, requested)
        if block.size >= self._max_split:
            st.oversize_allocations.increase(1)
        if self._watermarks:
            allocated = st.allocated_bytes.all.current
            for w in self._watermarks:
                if allocated > w.peak_allocated:
                    w.peak_allocated = allocated
        if self._history is not None:
            block.stack = self._record(ALLOC, block.addr, requested, block.size, block.stream)
        if self._debug:
            self._check_locked()
        return block.addr

    def _free_block(self, block: Block) -> None:
        # Merge with free neighbours, then cache. Note [Stats of a split]: inactive_split counts
        # the free blocks of segments that are split, so it changes by what the merge leaves.
        pool = self._small if block.small else self._large
        net_blocks = 0
        net_bytes = 0
        prev = block.prev
        if prev is not None and not prev.allocated:
            pool.remove(prev)
            block.addr = prev.addr
            block.size += prev.size
            block.prev = prev.prev
            if prev.prev is not None:
                prev.prev.next = block
            net_blocks -= 1
            net_bytes -= prev.size
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            net_blocks -= 1
            net_bytes -= nxt.size
        block.allocated = False
        block.stack = NO_STACK
        pool.insert(block)
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_bytes += block.size
        st = self.stats
        small = block.small
        if net_blocks > 0:
            st.inactive_split.increase(small, net_blocks)
        elif net_blocks < 0:
            st.inactive_split.decrease(small, -net_blocks)
        if net_bytes > 0:
            st.inactive_split_bytes.increase(small, net_bytes)
        elif net_bytes < 0:
            st.inactive_split_bytes.decrease(small, -net_bytes)
        st.requested_bytes.decrease(small, block.requested)
        block.requested = 0

    # -- misses: the retry ladder --------------------------------------------------------------

    def _alloc_after_miss(self, pool: BlockPool, nbytes: int, size: int, stream: int) -> Block:
        if self._gc_threshold and self._cap is not None:
            self._garbage_collect()
        segment_size = segment_size_for(size)
        block = self._alloc_block(segment_size, stream, pool.small, retry=False)
        if block is None and self._release_available_cached_blocks(pool, size, stream):
            block = self._alloc_block(segment_size, stream, pool.small, retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(segment_size, stream, pool.small, retry=True)
        if block is None:
            raise self._out_of_memory(nbytes, size, segment_size, stream)
        return block

    def _alloc_block(self, size: int, stream: int, small: bool, *, retry: bool) -> Block | None:
        st = self.stats
        if retry:
            st.num_alloc_retries += 1
        if self._cap is not None and self._reserved + size > self._cap:
            return None
        try:
            addr = self.device.malloc(size, stream)
        except DeviceOutOfMemory:
            return None
        segment = Segment(addr, size, stream, small)
        self._segments[addr] = segment
        self._reserved += size
        st.num_device_alloc += 1
        st.segment.increase(small, 1)
        st.reserved_bytes.increase(small, size)
        if size >= self._max_split:
            st.oversize_segments.increase(1)
        for w in self._watermarks:
            if self._reserved > w.peak_reserved:
                w.peak_reserved = self._reserved
        if self._history is not None:
            segment.stack = self._record(SEGMENT_ALLOC, addr, size, 0, stream)
        return Block(addr, size, stream, small, segment)

    def _release_block(self, block: Block) -> None:
        """Return a cached whole-segment block to the device."""
        pool = self._small if block.small else self._large
        pool.remove(block)
        del self._segments[block.addr]
        self.device.free(block.addr)
        self._reserved -= block.size
        st = self.stats
        st.num_device_free += 1
        st.segment.decrease(block.small, 1)
        st.reserved_bytes.decrease(block.small, block.size)
        if block.size >= self._max_split:
            st.oversize_segments.decrease(1)
        if self._history is not None:
            self._record(SEGMENT_FREE, block.addr, block.size, 0, block.stream)

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        # See Note [Oversize blocks are whole segments].
        ms = self._max_split
        if ms == NO_LIMIT:
            return False
        want = max(size, ms)
        lst = pool.by_stream.get(stream, [])
        i = bisect_left(lst, (want, 0))
        if i < len(lst):
            self._release_block(pool.blocks[lst[i][1]])
            return True
        released = 0
        while released < want and lst and lst[-1][0] >= ms:
            block = pool.blocks[lst[-1][1]]
            released += block.size
            self._release_block(block)
        return released >= want

    def _release_cached_blocks(self) -> None:
        self.stats.num_sync_all_streams += 1  # PyTorch synchronizes every stream first
        for pool in (self._large, self._small):
            for block in pool.ordered():
                if block.prev is None and block.next is None:
                    self._release_block(block)

    def _garbage_collect(self) -> None:
        """Release old whole cached segments of the large pool while over the threshold."""
        assert self._cap is not None
        threshold = int(self._gc_threshold * self._cap)
        if self._reserved <= threshold:
            return
        target = self._reserved - threshold
        pool = self._large
        whole = [b for b in pool.ordered() if b.prev is None and b.next is None]
        total_age = sum(pool.searches - b.gc_base for b in whole)
        count = len(whole)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            average = total_age / count
            freed = False
            for block in pool.ordered():
                age = pool.searches - block.gc_base
                if block.prev is None and block.next is None and age >= average:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(block)

    def _out_of_memory(self, nbytes: int, size: int, segment_size: int,
                       stream: int) -> Exception:
        st = self.stats
        st.num_ooms += 1
        free, total = self.device.mem_get_info()
        if self._history is not None:
            self._record(OOM, 0, size, 0, stream, device_free=free)
        processes = getattr(self.device, "processes", None)
        allocated = st.allocated_bytes.all.current
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
            reserved=self._reserved,
            largest_free_block=max(
                (b.size for p in (self._small, self._large) for b in p.blocks.values()),
                default=0,
            ),
            free_cached=self._reserved - allocated,
            cap=self._cap,
            fraction=self._config.per_process_memory_fraction,
            max_split_size=self._config.max_split_size,
            processes=processes() if processes is not None else [],
        )
        return self.oom_error(report)

    # -- cache control -------------------------------------------------------------------------

    def empty_cache(self) -> int:
        """Release every cached block that is a whole segment; return the bytes released."""
        with self._lock:
            before = self._reserved
            self._release_cached_blocks()
            return before - self._reserved

    # -- history -------------------------------------------------------------------------------

    def record_history(self, enabled: bool = True, *, stacks: bool = True,
                       max_entries: int = 100_000, clear: bool = False) -> None:
        """Start (or stop, with ``enabled=False``) keeping a ring buffer of trace entries.

        ``stacks`` records the Python stack of every event; ``max_entries=0`` keeps no events
        but still records the stacks of live blocks (PyTorch's ``enabled="state"``).
        """
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 0:
            raise ValueError(f"max_entries must be an int >= 0, got {max_entries!r}")
        with self._lock:
            if not enabled:
                self._history = None
                return
            old = self._history
            history = History(stacks=bool(stacks), max_entries=max_entries)
            if old is not None and not clear:
                history.table = old.table
                history.events.extend(old.events)
            self._history = history

    @property
    def recording(self) -> bool:
        return self._history is not None

    def _record(self, action: int, addr: int, size: int, block_size: int, stream: int, *,
                device_free: int = 0, stack: int | None = None) -> int:
        history = self._history
        assert history is not None
        if stack is None:
            stack = history.table.capture() if history.stacks else NO_STACK
        events = history.events
        if len(events) == events.maxlen:
            history.dropped += 1
        events.append((action, addr, size, block_size, stream, self.device.clock(), stack,
                       self.current_cell, device_free))
        return stack

    # -- reading state -------------------------------------------------------------------------

    def memory_stats(self) -> dict[str, int]:
        """PyTorch's flat ``memory_stats()`` dict for this device."""
        with self._lock:
            ms = self._max_split
            return self.stats.as_flat_dict(-1 if ms == NO_LIMIT else ms)

    def memory_allocated(self) -> int:
        return self.stats.allocated_bytes.all.current

    def memory_reserved(self) -> int:
        return self._reserved

    def reset_peak_memory_stats(self) -> None:
        with self._lock:
            self.stats.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        with self._lock:
            self.stats.reset_accumulated()

    def start_watermark(self, name: str) -> Watermark:
        """Track the peak of allocated and reserved bytes from now, beside the user's peaks."""
        with self._lock:
            w = Watermark(name, self.stats.allocated_bytes.all.current, self._reserved)
            self._watermarks.append(w)
            return w

    def stop_watermark(self, watermark: Watermark) -> Watermark:
        with self._lock:
            if watermark in self._watermarks:
                self._watermarks.remove(watermark)
            return watermark

    def owns(self, ptr: int) -> bool:
        """Whether ``ptr`` is a live block of this allocator."""
        return ptr in self._active

    def block_of(self, ptr: int) -> tuple[int, int] | None:
        """``(address, size)`` of the live block holding ``ptr``, if there is one."""
        with self._lock:
            block = self._active.get(ptr)
            if block is not None:
                return block.addr, block.size
            for block in self._active.values():
                if block.addr <= ptr < block.addr + block.size:
                    return block.addr, block.size
            return None

    def largest_free_block(self) -> int:
        with self._lock:
            return max((b.size for p in (self._small, self._large) for b in p.blocks.values()),
                       default=0)

    def snapshot(self) -> Snapshot:
        """Segments with their blocks, and the recorded history, in PyTorch's schema."""
        from ._schema import SCHEMA_VERSION

        with self._lock:
            history = self._history
            if history is not None:
                self._record(SNAPSHOT, 0, self.stats.allocated_bytes.all.current, 0, 0)
            segments = self._segments_locked(history)
            trace = history.to_entries() if history is not None else []
            ms = self._max_split
            stats = self.stats.as_flat_dict(-1 if ms == NO_LIMIT else ms)
        free, total = self.device.mem_get_info()
        traces: list[list[TraceEntry]] = [[] for _ in range(self.device.index + 1)]
        traces[self.device.index] = trace
        return {
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
                "history_dropped": history.dropped if history is not None else 0,
            },
        }

    def _segments_locked(self, history: History | None) -> list[SegmentInfo]:
        frames = history.table.frames if history is not None else (lambda _sid: [])
        blocks_of: dict[int, list[Block]] = {addr: [] for addr in self._segments}
        for block in (*self._active.values(), *self._small.blocks.values(),
                      *self._large.blocks.values()):
            blocks_of[block.segment.addr].append(block)
        out: list[SegmentInfo] = []
        for addr in sorted(self._segments):
            seg = self._segments[addr]
            infos: list[BlockInfo] = []
            allocated = requested = 0
            for b in sorted(blocks_of[addr], key=lambda b: b.addr):
                if b.allocated:
                    allocated += b.size
                    requested += b.requested
                infos.append({
                    "address": b.addr,
                    "size": b.size,
                    "requested_size": b.requested,
                    "state": "active_allocated" if b.allocated else "inactive",
                    "frames": frames(b.stack) if b.allocated else [],
                })
            out.append({
                "device": self.device.index,
                "address": addr,
                "total_size": seg.size,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested,
                "stream": seg.stream,
                "segment_type": "small" if seg.small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": frames(seg.stack),
                "blocks": infos,
            })
        return out

    def memory_summary(self, abbreviated: bool = False) -> str:
        """PyTorch's ``memory_summary`` table for this device."""
        from ._summary import format_summary

        return format_summary(self.memory_stats(), self.device.index, abbreviated=abbreviated)

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError if the allocator's state contradicts itself."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        from ._invariants import check_allocator_state

        check_allocator_state(self)

    def __repr__(self) -> str:
        return (
            f"<CachingAllocator device={self.device.index} "
            f"allocated={self.stats.allocated_bytes.all.current} reserved={self._reserved}>"
        )


# Note [Stats of a split]: PyTorch's inactive_split counts cached free blocks that belong to a
# segment that is split, and inactive_split_bytes their bytes. Splitting a whole block creates one
# such block (the remainder); splitting an already-split free block only shrinks it; handing out
# an already-split block without a split removes one; a free adds the merged block (if its segment
# is still split) and removes the neighbours it swallowed.
