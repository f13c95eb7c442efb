"""Exact-value tests of every rule of the allocator policy, at its boundaries.

Every expected number below is worked out from PyTorch's policy (DESIGN.md, and
``c10/cuda/CUDACachingAllocator.cpp``), step by step in the comments, not read off the engine.
"""

from __future__ import annotations

import pytest

from jupyter_gpumem import (
    AllocatorConfig,
    CachingAllocator,
    ManualClock,
    OutOfMemoryError,
    SimulatedDevice,
    round_size,
    segment_size_for,
)

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def make(capacity: int = 8 * GiB, **config: object) -> CachingAllocator:
    device = SimulatedDevice(capacity, clock=ManualClock())
    return CachingAllocator(device, AllocatorConfig(**config), debug=True)  # type: ignore[arg-type]


def stat(a: CachingAllocator, key: str) -> int:
    return a.memory_stats()[key]


def pools(a: CachingAllocator, name: str, field: str = "current") -> tuple[int, int, int]:
    """``(all, large_pool, small_pool)`` of one counter."""
    s = a.memory_stats()
    return tuple(s[f"{name}.{p}.{field}"] for p in ("all", "large_pool", "small_pool"))  # type: ignore[return-value]


def block_sizes(a: CachingAllocator) -> list[list[tuple[int, str]]]:
    """Per segment, in address order: ``(size, state)`` of each block."""
    return [[(b["size"], b["state"][0]) for b in seg["blocks"]] for seg in a.snapshot()["segments"]]


# -- rule 1: rounding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "rounded"),
    [(1, 512), (511, 512), (512, 512), (513, 1024), (1024, 1024), (1025, 1536),
     (MiB - 1, MiB), (MiB, MiB), (MiB + 1, MiB + 512), (10 * MiB - 1, 10 * MiB)],
)
def test_round_size_is_a_multiple_of_512_at_least_512(request_: int, rounded: int) -> None:
    assert round_size(request_) == rounded


@pytest.mark.parametrize(
    ("divisions", "request_", "rounded"),
    [
        # Up to 512·N bytes the plain 512 B rounding applies.
        (4, 2048, 2048),
        (4, 1500, 1536),
        # Above it: N steps between two powers of two. 2049 lies in [2048, 4096), steps of 512.
        (4, 2049, 2560),
        (4, 2560, 2560),
        # [1 MiB, 2 MiB) in steps of 256 KiB.
        (4, MiB + 1, MiB + 256 * KiB),
        (4, MiB + 256 * KiB, MiB + 256 * KiB),
        # [4 MiB, 8 MiB) in steps of 1 MiB: 5 MiB is a step, 5 MiB + 1 goes to 6 MiB.
        (4, 5 * MiB, 5 * MiB),
        (4, 5 * MiB + 1, 6 * MiB),
        # A power of two stays.
        (4, 8 * MiB, 8 * MiB),
        # Two divisions: [2 MiB, 4 MiB) splits at 3 MiB.
        (2, 3 * MiB, 3 * MiB),
        (2, 3 * MiB + 1, 4 * MiB),
        (2, 1025, 1536),
        # Eight divisions: 4097 lies in [4096, 8192), steps of 512.
        (8, 4097, 4608),
        (8, 4096, 4096),
        # One division means no power-of-two rounding at all.
        (1, 3 * MiB + 1, 3 * MiB + 512),
    ],
)
def test_roundup_power2_divisions(divisions: int, request_: int, rounded: int) -> None:
    assert round_size(request_, divisions) == rounded


def test_malloc_uses_the_configured_rounding() -> None:
    a = make(roundup_power2_divisions=4)
    p = a.malloc(MiB + 1)
    # 1 MiB + 1 rounds to 1.25 MiB: above 1 MiB, so the large pool and a 20 MiB segment.
    assert pools(a, "allocated_bytes") == (MiB + 256 * KiB, MiB + 256 * KiB, 0)
    assert pools(a, "requested_bytes") == (MiB + 1, MiB + 1, 0)
    assert pools(a, "reserved_bytes") == (20 * MiB, 20 * MiB, 0)
    a.free(p)


def test_zero_bytes_is_address_zero_and_negative_is_an_error(allocator: CachingAllocator) -> None:
    assert allocator.malloc(0) == 0
    allocator.free(0)
    assert stat(allocator, "allocation.all.allocated") == 0
    assert stat(allocator, "num_device_alloc") == 0
    with pytest.raises(ValueError, match="negative"):
        allocator.malloc(-1)


# -- rule 2 and 3: pools and segment sizes --------------------------------------------------------


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
     (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (12 * MiB, 12 * MiB),
     (20 * MiB, 20 * MiB), (20 * MiB + 512, 22 * MiB), (GiB + 512, GiB + 2 * MiB)],
)
def test_segment_size_for(rounded: int, segment: int) -> None:
    assert segment_size_for(rounded) == segment


