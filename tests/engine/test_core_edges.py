"""Both cores at the edges: runtime config changes, sizes near 64 bits, arguments of the wrong
type, and device callbacks that re-enter the allocator. Each case runs on the Python and the C
core and, where both exist, checks that they agree."""

from __future__ import annotations

import os
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from jupyter_gpumem import (
    AllocatorConfig,
    CachingAllocator,
    ManualClock,
    OutOfMemoryError,
    SimulatedDevice,
)
from jupyter_gpumem.engine.allocator import native_core_available

MiB = 1 << 20
#: Whether to run the C core too: where it is built, and always under CI=true (which builds it,
#: so that a broken build fails here rather than skips).
WITH_C = native_core_available() or os.environ.get("CI") == "true"
CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not WITH_C, reason="the C core is not built"))]


class HookedDevice(SimulatedDevice):
    """A simulated device whose next ``free`` (or ``malloc``) first runs a callback, as a
    garbage collection inside CuPy's device calls can run finalizers that use the allocator."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, clock=ManualClock(tick_ns=1000))
        self.on_free: Callable[[], None] | None = None
        self.on_malloc: Callable[[], None] | None = None

    def free(self, ptr: int) -> None:
        hook, self.on_free = self.on_free, None
        if hook is not None:
            hook()
        super().free(ptr)

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        hook, self.on_malloc = self.on_malloc, None
        if hook is not None:
            hook()
        return super().malloc(nbytes, stream)


def make(native: bool, capacity: int = 256 * MiB, **config: Any) -> CachingAllocator:
    return CachingAllocator(HookedDevice(capacity), AllocatorConfig(**config), native=native)


def settled(a: CachingAllocator) -> None:
    """The allocator agrees with itself and with the device, and gives everything back."""
    a.check_invariants()
    assert a.memory_reserved() == a.device.used  # type: ignore[attr-defined]
    for block in a.state().blocks:
        if block.allocated:
            a.free(block.address)
    a.empty_cache()
    assert a.memory_reserved() == 0
    assert a.device.live_segments() == {}  # type: ignore[attr-defined]


def blocks(a: CachingAllocator) -> list[list[tuple[int, str]]]:
    return [[(b["size"] // MiB, b["state"][0]) for b in s["blocks"]]
            for s in a.snapshot()["segments"]]


# -- 1. lowering max_split_size_mb at runtime ---------------------------------------------------


@pytest.mark.parametrize("native", CORES)
def test_lowering_max_split_size_leaves_split_pieces_cached(native: bool) -> None:
    a = make(native)
    p = a.malloc(100 * MiB)
    a.free(p)
    q = a.malloc(3 * MiB)  # splits the 100 MiB segment: 3 MiB live, 97 MiB cached
    a.set_config(AllocatorConfig(max_split_size_mb=64))
    # The 97 MiB piece is now oversize but not a whole segment: the ladder must not release it
    # (Note [Oversize blocks after a runtime change]), so 200 MiB cannot be had.
    with pytest.raises(OutOfMemoryError):
        a.malloc(200 * MiB)
    assert a.memory_reserved() == a.device.used == 100 * MiB  # type: ignore[attr-defined]
    assert blocks(a) == [[(3, "a"), (97, "i")]]
    a.free(q)
    assert blocks(a) == [[(100, "i")]]
    a.check_invariants()
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_an_oversize_piece_is_reused_whole_but_never_split(native: bool) -> None:
    a = make(native)
    p = a.malloc(100 * MiB)
    a.free(p)
    q = a.malloc(3 * MiB)
    a.set_config(AllocatorConfig(max_split_size_mb=64))
    r = a.malloc(40 * MiB)  # below 64 MiB: the 97 MiB oversize piece is not for it
    assert a.memory_reserved() == 140 * MiB
    s = a.malloc(80 * MiB)  # at least 64 MiB and less than 20 MiB smaller: the piece, unsplit
    assert s == q + 3 * MiB
    assert a.memory_stats()["oversize_allocations.current"] == 1
    assert a.memory_stats()["oversize_segments.current"] == 1  # the 100 MiB segment
    for ptr in (q, r, s):
        a.free(ptr)
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_the_ladder_still_releases_whole_oversize_segments_after_lowering(native: bool) -> None:
    a = make(native, capacity=300 * MiB)
    big = a.malloc(100 * MiB)
    p = a.malloc(100 * MiB)
    a.free(p)
    q = a.malloc(3 * MiB)  # splits the cached 100 MiB segment (p's)
    a.free(big)  # a whole 100 MiB segment, cached
    a.set_config(AllocatorConfig(max_split_size_mb=64))
    # Releasing oversize blocks from the largest down frees the whole 100 MiB segment and skips
    # the 97 MiB piece: not enough, so the last rung (all whole segments, a retry) runs too.
    r = a.malloc(150 * MiB)
    assert a.memory_stats()["num_alloc_retries"] == 1
    assert a.memory_stats()["num_device_free"] == 1
    assert a.memory_reserved() == a.device.used == 250 * MiB  # type: ignore[attr-defined]
    assert blocks(a)[0] == [(3, "a"), (97, "i")] or blocks(a)[1] == [(3, "a"), (97, "i")]
    for ptr in (q, r):
        a.free(ptr)
    settled(a)


# -- 2. sizes near 64 bits, and configs out of range --------------------------------------------


HUGE = [2**62 + 1, 2**62 + 2**61 + 1, 2**63 - 512, 2**63 - 511, 2**63 - 1, 2**63, 2**64, 2**100]


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("nbytes", HUGE)
@pytest.mark.parametrize("divisions", [None, 2])
def test_a_request_no_device_holds_is_out_of_memory(native: bool, nbytes: int,
                                                    divisions: int | None) -> None:
    a = make(native, roundup_power2_divisions=divisions)
    a.record_history(stacks=False)
    keep = a.malloc(5 * MiB)
    cached = a.malloc(30 * MiB)
    a.free(cached)
    reserved = a.memory_reserved()
    calls = a.device.malloc_calls  # type: ignore[attr-defined]
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(nbytes)
    report = info.value.report  # type: ignore[attr-defined]
    assert (report.requested, report.rounded, report.segment_size) == (nbytes, nbytes, nbytes)
    assert a.device.malloc_calls == calls  # type: ignore[attr-defined]
    assert a.memory_reserved() == reserved  # the cache is left alone
    stats = a.memory_stats()
    assert (stats["num_ooms"], stats["num_alloc_retries"]) == (1, 0)
    oom = [e for e in a.snapshot()["device_traces"][0] if e["action"] == "oom"]
    assert [e["size"] for e in oom] == [min(nbytes, 2**63 - 1)]
    a.free(keep)
    settled(a)


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("divisions", [None, 2, 1024])
def test_the_largest_request_still_runs_the_ladder(native: bool, divisions: int | None) -> None:
    a = make(native, roundup_power2_divisions=divisions)
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(2**62)
    report = info.value.report  # type: ignore[attr-defined]
    assert (report.rounded, report.segment_size) == (2**62, 2**62)
    assert a.memory_stats()["num_alloc_retries"] == 1
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(2**61 + 1)
    # [2**61, 2**62) in 2 steps of 2**60, or 1024 steps of 2**51; else the next 512 B.
    expected = {None: 2**61 + 512, 2: 2**61 + 2**60, 1024: 2**61 + 2**51}[divisions]
    assert info.value.report.rounded == expected  # type: ignore[attr-defined]
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_many_divisions_round_as_plain_512_below_their_threshold(native: bool) -> None:
    a = make(native, roundup_power2_divisions=1024)
    p = a.malloc(1500)
    assert a.block_of(p) == (p, 1536)
    a.free(p)
    settled(a)


# -- 4. arguments of the wrong type ------------------------------------------------------------


class Index:
    """An integer type of a library, as NumPy's are: it has ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


