"""The caching allocator's policy in pure Python: the reference core.

It implements the policy listed at the top of ``allocator`` and has the same interface as the
C core in ``csrc/`` (policy.c), a line-by-line translation of it. CachingAllocator uses the C
core when it is built and this one otherwise; tests/test_native.py runs both on the same random
programs and compares every counter and every block.

Interface, shared by both cores:

- ``malloc(nbytes, stream=0) -> address`` and ``free(address)``: the hot path;
- ``configure(max_split, divisions, cap, gc_threshold)``: ``NO_LIMIT`` / ``-1`` / ``0`` unset;
- ``empty_cache() -> bytes released``;
- ``stats() -> tuple``: the counters in ``AllocatorStats.to_tuple`` order;
- ``state() -> (segments, blocks, stats)``: one locked moment: segments as ``(addr, size, stream,
  small, stack)``, blocks as ``(addr, size, requested, stream, small, segment_addr, allocated,
  stack)``, stats as ``stats()``; ``CachingAllocator.state`` names the fields (``engine.state``);
- ``snapshot(*, mark=True) -> (segments, blocks, stats, events, history_info, stacks,
  empty_cache)``: one locked moment: logs a snapshot event (when recording and ``mark``; the
  tool's own views pass ``mark=False``), then reads ``state()``, the events as columns
  (``history.event_columns``: one bytes object a column, no tuple per event; the C core's
  export also pairs the events, Note [Exporting ten million events] in ``csrc/export.c``),
  ``history_info()``, the pairs of every stack they name (``{stack id: pairs}``) and where
  ``empty_cache()`` was called (Note [Recording empty_cache] in ``history``);
- history: ``history_configure``, ``history_stop``, ``history_clear``, ``history_info``,
  ``events``, ``stack``, ``set_cell``, ``record_snapshot`` and ``history_stats() -> (stacks
  interned, code objects kept)`` (see ``history``);
- ``set_recorder(fn | None)``: a Python callback ``fn(action, addr, size, block_size, stream)
  -> stack id`` in place of the history (tests use it to inject failures);
- ``take_mark() -> (peak allocated, peak reserved)`` since the last call, for watermarks;
- the OOM handler given to the constructor returns the exception to raise.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable
from contextlib import suppress
from types import CodeType

from jupyter_gpumem.data.codes import (
    ALLOC,
    FREE_REQUESTED,
    FREED_BY_EMPTY_CACHE,
    FREED_BY_GC,
    FREED_BY_OVERSIZE,
    FREED_BY_RETRY,
    NO_STACK,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
)
from jupyter_gpumem.data.sizes import (
    INT64_MAX,
    LARGE_BUFFER,
    MAX_ALLOC_SIZE,
    MIN_BLOCK_SIZE,
    SMALL_SIZE,
    round_size,
)
from jupyter_gpumem.engine.blocks import (
    NO_LIMIT,
    STREAM_MAX,
    STREAM_MIN,
    Block,
    BlockPool,
    Segment,
    as_int,
    as_stream,
    segment_size_for,
)
from jupyter_gpumem.engine.expandable import address_space_size, page_size
from jupyter_gpumem.engine.history import (
    Event,
    ExportedEvents,
    PyHistory,
    StackPairs,
    event_bytes,
    event_columns,
)
from jupyter_gpumem.engine.stats import AllocatorStats

Recorder = Callable[[int, int, int, int, int], int]
#: The rows of ``state()``, as plain tuples; ``engine.state`` names their fields.
SegmentTuple = tuple[int, int, int, bool, int, bool, int]
BlockTuple = tuple[int, int, int, int, bool, int, bool, int]
#: A segment taken off the books and not yet given back to the device: (addr, size, stream).
Detached = tuple[int, int, int]
#: The virtual-memory operations of the device: reserve, release, map, unmap.
Vmm = tuple[Callable[[int], int], Callable[[int, int], None], Callable[[int, int], None],
            Callable[[int, int], None]]


class PyCore:
    """PyTorch's caching-allocator policy over a device's malloc and free. Thread-safe."""

    def __init__(self, device_malloc: Callable[[int, int], int],
                 device_free: Callable[[int], None], device_oom: type[BaseException],
                 oom_handler: Callable[[int, int, int, int], BaseException]) -> None:
        self._device_malloc = device_malloc
        self._device_free = device_free
        self._device_oom = device_oom
        self._oom_handler = oom_handler
        self._lock = threading.RLock()
        self.st = AllocatorStats()
        self._small = BlockPool(small=True)
        self._large = BlockPool(small=False)
        self._active: dict[int, Block] = {}  # address -> block handed to the user
        self._segments: dict[int, Segment] = {}  # address -> live segment
        self._reserved = 0
        self._max_split = NO_LIMIT
        self._divisions = 0
        self._cap = -1
        self._gc_threshold = 0.0
        self._recorder: Recorder | None = None
        self._history = PyHistory()
        self._mark_allocated = 0
        self._mark_reserved = 0
        # Note [Expandable segments] in engine/expandable
        self._expandable = False  # the policy makes expandable segments
        self._any_expandable = False  # some block ever belonged to one (hot-path guard)
        self._vmm: Vmm | None = None
        self._vmm_total = 0

    # -- configuration -------------------------------------------------------------------------

    def set_vmm(self, reserve: Callable[[int], int], release: Callable[[int, int], None],
                map_: Callable[[int, int], None], unmap: Callable[[int, int], None],
                total: int) -> None:
        """The device's virtual-memory operations and its total bytes, for expandable
        segments (Note [Expandable segments] in engine/expandable)."""
        if type(total) is not int:
            total = as_int(total, "total")
        if not 0 < total <= INT64_MAX:  # Note [Sizes near 2**63] in engine/stats
            raise ValueError("set_vmm: total must be positive and at most 2**63 - 1")
        with self._lock:
            self._vmm = (reserve, release, map_, unmap)
            self._vmm_total = total

    def configure(self, max_split: int, divisions: int, cap: int, gc_threshold: float,
                  expandable: bool = False) -> None:
        # AllocatorConfig checks the user's values; this guards the core's own invariants.
        if not (0 < max_split <= NO_LIMIT and 0 <= divisions <= MAX_ALLOC_SIZE
                and -1 <= cap <= INT64_MAX):
            raise ValueError("configure: a value is out of range")
        if expandable and self._vmm is None:
            raise ValueError("configure: expandable segments need set_vmm first")
        with self._lock:
            self._expandable = bool(expandable)
            self._max_split = max_split
            self._divisions = divisions
            self._cap = cap
            self._gc_threshold = gc_threshold
            # The oversize counters follow the new threshold.
            for stat, current in (
                (self.st.oversize_allocations,
                 sum(1 for b in self._active.values() if b.size >= max_split)),
                (self.st.oversize_segments,
                 sum(1 for s in self._segments.values()
                     if s.size >= max_split and not s.expandable)),
            ):
                if current > stat.current:
                    stat.increase(current - stat.current)
                elif current < stat.current:
                    stat.decrease(stat.current - current)

    def set_recorder(self, recorder: Recorder | None) -> None:
        """A Python history callback (tests use it to inject failures)."""
        with self._lock:
            self._recorder = recorder

    # -- history (the interface of Note [History in C] in csrc/core.h) -------------------------

    def history_configure(self, max_entries: int, stacks: bool, clock: Callable[[], int] | None,
                          classify: Callable[[CodeType], int],
                          device_free: Callable[[], int] | None) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        with self._lock:
            self._history.configure(max_entries, bool(stacks), clock, device_free)
            self._recorder = self._history.record

    def history_stop(self) -> None:
        with self._lock:
            self._history.on = False
            self._history.clear()  # live blocks and segments keep their stacks
            self._recorder = None

    def history_clear(self) -> None:
        with self._lock:
            self._history.clear()

    def history_info(self) -> tuple[bool, bool, int, int, int, int]:
        return self._history.info()

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._history.events)

    def stack(self, sid: int) -> StackPairs:
        with self._lock:
            return self._history.table.pairs(sid)

    def history_stats(self) -> tuple[int, int]:
        with self._lock:
            return self._history.table.counts()

    def history_bytes(self) -> tuple[int, int]:
        """(bytes of one event, bytes of the events kept): each a tuple of nine ints here."""
        with self._lock:
            events = self._history.events
            one = event_bytes(events[-1]) if events else event_bytes((0,) * 9)
            return one, one * len(events)

    def set_cell(self, cell: int) -> None:
        self._history.cell = cell

    def record_snapshot(self, size: int) -> None:
        with self._lock:
            if self._history.on:
                self._history.record(SNAPSHOT, 0, size, 0, 0)

    # -- the hot path --------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        # Note [Arguments of the cores]: plain ints pass with one type check each.
        if type(nbytes) is not int:
            nbytes = as_int(nbytes, "nbytes")
        if type(stream) is not int or not STREAM_MIN <= stream <= STREAM_MAX:
            stream = as_stream(stream)
        if nbytes <= 0:
            if nbytes == 0:
                return 0
            raise ValueError(f"cannot allocate a negative size ({nbytes} B)")
        if nbytes > MAX_ALLOC_SIZE:
            with self._lock:
                self._oom_too_large(nbytes, stream)
        size = round_size(nbytes, self._divisions)
        small = size <= SMALL_SIZE
        with self._lock:
            pool = self._small if small else self._large
            block = self._get_free_block(pool, size, stream)
            if block is None:
                block = self._alloc_after_miss(pool, nbytes, size, stream)
            return self._alloc_found_block(block, pool, size, nbytes)

    def free(self, ptr: int) -> None:
        if type(ptr) is not int:
            ptr = as_int(ptr, "ptr")
        if ptr == 0:
            return
        with self._lock:
            block = self._active.pop(ptr, None)
            if block is None:
                raise ValueError(
                    f"free of address {ptr:#x}, which this allocator did not hand out "
                    "or which was already freed"
                )
            recorder = self._recorder
            if recorder is not None:
                try:
                    # One call: the recorder logs free_requested and free_completed together.
                    recorder(FREE_REQUESTED, block.addr, block.requested, block.size,
                             block.stream)
                finally:
                    self._unaccount_and_cache(block)
            else:
                self._unaccount_and_cache(block)

    def _unaccount_and_cache(self, block: Block) -> None:
        """A live block, already out of ``_active``, goes back to the cache."""
        st = self.st
        small = block.small
        st.allocation.decrease(small, 1)
        st.allocated_bytes.decrease(small, block.size)
        if block.size >= self._max_split:
            st.oversize_allocations.decrease(1)
        self._free_block(block)

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self._gc_threshold and self._cap >= 0:
            pool.searches += 1
        lst = pool.by_stream.get(stream)
        if not lst:
            return None
        i = bisect_left(lst, (size, 0))
        if i == len(lst):
            return None
        found_size, addr = lst[i]
        if self._any_expandable and pool.blocks[addr].segment.expandable:
            i = self._expandable_fit(pool, lst, i, stream)
            if i < 0:
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
        st = self.st
        small = pool.small
        remaining = block.size - size
        already_split = block.prev is not None or block.next is not None
        if self._any_expandable and block.segment.expandable:
            already_split = False  # Note [Expandable segments]: no inactive_split counts
            counted = False
        else:
            counted = True
        if (remaining >= MIN_BLOCK_SIZE) if small or self._expandable else (
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
            elif counted:
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
        allocated = st.allocated_bytes.all.current
        if allocated > self._mark_allocated:
            self._mark_allocated = allocated
        if self._recorder is not None:
            try:
                block.stack = self._recorder(ALLOC, block.addr, requested, block.size,
                                             block.stream)
            except BaseException:
                # The caller never sees this block: give it back so nothing is lost.
                del self._active[block.addr]
                self._unaccount_and_cache(block)
                raise
        return block.addr

    def _free_block(self, block: Block) -> None:
        # Merge with free neighbours, then cache. Note [Stats of a split]: inactive_split counts
        # the free blocks of segments that are split, so it changes by what the merge leaves.
        pool = self._small if block.small else self._large
        net_blocks = 0
        net_bytes = 0
        prev = block.prev
        if prev is not None and not prev.allocated and prev.mapped:
            pool.remove(prev)
            block.addr = prev.addr
            block.size += prev.size
            block.prev = prev.prev
            if prev.prev is not None:
                prev.prev.next = block
            net_blocks -= 1
            net_bytes -= prev.size
        nxt = block.next
        if nxt is not None and not nxt.allocated and nxt.mapped:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            net_blocks -= 1
            net_bytes -= nxt.size
        block.allocated = False
        if block.stack != NO_STACK:  # Note [Interned stacks are reference-counted]
            self._history.table.release(block.stack)
            block.stack = NO_STACK
        pool.insert(block)
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_bytes += block.size
        st = self.st
        small = block.small
        if self._any_expandable and block.segment.expandable:
            net_blocks = net_bytes = 0  # Note [Expandable segments]: no inactive_split counts
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
        if self._gc_threshold and self._cap >= 0:
            self._garbage_collect()
        segment_size = segment_size_for(size)
        block = self._alloc_block(segment_size, stream, pool.small, size, retry=False)
        if block is None and self._release_available_cached_blocks(pool, size, stream):
            block = self._alloc_block(segment_size, stream, pool.small, size, retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(segment_size, stream, pool.small, size, retry=True)
        if block is None:
            self.st.num_ooms += 1
            if self._recorder is not None:
                # block_size carries the request: Note [Recording empty_cache] in history
                self._recorder(OOM, 0, size, nbytes, stream)
            raise self._oom_handler(nbytes, size, segment_size, stream)
        return block

    def _oom_too_large(self, nbytes: int, stream: int) -> None:
        """A request above MAX_ALLOC_SIZE: out of memory at once, the cache left alone."""
        self.st.num_ooms += 1
        if self._recorder is not None:
            self._recorder(OOM, 0, min(nbytes, INT64_MAX), min(nbytes, INT64_MAX), stream)
        # Nothing was rounded and no segment asked for: the report shows the request as both.
        raise self._oom_handler(nbytes, nbytes, nbytes, stream)

    def _alloc_block(self, size: int, stream: int, small: bool, request: int, *,
                     retry: bool) -> Block | None:
        st = self.st
        if retry:
            st.num_alloc_retries += 1
        if self._cap >= 0 and self._reserved + size > self._cap:
            return None
        if self._expandable:
            return self._alloc_expandable(small, request, stream)
        if self._reserved + size > INT64_MAX:  # Note [Sizes near 2**63] in engine/stats
            return None
        try:
            addr = self._device_malloc(size, stream)
        except self._device_oom:
            return None
        addr = self._device_range(addr, size, virtual=False)
        segment = Segment(addr, size, stream, small)
        self._segments[addr] = segment
        self._reserved += size
        st.num_device_alloc += 1
        st.segment.increase(small, 1)
        st.reserved_bytes.increase(small, size)
        if size >= self._max_split:
            st.oversize_segments.increase(1)
        if self._reserved > self._mark_reserved:
            self._mark_reserved = self._reserved
        block = Block(addr, size, stream, small, segment)
        if self._recorder is not None:
            try:
                segment.stack = self._recorder(SEGMENT_ALLOC, addr, size, 0, stream)
            except BaseException:
                (self._small if small else self._large).insert(block)  # keep it cached
                raise
        return block

    def _device_range(self, addr: int, size: int, *, virtual: bool) -> int:
        """``addr``, a device's address for a range of ``size`` bytes, if the range lies in
        [1, 2**63) (Note [Sizes near 2**63] in engine/stats); otherwise the range goes back to
        the device (its free, or its release for a virtual range) and ValueError is raised."""
        addr = as_int(addr, "the device's address")
        if 0 < addr <= INT64_MAX - size:
            return addr
        with suppress(Exception):  # the error below says what went wrong
            if virtual:
                assert self._vmm is not None
                self._vmm[1](addr, size)
            else:
                self._device_free(addr)
        raise ValueError(f"the device's {'reserve' if virtual else 'malloc'} returned "
                         f"{addr:#x} for {size} B: the range must lie in [1, 2**63)")

    def _detach(self, block: Block, out: list[Detached]) -> None:
        """Take a cached whole-segment block off the books; ``_return_segments`` frees it."""
        pool = self._small if block.small else self._large
        pool.remove(block)
        segment = self._segments.pop(block.addr)
        self._history.table.release(segment.stack)
        self._reserved -= block.size
        st = self.st
        st.num_device_free += 1
        st.segment.decrease(block.small, 1)
        st.reserved_bytes.decrease(block.small, block.size)
        if block.size >= self._max_split:
            st.oversize_segments.decrease(1)
        out.append((block.addr, block.size, block.stream))

    def _return_segments(self, detached: list[Detached], reason: int) -> None:
        """Give detached segments back to the device: Note [Device calls come last] in
        _allocator. Every one is tried; the first error is raised after the last. ``reason``
        (a ``FREED_BY_*`` code) goes with each segment_free event."""
        error: BaseException | None = None
        for addr, size, stream in detached:
            try:
                self._device_free(addr)
                if self._recorder is not None:
                    self._history.reason = reason
                    self._recorder(SEGMENT_FREE, addr, size, 0, stream)
            except BaseException as exc:  # re-raised after the last segment
                if error is None:
                    error = exc
        if error is not None:
            raise error

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        # See Note [Oversize blocks after a runtime change] in _allocator: whole segments only.
        ms = self._max_split
        if ms == NO_LIMIT:
            return False
        want = max(size, ms)
        lst = pool.by_stream.get(stream, [])
        blocks = pool.blocks
        chosen: list[Block] = []
        for i in range(bisect_left(lst, (want, 0)), len(lst)):
            block = blocks[lst[i][1]]
            if block.prev is None and block.next is None and not block.segment.expandable:
                chosen.append(block)
                break
        released = want if chosen else 0
        if not chosen:
            for block_size, addr in reversed(lst):
                if released >= want or block_size < ms:
                    break
                block = blocks[addr]
                if block.prev is None and block.next is None and not block.segment.expandable:
                    chosen.append(block)
                    released += block_size
        detached: list[Detached] = []
        for block in chosen:
            self._detach(block, detached)
        self._return_segments(detached, FREED_BY_OVERSIZE)
        return released >= want

    def _release_cached_blocks(self, reason: int = FREED_BY_RETRY) -> None:
        self.st.num_sync_all_streams += 1  # PyTorch synchronizes every stream first
        detached: list[Detached] = []
        to_unmap: list[tuple[Block, int, int]] = []
        for pool in (self._large, self._small):
            for block in pool.ordered():
                if block.segment.expandable:
                    self._claim_unmap(block, to_unmap)
                elif block.prev is None and block.next is None:
                    self._detach(block, detached)
        try:
            self._return_segments(detached, reason)
        finally:
            try:
                self._unmap_claimed(to_unmap, reason)
            finally:
                self._release_unmapped_segments()

    def _garbage_collect(self) -> None:
        """Release old whole cached segments of the large pool while over the threshold."""
        threshold = int(self._gc_threshold * self._cap)
        if self._reserved <= threshold:
            return
        target = self._reserved - threshold
        pool = self._large
        whole = [b for b in pool.ordered()
                 if b.prev is None and b.next is None and not b.segment.expandable]
        total_age = sum(pool.searches - b.gc_base for b in whole)
        count = len(whole)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            average = total_age / count
            freed = False
            detached: list[Detached] = []
            for block in pool.ordered():
                age = pool.searches - block.gc_base
                if (block.prev is None and block.next is None and age >= average
                        and not block.segment.expandable):
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._detach(block, detached)
            self._return_segments(detached, FREED_BY_GC)

    # -- reading and resetting state -----------------------------------------------------------

    def empty_cache(self) -> int:
        with self._lock:
            self._history.mark_empty_cache()
            before = self._reserved
            self._release_cached_blocks(FREED_BY_EMPTY_CACHE)
            return before - self._reserved

    def stats(self) -> tuple[int, ...]:
        with self._lock:
            return self.st.to_tuple()

    def reset_peak(self) -> None:
        with self._lock:
            self.st.reset_peak()

    def reset_accumulated(self) -> None:
        with self._lock:
            self.st.reset_accumulated()

    def state(self) -> tuple[list[SegmentTuple], list[BlockTuple], tuple[int, ...]]:
        with self._lock:
            segments = [(s.addr, s.reserved, s.stream, s.small, s.stack, s.expandable, s.size)
                        for s in self._segments.values()]
            blocks = [(b.addr, b.size, b.requested, b.stream, b.small, b.segment.addr,
                       b.allocated, b.stack)
                      for b in (*self._active.values(), *self._small.blocks.values(),
                                *self._large.blocks.values())]
            return segments, blocks, self.st.to_tuple()

    def snapshot(self, *, mark: bool = True
                 ) -> tuple[list[SegmentTuple], list[BlockTuple], tuple[int, ...], ExportedEvents,
                            tuple[bool, bool, int, int, int, int], dict[int, StackPairs],
                            list[int]]:
        with self._lock:
            if mark and self._history.on:
                self._history.record(SNAPSHOT, 0, self.st.allocated_bytes.all.current, 0, 0)
            segments, blocks, stats = self.state()
            events = list(self._history.events)
            table = self._history.table
            sids = {row[4] for row in segments} | {row[7] for row in blocks}
            sids.update(event[6] for event in events)
            sids.discard(NO_STACK)
            stacks = {sid: table.pairs(sid) for sid in sids
                      if table.has(sid)}  # not: an id from a recorder of set_recorder
            return (segments, blocks, stats, event_columns(events), self._history.info(), stacks,
                    self._history.empty_cache_positions())

    def check(self) -> None:
        """Assert the pools' indexes agree with their blocks, and the reserved-bytes total with
        the segments and their counter."""
        with self._lock:
            assert self._reserved == sum(s.reserved for s in self._segments.values()), \
                "the reserved total is not the sum of the segments"
            assert self._reserved == self.st.reserved_bytes.all.current, \
                "the reserved total disagrees with reserved_bytes"
            for pool in (self._small, self._large):
                listed = sorted((size, addr) for lst in pool.by_stream.values()
                                for size, addr in lst)
                assert listed == sorted((b.size, b.addr) for b in pool.blocks.values()), \
                    "pool index stale"
                for stream, lst in pool.by_stream.items():
                    assert lst == sorted(lst), f"pool list of stream {stream} is out of order"
                    for _, addr in lst:
                        assert pool.blocks[addr].stream == stream
            for addr, b in self._active.items():
                assert b.allocated and b.addr == addr, "address map is stale"
            self._check_expandable()

    def owns(self, ptr: int) -> bool:
        return ptr in self._active

    def take_mark(self) -> tuple[int, int]:
        with self._lock:
            marks = (self._mark_allocated, self._mark_reserved)
            self._mark_allocated = self.st.allocated_bytes.all.current
            self._mark_reserved = self._reserved
            return marks

    def allocated(self) -> int:
        return self.st.allocated_bytes.all.current

    def reserved(self) -> int:
        return self._reserved

    def largest_free_block(self) -> int:
        with self._lock:
            return max((b.size for p in (self._small, self._large) for b in p.blocks.values()),
                       default=0)

    # -- expandable segments: Note [Expandable segments] in engine/expandable ------------------

    def _expandable_fit(self, pool: BlockPool, lst: list[tuple[int, int]], i: int,
                        stream: int) -> int:
        """The index in ``lst`` to take instead of ``i``, a block of an expandable segment;
        -1 for none."""
        blocks = pool.blocks
        if not self._expandable:  # switched off: only blocks of classic segments
            while i < len(lst) and blocks[lst[i][1]].segment.expandable:
                i += 1
            return i if i < len(lst) else -1
        cur = blocks[lst[i][1]]
        while cur.segment.expandable and i + 1 < len(lst):
            nxt = blocks[lst[i + 1][1]]
            if _room(nxt) >= _room(cur):
                break
            i += 1
            cur = nxt
        return i

    def _find_expandable(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """The lowest start of ``size`` free bytes, mapped or not, in an expandable segment of
        the pool and stream; a new segment when none has room; None if it cannot be made."""
        for addr in pool.unmapped_by_stream.get(stream, ()):
            start = pool.unmapped[addr]
            prev = start.prev
            if prev is not None and not prev.allocated:
                start = prev
            room = 0
            b: Block | None = start
            while b is not None and room < size and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return start
        assert self._vmm is not None
        span = address_space_size(self._vmm_total, pool.small)
        if span < size:  # more than one segment holds: out of memory, nothing reserved
            return None
        try:
            base = self._vmm[0](span)
        except self._device_oom:
            return None
        base = self._device_range(base, span, virtual=True)
        segment = Segment(base, span, stream, pool.small, expandable=True)
        self._segments[base] = segment
        block = Block(base, span, stream, pool.small, segment)
        block.mapped = False
        pool.insert_unmapped(block)
        self._any_expandable = True
        return block

    def _alloc_expandable(self, small: bool, size: int, stream: int) -> Block | None:
        """Map pages so that a run of an expandable segment holds ``size`` bytes; the run,
        mapped and off the pools, or None when a map failed."""
        pool = self._small if small else self._large
        start = self._find_expandable(pool, size, stream)
        if start is None:
            return None
        chain: list[Block] = []
        covered = 0
        b: Block | None = start
        while covered < size:
            assert b is not None
            chain.append(b)
            covered += b.size
            b = b.next
        for b in chain:  # claimed: Note [Expandable segments], "Ours"
            if b.mapped:
                pool.remove(b)
            else:
                pool.remove_unmapped(b)
            b.allocated = True
        assert self._vmm is not None
        map_ = self._vmm[2]
        segment = start.segment
        page = page_size(small)
        st = self.st
        have = 0
        done = False
        head = chain[0]
        tail: Block | None = None
        try:
            for b in chain:
                if b.mapped:
                    have += b.size
                    continue
                want = min(b.size, -(-(size - have) // page) * page)
                if self._reserved + want > INT64_MAX:  # Note [Sizes near 2**63] in engine/stats
                    return None
                try:
                    map_(b.addr, want)
                except self._device_oom:
                    return None
                if want < b.size:
                    tail = Block(b.addr + want, b.size - want, stream, small, segment)
                    tail.mapped = False
                    tail.allocated = True
                    _link_after(b, tail)
                    b.size = want
                b.mapped = True
                segment.mapped += want
                self._reserved += want
                st.num_device_alloc += 1
                st.reserved_bytes.increase(small, want)
                if self._reserved > self._mark_reserved:
                    self._mark_reserved = self._reserved
                have += want
                if self._recorder is not None:
                    sid = self._recorder(SEGMENT_MAP, b.addr, want, _tag(segment), stream)
                    if segment.stack == NO_STACK:
                        segment.stack = sid
                    else:
                        self._history.table.release(sid)
            done = True
        finally:
            if tail is not None:
                chain.append(tail)
            if done:
                for b in chain[1:]:
                    if b.mapped:
                        _absorb(head, b)
                    else:
                        b.allocated = False
                        self._settle(b)
                nxt = head.next
                if nxt is not None and not nxt.allocated and nxt.mapped:
                    pool.remove(nxt)
                    _absorb(head, nxt)
            else:
                self._settle_chain(chain)
        return head

    def _settle_chain(self, chain: list[Block]) -> None:
        """Give claimed neighbouring blocks back: merged by mapped state, then indexed."""
        for b in chain:
            b.allocated = False
        run = chain[0]
        for b in chain[1:]:
            if b.mapped == run.mapped:
                _absorb(run, b)
            else:
                self._settle(run)
                run = b
        self._settle(run)

    def _settle(self, block: Block) -> None:
        """Merge a free block of an expandable segment with free neighbours in the same mapped
        state (try_merge_blocks), then index it."""
        pool = self._small if block.small else self._large
        for other in (block.prev, block.next):
            if other is not None and not other.allocated and other.mapped == block.mapped:
                if other.mapped:
                    pool.remove(other)
                else:
                    pool.remove_unmapped(other)
                _absorb(block, other)
        if block.mapped:
            pool.insert(block)
        else:
            pool.insert_unmapped(block)

    def _claim_unmap(self, block: Block, out: list[tuple[Block, int, int]]) -> None:
        """Take the whole pages inside a cached block of an expandable segment off the books
        (unmap_block); ``_unmap_claimed`` gives them back to the device."""
        segment = block.segment
        page = page_size(block.small)
        offset = block.addr - segment.addr
        begin = segment.addr + -(-offset // page) * page
        end = segment.addr + (offset + block.size) // page * page
        if begin >= end:
            return
        pool = self._small if block.small else self._large
        pool.remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.stream, block.small, segment)
            _link_before(block, before)
            pool.insert(before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, block.stream, block.small,
                          segment)
            _link_after(block, after)
            pool.insert(after)
        size = end - begin
        block.addr = begin
        block.size = size
        block.mapped = False
        block.allocated = True  # claimed until the device has unmapped it
        segment.mapped -= size
        self._reserved -= size
        self.st.num_device_free += 1
        self.st.reserved_bytes.decrease(block.small, size)
        out.append((block, begin, size))

    def _unmap_claimed(self, claimed: list[tuple[Block, int, int]], reason: int) -> None:
        """Unmap claimed pages, settle their blocks, and release every segment left with no
        mapped page. Every call is tried; the first error is raised after the last."""
        if not claimed:
            return
        assert self._vmm is not None
        _, release, _, unmap = self._vmm
        error: BaseException | None = None
        for block, addr, size in claimed:
            try:
                unmap(addr, size)
                if self._recorder is not None:
                    self._history.reason = reason
                    self._recorder(SEGMENT_UNMAP, addr, size, _tag(block.segment), block.stream)
            except BaseException as exc:  # re-raised after the last block
                if error is None:
                    error = exc
            block.allocated = False
            self._settle(block)
            if block.prev is None and block.next is None:  # release_expandable_segment
                segment = block.segment
                (self._small if block.small else self._large).remove_unmapped(block)
                del self._segments[segment.addr]
                self._history.table.release(segment.stack)
                try:
                    release(segment.addr, segment.size)
                except BaseException as exc:
                    if error is None:
                        error = exc
        if error is not None:
            raise error

    def _release_unmapped_segments(self) -> None:
        """Release every expandable segment with no mapped page (one a failed map left, or one
        emptied meanwhile): ours, so that nothing is held once the cache is emptied."""
        assert self._vmm is not None or not self._any_expandable
        empty = [b for pool in (self._large, self._small) for b in pool.unmapped.values()
                 if b.prev is None and b.next is None]
        for block in empty:  # off the books first: Note [Device calls come last]
            (self._small if block.small else self._large).remove_unmapped(block)
            del self._segments[block.segment.addr]
            self._history.table.release(block.segment.stack)
        error: BaseException | None = None
        for block in empty:
            try:
                self._vmm[1](block.segment.addr, block.segment.size)  # type: ignore[index]
            except BaseException as exc:  # re-raised after the last
                if error is None:
                    error = exc
        if error is not None:
            raise error

    def _check_expandable(self) -> None:
        for pool in (self._small, self._large):
            listed = sorted(a for lst in pool.unmapped_by_stream.values() for a in lst)
            assert listed == sorted(pool.unmapped), "unmapped index stale"
            for stream, lst in pool.unmapped_by_stream.items():
                assert lst == sorted(lst), "unmapped list out of order"
                for addr in lst:
                    b = pool.unmapped[addr]
                    assert b.stream == stream and not b.mapped and not b.allocated
                    assert b.segment.expandable, "an unmapped block of a classic segment"


def _tag(segment: Segment) -> int:
    """What a segment_map or segment_unmap event carries in its block_size slot: the segment's
    base, plus 1 in the small pool (Note [Recording empty_cache] in history)."""
    return segment.addr + segment.small


def _room(block: Block) -> int:
    """A block's size plus the unmapped block right after it: what it can grow to."""
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def _link_after(block: Block, new: Block) -> None:
    new.prev = block
    new.next = block.next
    if block.next is not None:
        block.next.prev = new
    block.next = new


def _link_before(block: Block, new: Block) -> None:
    new.next = block
    new.prev = block.prev
    if block.prev is not None:
        block.prev.next = new
    block.prev = new


def _absorb(dst: Block, src: Block) -> None:
    """``dst`` takes over its neighbour ``src`` (either side), which is dropped."""
    if src is dst.prev:
        dst.addr = src.addr
        dst.prev = src.prev
        if src.prev is not None:
            src.prev.next = dst
    else:
        dst.next = src.next
        if src.next is not None:
            src.next.prev = dst
    dst.size += src.size


# Note [Stats of a split]: PyTorch's inactive_split counts cached free blocks that belong to a
# segment that is split, and inactive_split_bytes their bytes. Splitting a whole block creates one
# such block (the remainder); splitting an already-split free block only shrinks it; handing out
# an already-split block without a split removes one; a free adds the merged block (if its segment
# is still split) and removes the neighbours it swallowed.