def test_one_mib_is_small_and_one_byte_more_is_large(allocator: CachingAllocator) -> None:
    p = allocator.malloc(MiB)
    assert pools(allocator, "allocated_bytes") == (MiB, 0, MiB)
    assert pools(allocator, "segment") == (1, 0, 1)
    assert pools(allocator, "reserved_bytes") == (2 * MiB, 0, 2 * MiB)
    q = allocator.malloc(MiB + 1)
    assert pools(allocator, "allocated_bytes") == (2 * MiB + 512, MiB + 512, MiB)
    assert pools(allocator, "segment") == (2, 1, 1)
    assert pools(allocator, "reserved_bytes") == (22 * MiB, 20 * MiB, 2 * MiB)
    segs = allocator.snapshot()["segments"]
    assert sorted(s["segment_type"] for s in segs) == ["large", "small"]
    allocator.free(p)
    allocator.free(q)


@pytest.mark.parametrize(
    ("request_", "segment"),
    [(10 * MiB - 512, 20 * MiB), (10 * MiB - 511, 10 * MiB), (10 * MiB, 10 * MiB),
     (10 * MiB + 1, 12 * MiB), (20 * MiB + 1, 22 * MiB)],
)
def test_large_segment_size_around_10_mib(allocator: CachingAllocator, request_: int,
                                          segment: int) -> None:
    p = allocator.malloc(request_)
    assert stat(allocator, "reserved_bytes.large_pool.current") == segment
    allocator.free(p)


def test_two_mib_small_segment_holds_two_one_mib_blocks(allocator: CachingAllocator) -> None:
    p = allocator.malloc(MiB)
    # The 2 MiB segment is split: a free 1 MiB remainder in a split segment.
    assert pools(allocator, "inactive_split") == (1, 0, 1)
    assert pools(allocator, "inactive_split_bytes") == (MiB, 0, MiB)
    q = allocator.malloc(MiB)
    # The remainder is handed out whole: no new segment, no free block left.
    assert stat(allocator, "segment.all.current") == 1
    assert pools(allocator, "inactive_split") == (0, 0, 0)
    assert q == p + MiB
    allocator.free(p)
    allocator.free(q)


# -- rule 4: best fit --------------------------------------------------------------------------


def test_best_fit_large_pool_smallest_then_lowest_address(allocator: CachingAllocator) -> None:
    # Requests of at least 10 MiB get a segment of their own size, so each is one whole block.
    a, b, c, d = (allocator.malloc(n) for n in (12 * MiB, 12 * MiB, 12 * MiB, 14 * MiB))
    assert a < b < c < d
    for p in (c, d, a):
        allocator.free(p)
    reserved = stat(allocator, "reserved_bytes.all.current")
    # Cached: a (12 MiB), c (12 MiB), d (14 MiB). 11 MiB fits all three; the smallest size is 12
    # MiB, and of the two 12 MiB blocks the lower address, a. The 1 MiB left is not > 1 MiB: no
    # split.
    assert allocator.malloc(11 * MiB) == a
    assert stat(allocator, "allocated_bytes.all.current") == 12 * MiB + 12 * MiB
    assert allocator.malloc(12 * MiB) == c
    # Only d (14 MiB) is left: 2 MiB over, which is > 1 MiB, so it is split.
    assert allocator.malloc(12 * MiB) == d
    assert stat(allocator, "reserved_bytes.all.current") == reserved
    assert pools(allocator, "inactive_split_bytes") == (2 * MiB, 2 * MiB, 0)


def test_best_fit_small_pool(allocator: CachingAllocator) -> None:
    x1 = allocator.malloc(4 * KiB)
    s1 = allocator.malloc(512)
    x2 = allocator.malloc(4 * KiB)
    s2 = allocator.malloc(1024)
    x3 = allocator.malloc(4 * KiB)
    s3 = allocator.malloc(512)
    x4 = allocator.malloc(4 * KiB)
    for p in (s3, s2, s1):  # free the higher 512 B hole first
        allocator.free(p)
    # Holes: s1 (512), s2 (1024), s3 (512) and the tail. 600 B rounds to 1024: only s2 fits
    # exactly; the tail is bigger.
    assert allocator.malloc(600) == s2
    # Two 512 B holes: the lower address wins, whatever order they were freed in.
    assert allocator.malloc(1) == s1
    assert allocator.malloc(512) == s3
    for p in (x1, x2, x3, x4, s1, s2, s3):
        allocator.free(p)


def test_streams_do_not_share_cached_blocks(allocator: CachingAllocator) -> None:
    p = allocator.malloc(512, stream=1)
    allocator.free(p)
    q = allocator.malloc(512, stream=2)
    # Stream 2 cannot use stream 1's cached segment: a second segment.
    assert stat(allocator, "segment.all.current") == 2
    assert q != p
    assert allocator.malloc(512, stream=1) == p
    streams = sorted(s["stream"] for s in allocator.snapshot()["segments"])
    assert streams == [1, 2]
    allocator.free(p)
    allocator.free(q)