BAD_SIZES: list[tuple[object, type[Exception]]] = [
    (1000.0, TypeError), (float("nan"), TypeError), (Decimal(1000), TypeError),
    (Fraction(1000), TypeError), ("1000", TypeError), (None, TypeError), (True, TypeError),
    (False, TypeError), (-1, ValueError), (-(2**70), ValueError), (Index(-5), ValueError),
]
BAD_STREAMS: list[tuple[object, type[Exception]]] = [
    ("x", TypeError), (1.0, TypeError), (None, TypeError), (True, TypeError),
    (2**63, ValueError), (-(2**63) - 1, ValueError), (Index(2**64), ValueError),
]
BAD_ADDRESSES: list[tuple[object, type[Exception]]] = [
    (1.5, TypeError), (0.0, TypeError), ("x", TypeError), (True, TypeError), (None, TypeError),
    (-1, ValueError), (2**64, ValueError), (2**70, ValueError), (-(2**70), ValueError),
    (12345, ValueError),
]


def _refusal(native: bool, call: Callable[[CachingAllocator], object]) -> tuple[str, str]:
    a = make(native)
    live = a.malloc(3000)
    before = (a.stats.to_tuple(), a.state()[:2])
    with pytest.raises((TypeError, ValueError)) as info:
        call(a)
    assert (a.stats.to_tuple(), a.state()[:2]) == before, "a refused call changed the state"
    assert a.empty_cache() == 0  # still works
    a.free(live)
    settled(a)
    return type(info.value).__name__, str(info.value)


