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
- ``snapshot() -> (segments, blocks, stats, events, history_info, stacks, empty_cache)``: one
  locked moment: logs a snapshot event (when recording), then reads ``state()``, ``events()``,
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
    SNAPSHOT,
)
from jupyter_gpumem.data.sizes import LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_SIZE, round_size
from jupyter_gpumem.engine.blocks import (
    MAX_ALLOC_SIZE,
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
from jupyter_gpumem.engine.history import Event, PyHistory, StackPairs
from jupyter_gpumem.engine.stats import AllocatorStats

Recorder = Callable[[int, int, int, int, int], int]
#: The rows of ``state()``, as plain tuples; ``engine.state`` names their fields.
SegmentTuple = tuple[int, int, int, bool, int]
BlockTuple = tuple[int, int, int, int, bool, int, bool, int]
#: A segment taken off the books and not yet given back to the device: (addr, size, stream).
Detached = tuple[int, int, int]
INT64_MAX = (1 << 63) - 1


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

    # -- configuration -------------------------------------------------------------------------

    def configure(self, max_split: int, divisions: int, cap: int, gc_threshold: float) -> None:
        # AllocatorConfig checks the user's values; this guards the core's own invariants.
        if not (0 < max_split <= NO_LIMIT and 0 <= divisions <= MAX_ALLOC_SIZE
                and -1 <= cap <= INT64_MAX):
            raise ValueError("configure: a value is out of range")
        with self._lock:
            self._max_split = max_split
            self._divisions = divisions
            self._cap = cap
            self._gc_threshold = gc_threshold
            # The oversize counters follow the new threshold.
            for stat, current in (
                (self.st.oversize_allocations,
                 sum(1 for b in self._active.values() if b.size >= max_split)),
                (self.st.oversize_segments,
                 sum(1 for s in self._segments.values() if s.size >= max_split)),
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
        if block.stack != NO_STACK:  # Note [Interned stacks are reference-counted]
            self._history.table.release(block.stack)
            block.stack = NO_STACK
        pool.insert(block)
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_bytes += block.size
        st = self.st
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
        if self._gc_threshold and self._cap >= 0:
            self._garbage_collect()
        segment_size = segment_size_for(size)
        block = self._alloc_block(segment_size, stream, pool.small, retry=False)
        if block is None and self._release_available_cached_blocks(pool, size, stream):
            block = self._alloc_block(segment_size, stream, pool.small, retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(segment_size, stream, pool.small, retry=True)
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

    def _alloc_block(self, size: int, stream: int, small: bool, *, retry: bool) -> Block | None:
        st = self.st
        if retry:
            st.num_alloc_retries += 1
        if self._cap >= 0 and self._reserved + size > self._cap:
            return None
        try:
            addr = self._device_malloc(size, stream)
        except self._device_oom:
            return None
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
            if block.prev is None and block.next is None:
                chosen.append(block)
                break
        released = want if chosen else 0
        if not chosen:
            for block_size, addr in reversed(lst):
                if released >= want or block_size < ms:
                    break
                block = blocks[addr]
                if block.prev is None and block.next is None:
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
        for pool in (self._large, self._small):
            for block in pool.ordered():
                if block.prev is None and block.next is None:
                    self._detach(block, detached)
        self._return_segments(detached, reason)

    def _garbage_collect(self) -> None:
        """Release old whole cached segments of the large pool while over the threshold."""
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
            detached: list[Detached] = []
            for block in pool.ordered():
                age = pool.searches - block.gc_base
                if block.prev is None and block.next is None and age >= average:
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
            segments = [(s.addr, s.size, s.stream, s.small, s.stack)
                        for s in self._segments.values()]
            blocks = [(b.addr, b.size, b.requested, b.stream, b.small, b.segment.addr,
                       b.allocated, b.stack)
                      for b in (*self._active.values(), *self._small.blocks.values(),
                                *self._large.blocks.values())]
            return segments, blocks, self.st.to_tuple()

    def snapshot(self) -> tuple[list[SegmentTuple], list[BlockTuple], tuple[int, ...],
                                list[Event], tuple[bool, bool, int, int, int, int],
                                dict[int, StackPairs], list[int]]:
        with self._lock:
            if self._history.on:
                self._history.record(SNAPSHOT, 0, self.st.allocated_bytes.all.current, 0, 0)
            segments, blocks, stats = self.state()
            events = list(self._history.events)
            table = self._history.table
            sids = {row[4] for row in segments} | {row[7] for row in blocks}
            sids.update(event[6] for event in events)
            sids.discard(NO_STACK)
            stacks = {sid: table.pairs(sid) for sid in sids
                      if table.has(sid)}  # not: an id from a recorder of set_recorder
            return (segments, blocks, stats, events, self._history.info(), stacks,
                    self._history.empty_cache_positions())

    def check(self) -> None:
        """Assert the pools' indexes agree with their blocks, and the reserved-bytes total with
        the segments and their counter."""
        with self._lock:
            assert self._reserved == sum(s.size for s in self._segments.values()), \
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


# Note [Stats of a split]: PyTorch's inactive_split counts cached free blocks that belong to a
# segment that is split, and inactive_split_bytes their bytes. Splitting a whole block creates one
# such block (the remainder); splitting an already-split free block only shrinks it; handing out
# an already-split block without a split removes one; a free adds the merged block (if its segment
# is still split) and removes the neighbours it swallowed.