# -- rule 5: split and merge -------------------------------------------------------------------


def test_small_split_when_remainder_is_512(allocator: CachingAllocator) -> None:
    p = allocator.malloc(MiB)
    q = allocator.malloc(MiB - 512)
    # The 1 MiB remainder minus (1 MiB - 512) leaves 512 B: >= 512, so split.
    assert block_sizes(allocator) == [[(MiB, "a"), (MiB - 512, "a"), (512, "i")]]
    r = allocator.malloc(1)
    assert block_sizes(allocator) == [[(MiB, "a"), (MiB - 512, "a"), (512, "a")]]
    for x in (p, q, r):
        allocator.free(x)


def test_large_split_needs_more_than_1_mib_left(allocator: CachingAllocator) -> None:
    # 19 MiB gets a 20 MiB segment; 1 MiB would be left, which is not > 1 MiB: the whole
    # segment is handed out.
    p = allocator.malloc(19 * MiB)
    assert pools(allocator, "allocated_bytes") == (20 * MiB, 20 * MiB, 0)
    assert pools(allocator, "requested_bytes") == (19 * MiB, 19 * MiB, 0)
    assert pools(allocator, "inactive_split") == (0, 0, 0)
    allocator.free(p)
    # 512 B less leaves 1 MiB + 512 B: split.
    q = allocator.malloc(19 * MiB - 512)
    assert block_sizes(allocator) == [[(19 * MiB - 512, "a"), (MiB + 512, "i")]]
    assert pools(allocator, "inactive_split") == (1, 1, 0)
    assert pools(allocator, "inactive_split_bytes") == (MiB + 512, MiB + 512, 0)
    allocator.free(q)
    assert block_sizes(allocator) == [[(20 * MiB, "i")]]


def test_merge_on_free_and_inactive_split_accounting(allocator: CachingAllocator) -> None:
    seg = 2 * MiB
    a = allocator.malloc(512)  # split: remainder seg - 512 is a new inactive split block
    assert pools(allocator, "inactive_split_bytes") == (seg - 512, 0, seg - 512)
    b = allocator.malloc(512)  # the split remainder shrinks by 512
    c = allocator.malloc(512)
    assert pools(allocator, "inactive_split") == (1, 0, 1)
    assert pools(allocator, "inactive_split_bytes") == (seg - 1536, 0, seg - 1536)
    allocator.free(a)  # no free neighbour: one more inactive split block
    assert pools(allocator, "inactive_split") == (2, 0, 2)
    assert pools(allocator, "inactive_split_bytes") == (seg - 1024, 0, seg - 1024)
    allocator.free(c)  # merges with the tail: still two free blocks, 512 B more
    assert pools(allocator, "inactive_split") == (2, 0, 2)
    assert pools(allocator, "inactive_split_bytes") == (seg - 512, 0, seg - 512)
    assert block_sizes(allocator) == [[(512, "i"), (512, "a"), (seg - 1024, "i")]]
    allocator.free(b)  # merges both sides: the segment is whole again, not split
    assert block_sizes(allocator) == [[(seg, "i")]]
    s = allocator.memory_stats()
    assert s["inactive_split.all.current"] == 0
    assert s["inactive_split.all.peak"] == 2
    # A free changes the counters by its net effect only (PyTorch's free_block): free c
    # swallows one block and adds one, so the count does not move. Added: 1 (a's remainder),
    # 1 (free a); removed: 2 (free b).
    assert s["inactive_split.all.allocated"] == 2
    assert s["inactive_split.all.freed"] == 2
    assert s["inactive_split_bytes.all.current"] == 0
    assert s["inactive_split_bytes.all.peak"] == seg - 512
    # Added: seg-512 (split), 512 (free a), net 512 (free c); removed: 512 (b), 512 (c),
    # net seg-512 (free b swallows 512 and seg-1024 and leaves a whole segment).
    assert s["inactive_split_bytes.all.allocated"] == (seg - 512) + 512 + 512
    assert s["inactive_split_bytes.all.freed"] == 512 + 512 + (seg - 512)


def test_reusing_a_split_free_block_whole_removes_it(allocator: CachingAllocator) -> None:
    a = allocator.malloc(512)
    b = allocator.malloc(512)
    allocator.free(a)
    assert pools(allocator, "inactive_split") == (2, 0, 2)
    # The 512 B hole at a is reused exactly: no split, and one inactive split block fewer.
    assert allocator.malloc(512) == a
    assert pools(allocator, "inactive_split") == (1, 0, 1)
    assert pools(allocator, "inactive_split_bytes") == (2 * MiB - 1024, 0, 2 * MiB - 1024)
    allocator.free(a)
    allocator.free(b)