@pytest.mark.parametrize(("value", "error"), BAD_SIZES)
def test_bad_sizes_are_refused_alike(value: object, error: type[Exception]) -> None:
    outcomes = [_refusal(native, lambda a: a.malloc(value)) for native in (False, True)
                if native is False or WITH_C]
    assert outcomes[0][0] == error.__name__
    assert len(set(outcomes)) == 1, outcomes


@pytest.mark.parametrize(("value", "error"), BAD_STREAMS)
def test_bad_streams_are_refused_alike(value: object, error: type[Exception]) -> None:
    outcomes = [_refusal(native, lambda a: a.malloc(1000, value)) for native in (False, True)
                if native is False or WITH_C]
    assert outcomes[0][0] == error.__name__
    assert len(set(outcomes)) == 1, outcomes


@pytest.mark.parametrize(("value", "error"), BAD_ADDRESSES)
def test_bad_addresses_are_refused_alike(value: object, error: type[Exception]) -> None:
    outcomes = [_refusal(native, lambda a: a.free(value)) for native in (False, True)
                if native is False or WITH_C]
    assert outcomes[0][0] == error.__name__
    assert len(set(outcomes)) == 1, outcomes


@pytest.mark.parametrize("native", CORES)
def test_integer_types_with_index_are_accepted(native: bool) -> None:
    a = make(native)
    p = a.malloc(Index(1000), stream=Index(7))
    assert a.block_of(p) == (p, 1024)
    assert type(p) is int
    assert {row.stream for row in a.state().blocks} == {7}
    a.free(Index(p))
    assert a.memory_allocated() == 0
    assert a.malloc(Index(0)) == 0
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_numpy_integers_are_accepted_and_numpy_floats_refused(native: bool) -> None:
    import numpy as np

    a = make(native)
    p = a.malloc(np.int64(1000), np.int64(7))
    q = a.malloc(np.uint64(3000))
    assert a.block_of(p) == (p, 1024) and a.block_of(q) == (q, 3072)
    for bad in (np.float64(1000), np.float32(1000), np.bool_(True)):
        with pytest.raises(TypeError, match="nbytes must be an int"):
            a.malloc(bad)
    a.free(np.uint64(p))
    a.free(np.int64(q))
    settled(a)


# -- 3. device callbacks that re-enter the allocator -------------------------------------------