# -- rule 6: oversize blocks -------------------------------------------------------------------


def test_oversize_block_is_never_split() -> None:
    a = make(max_split_size_mb=32)
    p = a.malloc(40 * MiB)
    a.free(p)
    # 32 MiB is not below max_split_size, and 40 MiB is less than 20 MiB larger: it gets the
    # whole 40 MiB block.
    q = a.malloc(32 * MiB)
    assert q == p
    assert pools(a, "allocated_bytes") == (40 * MiB, 40 * MiB, 0)
    assert pools(a, "inactive_split") == (0, 0, 0)
    s = a.memory_stats()
    assert (s["oversize_allocations.current"], s["oversize_segments.current"]) == (1, 1)
    assert s["max_split_size"] == 32 * MiB
    a.free(q)
    assert a.memory_stats()["oversize_allocations.current"] == 0


def test_oversize_block_not_given_to_a_request_below_max_split_size() -> None:
    a = make(max_split_size_mb=32)
    p = a.malloc(40 * MiB)
    a.free(p)
    # Below max_split_size: the 40 MiB block is refused and a fresh segment (32 MiB - 512
    # rounded up to 2 MiB: 32 MiB) is made. 512 B would be left: no split, so the user holds a
    # 32 MiB block, which is itself oversize.
    q = a.malloc(32 * MiB - 512)
    assert q != p
    assert stat(a, "reserved_bytes.all.current") == 40 * MiB + 32 * MiB
    assert stat(a, "allocated_bytes.all.current") == 32 * MiB
    assert stat(a, "oversize_allocations.current") == 1
    assert stat(a, "oversize_segments.current") == 2
    a.free(q)


def test_oversize_block_not_given_when_20_mib_or_more_larger() -> None:
    a = make(max_split_size_mb=32)
    p = a.malloc(52 * MiB)
    a.free(p)
    # 52 MiB >= 32 MiB + 20 MiB: refused, a new segment.
    q = a.malloc(32 * MiB)
    assert q != p
    assert stat(a, "segment.all.current") == 2
    # 52 MiB < (32 MiB + 512) + 20 MiB: accepted.
    r = a.malloc(32 * MiB + 1)
    assert r == p
    assert stat(a, "allocated_bytes.all.current") == 32 * MiB + 52 * MiB
    a.free(q)
    a.free(r)


def test_max_split_size_unset_reports_minus_one(allocator: CachingAllocator) -> None:
    assert stat(allocator, "max_split_size") == -1
    p = allocator.malloc(200 * MiB)
    assert stat(allocator, "oversize_allocations.current") == 0
    allocator.free(p)


# -- rule 7: the retry ladder ------------------------------------------------------------------


def test_release_all_then_retry_counts_a_retry() -> None:
    a = make(64 * MiB)
    p, q = a.malloc(30 * MiB), a.malloc(30 * MiB)
    a.free(p)
    a.free(q)
    # 40 MiB fits no cached block; 60 + 40 > 64 MiB on the device. No max_split_size, so no
    # oversize release; then every whole cached segment goes and the retry succeeds.
    r = a.malloc(40 * MiB)
    s = a.memory_stats()
    assert s["num_alloc_retries"] == 1
    assert s["num_ooms"] == 0
    assert s["num_device_free"] == 2
    assert s["num_sync_all_streams"] == 1
    assert s["reserved_bytes.all.current"] == 40 * MiB
    assert s["reserved_bytes.all.peak"] == 60 * MiB
    a.free(r)


def test_release_oversize_from_the_largest_down() -> None:
    a = make(128 * MiB, max_split_size_mb=32)
    x, y, z = a.malloc(40 * MiB), a.malloc(50 * MiB), a.malloc(30 * MiB)
    for p in (x, y, z):
        a.free(p)
    # 60 MiB: no cached block fits; 120 + 60 > 128. No single cached block of >= 60 MiB, so
    # oversize blocks go from the largest down until 60 MiB are released: 50, then 40. The
    # 30 MiB block is not oversize and stays. The retry after that is not counted.
    w = a.malloc(60 * MiB)
    s = a.memory_stats()
    assert s["num_device_free"] == 2
    assert s["num_alloc_retries"] == 0
    assert s["num_sync_all_streams"] == 0
    assert s["reserved_bytes.all.current"] == 30 * MiB + 60 * MiB
    assert s["oversize_segments.current"] == 1
    assert s["oversize_segments.freed"] == 2
    sizes = sorted(seg["total_size"] for seg in a.snapshot()["segments"])
    assert sizes == [30 * MiB, 60 * MiB]
    a.free(w)


def test_release_oversize_takes_the_smallest_single_block_large_enough() -> None:
    a = make(160 * MiB, max_split_size_mb=32)
    x, y, z = a.malloc(60 * MiB), a.malloc(62 * MiB), a.malloc(30 * MiB)
    for p in (x, y, z):
        a.free(p)
    # 36 MiB: the cache refuses 60 and 62 MiB (each >= 36 + 20) and 30 MiB is too small.
    # 152 + 36 > 160 on the device. The smallest cached block of >= max(36, 32) MiB is the
    # 60 MiB one: it alone goes.
    a.malloc(36 * MiB)
    sizes = sorted(seg["total_size"] for seg in a.snapshot()["segments"])
    assert sizes == [30 * MiB, 36 * MiB, 62 * MiB]
    assert stat(a, "num_device_free") == 1
    assert stat(a, "num_alloc_retries") == 0


def test_release_oversize_only_on_the_same_stream() -> None:
    a = make(128 * MiB, max_split_size_mb=32)
    p = a.malloc(100 * MiB, stream=1)
    a.free(p)
    # Stream 2 cannot release stream 1's oversize block that way; the last step (release
    # everything, counted as a retry) does.
    a.malloc(40 * MiB, stream=2)
    assert stat(a, "num_alloc_retries") == 1
    assert stat(a, "num_device_free") == 1


def test_out_of_memory_after_the_whole_ladder() -> None:
    a = make(64 * MiB)
    live = a.malloc(40 * MiB)
    cached = a.malloc(512)
    a.free(cached)  # a whole cached small segment: the last step releases it
    before = a.memory_stats()
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(30 * MiB)
    assert isinstance(info.value, MemoryError)
    report = info.value.report
    assert (report.requested, report.rounded, report.segment_size) == (30 * MiB, 30 * MiB,
                                                                       30 * MiB)
    assert report.allocated == 40 * MiB
    assert "out of memory" in str(info.value)
    after = a.memory_stats()
    assert after["num_ooms"] == before["num_ooms"] + 1 == 1
    assert after["num_alloc_retries"] == 1
    # The small segment was released on the way; nothing else changed.
    assert after["reserved_bytes.all.current"] == 40 * MiB
    assert after["segment.all.current"] == 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocation.all.current"] == 1
    a.check_invariants()
    # A second OOM with nothing cached changes nothing but the counters.
    before = a.memory_stats()
    with pytest.raises(OutOfMemoryError):
        a.malloc(30 * MiB)
    after = a.memory_stats()
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {"num_ooms", "num_alloc_retries", "num_sync_all_streams"}
    a.free(live)
    a.check_invariants()
    a.free(a.malloc(30 * MiB))  # and it works once there is room


def test_fail_next_one_is_absorbed_by_the_retry() -> None:
    a = make(1 * GiB)
    a.device.fail_next(1)  # type: ignore[attr-defined]
    p = a.malloc(512)
    s = a.memory_stats()
    assert (s["num_alloc_retries"], s["num_ooms"], s["num_device_alloc"]) == (1, 0, 1)
    a.free(p)


def test_fail_next_two_is_an_oom() -> None:
    a = make(1 * GiB)
    a.device.fail_next(2)  # type: ignore[attr-defined]
    with pytest.raises(OutOfMemoryError):
        a.malloc(512)
    s = a.memory_stats()
    assert (s["num_alloc_retries"], s["num_ooms"], s["num_device_alloc"]) == (1, 1, 0)
    assert s["reserved_bytes.all.current"] == 0
    a.free(a.malloc(512))


# -- rule 8: the memory fraction and garbage collection -----------------------------------------


def test_fraction_caps_reserved_bytes() -> None:
    a = make(1 * GiB, per_process_memory_fraction=0.25)  # cap 256 MiB
    p = a.malloc(128 * MiB)
    q = a.malloc(128 * MiB)  # reserved == cap is allowed
    assert stat(a, "reserved_bytes.all.current") == 256 * MiB
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(512)  # a 2 MiB segment would pass the cap; the device has room
    assert info.value.report.cap == 256 * MiB
    assert stat(a, "num_ooms") == 1
    a.free(q)
    r = a.malloc(64 * MiB)  # best fit reuses q's cached segment: no new segment needed
    assert r == q
    a.free(p)
    a.free(r)


def test_set_memory_fraction_applies_at_once() -> None:
    a = make(1 * GiB)
    p = a.malloc(300 * MiB)
    a.set_memory_fraction(0.25)
    with pytest.raises(OutOfMemoryError):
        a.malloc(512)
    a.set_memory_fraction(None)
    a.free(a.malloc(512))
    a.free(p)