@pytest.mark.parametrize("native", CORES)
def test_a_free_inside_the_devices_free_during_empty_cache(native: bool) -> None:
    a = make(native)
    w = a.malloc(12 * MiB)  # a 12 MiB segment of its own
    live = a.malloc(4 * MiB)  # a 20 MiB segment: 4 MiB live, 16 MiB cached after it
    a.free(w)
    # Releasing the 12 MiB segment runs a finalizer that frees the live block, whose merge
    # swallows the 16 MiB piece that the release loop has not reached yet.
    a.device.on_free = lambda: a.free(live)  # type: ignore[attr-defined]
    assert a.empty_cache() == 12 * MiB
    assert blocks(a) == [[(20, "i")]]  # merged whole, left for the next release
    assert a.empty_cache() == 20 * MiB
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_a_malloc_inside_the_devices_free_during_empty_cache(native: bool) -> None:
    a = make(native)
    p = a.malloc(12 * MiB)
    q = a.malloc(30 * MiB)
    a.free(p)
    a.free(q)
    got: list[int] = []
    # Releasing the first segment runs code that allocates: it must not get the 30 MiB segment
    # that the release is about to give back.
    a.device.on_free = lambda: got.append(a.malloc(30 * MiB))  # type: ignore[attr-defined]
    a.empty_cache()
    assert a.memory_allocated() == 30 * MiB
    assert a.device.used == a.memory_reserved()  # type: ignore[attr-defined]
    assert a.owns(got[0])
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_callbacks_inside_the_release_of_oversize_blocks(native: bool) -> None:
    a = make(native, capacity=200 * MiB, max_split_size_mb=32)
    first = a.malloc(40 * MiB)
    second = a.malloc(50 * MiB)
    small = a.malloc(4 * MiB)
    a.free(first)
    a.free(second)
    # 120 MiB asks the ladder to release the oversize blocks from the largest down; the first
    # release frees a live block and allocates, as a finalizer might.
    got: list[int] = []

    def finalizer() -> None:
        a.free(small)
        got.append(a.malloc(4 * MiB))

    a.device.on_free = finalizer  # type: ignore[attr-defined]
    p = a.malloc(120 * MiB)
    a.check_invariants()
    assert a.memory_reserved() == a.device.used  # type: ignore[attr-defined]
    a.free(p)
    a.free(got[0])
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_callbacks_inside_garbage_collection(native: bool) -> None:
    # A cap of 100 MiB, collected above 50 MiB: 3 × 12 MiB cached and a 20 MiB segment is 56.
    a = make(native, capacity=200 * MiB, per_process_memory_fraction=0.5,
             garbage_collection_threshold=0.5)
    blocks_ = [a.malloc(12 * MiB) for _ in range(3)]
    live = a.malloc(4 * MiB)
    for p in blocks_:
        a.free(p)
    got: list[int] = []

    def finalizer() -> None:
        a.free(live)
        got.append(a.malloc(2 * MiB))

    a.device.on_free = finalizer  # type: ignore[attr-defined]
    p = a.malloc(30 * MiB)  # over the threshold: collects the old whole segments first
    assert a.memory_stats()["num_device_free"] >= 1
    a.check_invariants()
    a.free(p)
    for q in got:
        a.free(q)
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_a_free_inside_the_devices_malloc(native: bool) -> None:
    a = make(native)
    live = a.malloc(4 * MiB)
    a.device.on_malloc = lambda: a.free(live)  # type: ignore[attr-defined]
    p = a.malloc(30 * MiB)
    assert a.memory_allocated() == 30 * MiB
    a.free(p)
    settled(a)


@pytest.mark.parametrize("native", CORES)
def test_a_failing_device_free_loses_no_other_segment(native: bool) -> None:
    a = make(native)
    ptrs = [a.malloc(n * MiB) for n in (12, 14, 16)]
    for p in ptrs:
        a.free(p)

    def fail() -> None:
        raise RuntimeError("device free failed")

    a.device.on_free = fail  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="device free failed"):
        a.empty_cache()
    # The failed segment is off the books; the other two went back to the device.
    assert a.memory_reserved() == 0
    assert sorted(a.device.live_segments().values()) == [12 * MiB]  # type: ignore[attr-defined]
    a.check_invariants()