def _gc_sequence(a: CachingAllocator) -> list[int]:
    # Only large requests, so only the large pool's search clock moves (one tick per malloc).
    p = a.malloc(12 * MiB)  # search 1: miss, segment 12 MiB
    a.free(p)  # cached at search 1
    q = a.malloc(22 * MiB)  # search 2: 12 MiB is too small; segment 22 MiB
    a.free(q)  # cached at search 2
    c = a.malloc(40 * MiB)  # search 3: miss; reserved 34 MiB, not above a 50 MiB threshold
    d = a.malloc(26 * MiB)  # search 4: miss; reserved 74 MiB
    return [c, d]


def test_garbage_collection_releases_old_blocks_until_the_excess_is_gone() -> None:
    a = make(200 * MiB, per_process_memory_fraction=0.5, garbage_collection_threshold=0.5)
    live = _gc_sequence(a)
    # Cap 100 MiB, threshold 50 MiB. Before d's segment reserved is 74 MiB: 24 MiB too many.
    # Ages at search 4: the 12 MiB block 3, the 22 MiB block 2; average 2.5, so only the
    # 12 MiB block goes. 12 < 24: again, the average of what is left is 2, so the 22 MiB
    # block goes too.
    s = a.memory_stats()
    assert s["num_device_free"] == 2
    assert s["reserved_bytes.all.current"] == 66 * MiB
    assert sorted(seg["total_size"] for seg in a.snapshot()["segments"]) == [26 * MiB, 40 * MiB]
    for p in live:
        a.free(p)


def test_garbage_collection_releases_only_blocks_of_at_least_average_age() -> None:
    a = make(200 * MiB, per_process_memory_fraction=0.5, garbage_collection_threshold=0.5)
    p = a.malloc(20 * MiB)  # search 1
    a.free(p)  # cached at 1
    q = a.malloc(22 * MiB)  # search 2: 20 MiB too small
    a.free(q)  # cached at 2
    c = a.malloc(24 * MiB)  # search 3: reserved 42 MiB <= 50 MiB: no collection
    d = a.malloc(26 * MiB)  # search 4: reserved 66 MiB > 50 MiB: 16 MiB to release
    # Ages 3 (20 MiB) and 2 (22 MiB), average 2.5: the 20 MiB block goes, which is enough.
    sizes = sorted(seg["total_size"] for seg in a.snapshot()["segments"])
    assert sizes == [22 * MiB, 24 * MiB, 26 * MiB]
    assert stat(a, "num_device_free") == 1
    a.free(c)
    a.free(d)


def test_no_garbage_collection_without_threshold_or_with_fraction_one() -> None:
    for capacity, config in (
        (200 * MiB, {"per_process_memory_fraction": 0.5}),
        # A fraction of 1 sets no cap in PyTorch, so garbage collection is off (a cap of the
        # whole 100 MiB would make a 50 MiB threshold, which the sequence passes).
        (100 * MiB, {"per_process_memory_fraction": 1.0, "garbage_collection_threshold": 0.5}),
        (100 * MiB, {"garbage_collection_threshold": 0.5}),
    ):
        a = make(capacity, **config)
        live = _gc_sequence(a)
        assert stat(a, "num_device_free") == 0, config
        # 12 + 22 + 40 + 26 MiB, all kept.
        assert stat(a, "reserved_bytes.all.current") == 100 * MiB, config
        for p in live:
            a.free(p)


def test_garbage_collection_leaves_split_segments() -> None:
    a = make(200 * MiB, per_process_memory_fraction=0.5, garbage_collection_threshold=0.5)
    keep = a.malloc(2 * MiB)  # a 20 MiB segment, split: never collected
    p = a.malloc(32 * MiB)
    a.free(p)
    # Reserved 52 MiB > 50 MiB: of the cached blocks only the 32 MiB one is a whole segment
    # (the 18 MiB remainder of the first segment is split); it goes.
    c = a.malloc(40 * MiB)
    assert sorted(seg["total_size"] for seg in a.snapshot()["segments"]) == [20 * MiB, 40 * MiB]
    a.free(keep)
    a.free(c)


# -- rule 9: empty_cache -----------------------------------------------------------------------


def test_empty_cache_keeps_segments_with_live_blocks(allocator: CachingAllocator) -> None:
    live_small = allocator.malloc(512)
    live_large = allocator.malloc(2 * MiB)  # in a 20 MiB segment, split
    gone_small = allocator.malloc(MiB)  # fills the rest of... no: 1 MiB fits the small segment
    allocator.free(gone_small)
    gone_large = allocator.malloc(30 * MiB)
    allocator.free(gone_large)
    other = allocator.malloc(512, stream=7)
    allocator.free(other)
    # Segments: small (live 512), large 20 MiB (live 2 MiB), large 30 MiB (cached whole),
    # small on stream 7 (cached whole).
    assert stat(allocator, "segment.all.current") == 4
    released = allocator.empty_cache()
    assert released == 30 * MiB + 2 * MiB
    s = allocator.memory_stats()
    assert s["segment.all.current"] == 2
    assert s["reserved_bytes.all.current"] == 22 * MiB
    assert s["num_sync_all_streams"] == 1
    assert allocator.empty_cache() == 0
    allocator.free(live_small)
    allocator.free(live_large)
    assert allocator.empty_cache() == 22 * MiB
    assert stat(allocator, "reserved_bytes.all.current") == 0
    assert stat(allocator, "inactive_split.all.current") == 0


# -- stats: peaks, resets, watermarks, exact values -------------------------------------------


def test_reset_peak_and_accumulated(allocator: CachingAllocator) -> None:
    p = allocator.malloc(3 * MiB)
    q = allocator.malloc(3 * MiB)
    allocator.free(q)
    s = allocator.memory_stats()
    assert s["allocated_bytes.all.peak"] == 6 * MiB
    allocator.reset_peak_memory_stats()
    s = allocator.memory_stats()
    assert s["allocated_bytes.all.peak"] == 3 * MiB
    assert s["allocated_bytes.large_pool.peak"] == 3 * MiB
    assert s["inactive_split_bytes.all.peak"] == s["inactive_split_bytes.all.current"]
    assert s["reserved_bytes.all.peak"] == 20 * MiB
    assert s["allocated_bytes.all.allocated"] == 6 * MiB  # accumulated counters stay
    allocator.reset_accumulated_memory_stats()
    s = allocator.memory_stats()
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"] == 0
    assert s["segment.all.allocated"] == 0
    assert s["num_device_alloc"] == 0
    assert s["allocated_bytes.all.current"] == 3 * MiB  # current values stay
    assert s["allocated_bytes.all.peak"] == 3 * MiB
    allocator.free(p)
    # Freed counts from the reset on.
    assert stat(allocator, "allocated_bytes.all.freed") == 3 * MiB


def test_watermark_leaves_the_users_peak_alone(allocator: CachingAllocator) -> None:
    big = allocator.malloc(8 * MiB)
    allocator.free(big)
    peak = stat(allocator, "allocated_bytes.all.peak")
    w = allocator.start_watermark("cell 1")
    assert (w.start_allocated, w.peak_allocated) == (0, 0)
    assert w.start_reserved == w.peak_reserved == 20 * MiB
    p = allocator.malloc(MiB)
    q = allocator.malloc(2 * MiB)
    allocator.free(p)
    allocator.free(q)
    r = allocator.malloc(30 * MiB)  # a new segment: reserved peak moves
    allocator.free(r)
    assert w.peak_allocated == 30 * MiB
    assert w.peak_reserved == 20 * MiB + 2 * MiB + 30 * MiB
    assert allocator.stop_watermark(w) is w
    allocator.free(allocator.malloc(100 * MiB))
    assert w.peak_allocated == 30 * MiB  # stopped: no longer follows
    assert stat(allocator, "allocated_bytes.all.peak") == 100 * MiB > peak
    # Starting and reading a watermark never reset the user's peaks.
    allocator.start_watermark("cell 2")
    assert stat(allocator, "allocated_bytes.all.peak") == 100 * MiB


def test_nested_watermarks_track_separately(allocator: CachingAllocator) -> None:
    outer = allocator.start_watermark("outer")
    p = allocator.malloc(4 * MiB)
    inner = allocator.start_watermark("inner")
    allocator.free(p)
    q = allocator.malloc(MiB)
    allocator.stop_watermark(inner)
    allocator.stop_watermark(outer)
    assert outer.peak_allocated == 4 * MiB
    assert inner.start_allocated == 4 * MiB and inner.peak_allocated == 4 * MiB
    allocator.free(q)


def test_exact_stats_of_a_scripted_sequence(allocator: CachingAllocator) -> None:
    a = allocator
    s1 = a.malloc(1000)  # 1024 B, small; 2 MiB segment split, remainder 2 MiB - 1024
    l1 = a.malloc(3 * MiB)  # large; 20 MiB segment split, remainder 17 MiB
    l2 = a.malloc(5 * MiB)  # from the 17 MiB remainder, which shrinks to 12 MiB
    a.free(l1)  # 3 MiB hole, no free neighbour: inactive split +1
    l3 = a.malloc(3 * MiB - 100)  # rounds to 3 MiB - 512: best fit is the 3 MiB hole;
    #                               512 B left is not > 1 MiB, so the whole 3 MiB is used
    a.free(s1)  # the small segment is whole again
    big = a.malloc(12 * MiB)  # the 12 MiB remainder fits exactly: no split
    expected = {
        "allocation.all.current": 3, "allocation.all.peak": 3,
        "allocation.all.allocated": 5, "allocation.all.freed": 2,
        "allocation.large_pool.current": 3, "allocation.large_pool.peak": 3,
        "allocation.small_pool.current": 0, "allocation.small_pool.peak": 1,
        "active.all.current": 3, "active.all.peak": 3,
        "segment.all.current": 2, "segment.large_pool.current": 1,
        "segment.small_pool.current": 1, "segment.all.allocated": 2, "segment.all.freed": 0,
        "allocated_bytes.all.current": 20 * MiB,
        # peak: after s1, l1, l2: 1024 + 8 MiB; after l3: 1024 + 8 MiB; after big: 20 MiB
        "allocated_bytes.all.peak": 20 * MiB,
        "allocated_bytes.all.allocated": 1024 + 3 * MiB + 5 * MiB + 3 * MiB + 12 * MiB,
        "allocated_bytes.all.freed": 3 * MiB + 1024,
        "allocated_bytes.small_pool.peak": 1024,
        "active_bytes.all.current": 20 * MiB,
        "requested_bytes.all.current": 5 * MiB + (3 * MiB - 100) + 12 * MiB,
        "requested_bytes.all.peak": 5 * MiB + (3 * MiB - 100) + 12 * MiB,
        "requested_bytes.all.freed": 3 * MiB + 1000,
        "reserved_bytes.all.current": 22 * MiB, "reserved_bytes.all.peak": 22 * MiB,
        "reserved_bytes.small_pool.current": 2 * MiB,
        # inactive_split: s1 split (+1 small), l1 split (+1 large), l2 shrinks it, free l1
        # (+1 large), l3 takes the hole whole (-1 large), free s1 merges (-1 small), big takes
        # the remainder whole (-1 large).
        "inactive_split.all.current": 0, "inactive_split.all.peak": 3,
        "inactive_split.all.allocated": 3, "inactive_split.all.freed": 3,
        "inactive_split.large_pool.peak": 2, "inactive_split.small_pool.peak": 1,
        "inactive_split_bytes.all.current": 0,
        # after l1: (2 MiB - 1024) + 17 MiB; after l2: (2 MiB - 1024) + 12 MiB;
        # after free l1: (2 MiB - 1024) + 15 MiB, the peak.
        "inactive_split_bytes.all.peak": 17 * MiB + 2 * MiB - 1024,
        "inactive_split_bytes.all.allocated": (2 * MiB - 1024) + 17 * MiB + 3 * MiB,
        "inactive_split_bytes.all.freed": 5 * MiB + 3 * MiB + (2 * MiB - 1024) + 12 * MiB,
        "inactive_split_bytes.large_pool.peak": 17 * MiB,
        "num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 2, "num_device_free": 0,
        "oversize_allocations.current": 0, "oversize_segments.current": 0,
    }
    stats = a.memory_stats()
    assert {k: stats[k] for k in expected} == expected
    assert a.memory_allocated() == 20 * MiB
    assert a.memory_reserved() == 22 * MiB
    for p in (l2, l3, big):
        a.free(p)
    # Everything free: the large segment is whole again.
    stats = a.memory_stats()
    assert stats["inactive_split.all.current"] == 0
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["requested_bytes.all.current"] == 0


def test_memory_stats_has_the_full_key_grammar(allocator: CachingAllocator) -> None:
    keys = set(allocator.memory_stats())
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{field}" in keys
    for name in ("oversize_allocations", "oversize_segments"):
        for field in ("current", "peak", "allocated", "freed"):
            assert f"{name}.{field}" in keys
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                "max_split_size"):
        assert key in keys


def test_memory_stats_read_straight_from_the_core_equal_the_stats_objects(
        allocator: CachingAllocator) -> None:
    allocator.set_config(allocator.config.updated("max_split_size_mb:40"))
    kept = [allocator.malloc(n) for n in (512, 3 << 20, 50 << 20, 9 << 20)]
    allocator.free(kept.pop(1))
    allocator.free(allocator.malloc(2 << 20))
    flat = allocator.stats.as_flat_dict(40 << 20)
    assert allocator.memory_stats() == flat and list(allocator.memory_stats()) == list(flat)
    for p in kept:
        allocator.free(p)


def test_free_of_an_unknown_or_freed_address(allocator: CachingAllocator) -> None:
    p = allocator.malloc(512)
    with pytest.raises(ValueError, match="did not hand out"):
        allocator.free(p + 512)
    allocator.free(p)
    with pytest.raises(ValueError, match="already freed"):
        allocator.free(p)
    assert stat(allocator, "allocation.all.freed") == 1


def test_public_malloc_signature_outside_debug_mode() -> None:
    # The hot path may bypass Python wrappers, but the public call shapes must hold:
    # ``malloc(nbytes, stream=0)`` with stream by keyword, and ``free(ptr)``.
    a = CachingAllocator(SimulatedDevice(GiB))
    p = a.malloc(512, stream=3)
    q = a.malloc(nbytes=512)
    assert sorted(seg["stream"] for seg in a.snapshot()["segments"]) == [0, 3]
    a.free(p)
    a.free(q)
    a.check_invariants()
