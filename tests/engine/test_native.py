"""The C core against the Python reference core: same programs, same numbers, same blocks.

The random programs change the config at runtime (each knob up and down, and the memory
fraction), make the device fail, and make its next free re-enter the allocator. A second set
runs on devices of 4 EiB and 2**63 - 1 B with requests of 2**61 to 2**62 B, with and without
expandable segments and memory fractions (Note [Sizes near 2**63] in ``engine/stats``).
``JUPYTER_GPUMEM_FUZZ_EXAMPLES=N`` runs N programs of each set instead of 300 and 150; the
counts are printed at the end (with ``-s``, or under the sanitizer's ``--capture=sys``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_gpumem import AllocatorConfig, CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.sizes import MAX_VIRTUAL_RANGE
from jupyter_gpumem.engine.allocator import native_core_available

# Skipped where the C core is not built, except under CI=true, which builds it: there a broken
# build must fail these tests rather than skip them.
pytestmark = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")

MiB = 1 << 20
SIZES = st.one_of(
    st.integers(0, 4096),
    st.sampled_from([511, 512, 513, 1536, MiB - 1024, MiB - 512, MiB - 1, MiB, MiB + 1,
                     2 * MiB, 9 * MiB, 10 * MiB - 1, 10 * MiB, 19 * MiB, 20 * MiB,
                     21 * MiB - 512, 21 * MiB, 22 * MiB, 40 * MiB, 41 * MiB, 42 * MiB,
                     64 * MiB + 3, 2**62, 2**62 + 1, 2**63, 2**64]),
    st.integers(1, 80 * MiB),
)
CONFIGS = st.builds(
    AllocatorConfig,
    max_split_size_mb=st.sampled_from([None, 21, 32, 64]),
    roundup_power2_divisions=st.sampled_from([None, 1, 2, 4, 8]),
    garbage_collection_threshold=st.sampled_from([None, 0.3, 0.8]),
    per_process_memory_fraction=st.sampled_from([None, 0.25, 0.5, 1.0]),
    expandable_segments=st.sampled_from([None, False, True, True]),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), SIZES, st.sampled_from([0, 7, 0x1000])),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
        st.tuples(st.just("fail"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("config"), CONFIGS, st.just(0)),
        # one knob at a time, mid-program: max_split_size up and down, and the others
        st.tuples(st.just("max_split_size_mb"), st.sampled_from([None, 21, 24, 32, 48, 64, 100]),
                  st.just(0)),
        st.tuples(st.just("roundup_power2_divisions"), st.sampled_from([None, 1, 2, 4, 1024]),
                  st.just(0)),
        st.tuples(st.just("garbage_collection_threshold"), st.sampled_from([None, 0.3, 0.8]),
                  st.just(0)),
        st.tuples(st.just("fraction"), st.sampled_from([None, 0.1, 0.25, 0.5, 0.9, 1.0]),
                  st.just(0)),
        st.tuples(st.just("expandable_segments"), st.sampled_from([None, False, True]),
                  st.just(0)),
        # the device's next free frees a live block first, as a finalizer in a GC would
        st.tuples(st.just("reenter"), st.integers(0, 1000), st.just(0)),
    ),
    max_size=120,
)
# Devices near 2**63 B: requests of 2**61 to 2**62 B, around the largest request
# (MAX_ALLOC_SIZE) and an expandable segment's range (MAX_VIRTUAL_RANGE), and small ones.
HUGE_DEVICES = st.sampled_from([4 << 60, (1 << 63) - 1])
HUGE_SIZES = st.one_of(
    st.integers(1 << 61, 1 << 62),
    st.sampled_from([1 << 61, 3 << 60, (1 << 62) - 1, 1 << 62, (1 << 62) + 1, (1 << 63) - 1,
                     MAX_VIRTUAL_RANGE - 512, MAX_VIRTUAL_RANGE, MAX_VIRTUAL_RANGE + 1]),
    st.integers(1, 80 * MiB),
)
HUGE_CONFIGS = st.builds(
    AllocatorConfig,
    max_split_size_mb=st.sampled_from([None, 64, 1 << 30]),
    roundup_power2_divisions=st.sampled_from([None, 4]),
    garbage_collection_threshold=st.sampled_from([None, 0.8]),
    per_process_memory_fraction=st.sampled_from([None, 0.25, 0.5, 0.99]),
    expandable_segments=st.sampled_from([None, True]),
)
HUGE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), HUGE_SIZES, st.sampled_from([0, 7])),
        st.tuples(st.just("churn"), HUGE_SIZES, st.sampled_from([0, 7])),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
        st.tuples(st.just("fail"), st.integers(1, 2), st.just(0)),
        st.tuples(st.just("config"), HUGE_CONFIGS, st.just(0)),
        st.tuples(st.just("fraction"), st.sampled_from([None, 0.25, 0.5, 0.99, 0.9999]),
                  st.just(0)),
        st.tuples(st.just("expandable_segments"), st.sampled_from([None, True]), st.just(0)),
        st.tuples(st.just("reenter"), st.integers(0, 1000), st.just(0)),
    ),
    min_size=4,
    max_size=60,
)
EXAMPLES = int(os.environ.get("JUPYTER_GPUMEM_FUZZ_EXAMPLES", "300"))
HUGE_EXAMPLES = int(os.environ.get("JUPYTER_GPUMEM_FUZZ_EXAMPLES", "150"))
FUZZ = {"programs": 0, "steps": 0}
FUZZ_HUGE = {"programs": 0, "steps": 0}


@pytest.fixture(scope="module", autouse=True)
def _fuzz_counts() -> Iterator[None]:
    yield
    for what, counts in (("", FUZZ), (" on devices of 4 EiB and 2**63 - 1 B", FUZZ_HUGE)):
        if counts["programs"]:
            # to file descriptor 2: shown under -s and under the sanitizer's --capture=sys
            os.write(2, f"\ndifferential fuzz{what}: {counts['programs']} programs, "
                        f"{counts['steps']} steps, 0 divergences (shrinking included; a "
                        "divergence fails the test)\n".encode())


class HookedDevice(SimulatedDevice):
    """A simulated device whose next free or unmap first runs a callback."""

    on_free: Callable[[], None] | None = None

    def free(self, ptr: int) -> None:
        hook, self.on_free = self.on_free, None
        if hook is not None:
            hook()
        super().free(ptr)

    def unmap(self, ptr: int, nbytes: int) -> None:
        hook, self.on_free = self.on_free, None
        if hook is not None:
            hook()
        super().unmap(ptr, nbytes)


def _pair(config: AllocatorConfig, capacity: int = 512 * MiB) -> list[CachingAllocator]:
    return [
        CachingAllocator(HookedDevice(capacity, clock=ManualClock(tick_ns=1000)), config,
                         native=native)
        for native in (False, True)
    ]


def _outcome(a: CachingAllocator, op: str, arg: object, stream: int,
             live: list[int]) -> object:
    try:
        if op == "malloc":
            assert isinstance(arg, int)
            ptr = a.malloc(arg, stream)
            if ptr:
                live.append(ptr)
            return ptr
        if op == "churn":  # a malloc and its free: the accumulated counters grow
            assert isinstance(arg, int)
            a.free(a.malloc(arg, stream))
            return None
        if op == "free":
            assert isinstance(arg, int)
            if not live:
                return None
            a.free(live.pop(arg % len(live)))
            return None
        if op == "empty_cache":
            return a.empty_cache()
        if op == "fail":
            assert isinstance(a.device, SimulatedDevice) and isinstance(arg, int)
            a.device.fail_next(arg)
            return None
        if op == "reenter":
            assert isinstance(a.device, HookedDevice) and isinstance(arg, int)
            if live:
                a.device.on_free = lambda: a.free(live.pop(arg % len(live))) if live else None
            return None
        if op == "fraction":
            assert arg is None or isinstance(arg, float)
            a.set_memory_fraction(arg)
            return None
        if op != "config":
            a.set_config(a.config.with_values(**{op: arg}))
            return None
        assert isinstance(arg, AllocatorConfig)
        a.set_config(arg)
        return None
    except MemoryError as exc:
        return ("oom", type(exc).__name__, str(exc))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, ops=OPS, history=st.booleans())
def test_c_core_matches_python_core(config: AllocatorConfig, ops: list, history: bool) -> None:
    _run_on_both(_pair(config), ops, history, FUZZ)


@settings(max_examples=HUGE_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(capacity=HUGE_DEVICES, config=HUGE_CONFIGS, ops=HUGE_OPS, history=st.booleans())
def test_c_core_matches_python_core_on_huge_devices(capacity: int, config: AllocatorConfig,
                                                    ops: list, history: bool) -> None:
    _run_on_both(_pair(config, capacity), ops, history, FUZZ_HUGE)


def _device_calls(a: CachingAllocator) -> tuple[int, ...]:
    d = a.device
    assert isinstance(d, SimulatedDevice)
    return d.malloc_calls, d.free_calls, d.map_calls, d.unmap_calls


def _run_on_both(cores: list[CachingAllocator], ops: list, history: bool,
                 counts: dict[str, int]) -> None:
    """``ops`` on the Python and the C core: after each, the same outcome, counters, blocks,
    segments and mapped pages; at the end the same snapshot, and everything given back."""
    lives: list[list[int]] = [[], []]
    if history:
        for a in cores:
            a.record_history(True, stacks=True)
    counts["programs"] += 1
    for op, arg, stream in ops:
        counts["steps"] += 1
        outcomes = [_outcome(a, op, arg, stream, live)
                    for a, live in zip(cores, lives, strict=True)]
        assert outcomes[0] == outcomes[1], (op, arg)
        py, c = cores
        assert py.stats.to_tuple() == c.stats.to_tuple(), (op, arg)
        # Stack ids may differ (a stack is keyed by instruction offsets, and a caller's offset
        # depends on whether it called C or Python); the snapshots below compare the frames.
        pyb, cb = ([row[:7] for row in x.state().blocks] for x in cores)
        assert pyb == cb, (op, arg)
        pys, cs = ([row[:4] + row[5:] for row in x.state().segments] for x in cores)
        assert pys == cs, (op, arg)
        assert py.device.mapped_bytes == c.device.mapped_bytes  # type: ignore[attr-defined]
        assert _device_calls(py) == _device_calls(c), (op, arg)
        c.check_invariants()
        py.check_invariants()
    snaps = [a.snapshot() for a in cores]
    for s in snaps:
        s["jupyter_gpumem"].pop("device_free", None)
    assert snaps[0] == snaps[1]
    for a, live in zip(cores, lives, strict=True):
        a.device.on_free = None  # type: ignore[attr-defined]
        for ptr in list(live):
            a.free(ptr)
        a.empty_cache()
        assert a.memory_reserved() == 0
        assert a.device.live_segments() == {}  # type: ignore[attr-defined]
        assert a.device.reserved_ranges() == {}  # type: ignore[attr-defined]
        assert a.device.mapped_bytes == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("native", [False, True])
def test_recorder_failure_loses_no_block(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=native)
    calls = []

    def failing(action: int, addr: int, size: int, block_size: int, stream: int) -> int:
        calls.append(action)
        raise KeyboardInterrupt

    a._core.set_recorder(failing)
    with pytest.raises(KeyboardInterrupt):
        a.malloc(1000)
    a._core.set_recorder(None)
    assert a.memory_allocated() == 0
    assert a.memory_reserved() == 2 * MiB  # the segment stays cached, not lost
    a.check_invariants()
    p = a.malloc(1000)
    a._core.set_recorder(failing)
    with pytest.raises(KeyboardInterrupt):
        a.free(p)
    a._core.set_recorder(None)
    assert a.memory_allocated() == 0
    assert a.empty_cache() == 2 * MiB
    a.check_invariants()
    assert calls


def test_cupy_hooks_run_the_core_with_cupys_current_stream() -> None:
    from jupyter_gpumem.engine._native import Hooks

    a = CachingAllocator(SimulatedDevice(64 * MiB), native=True)

    class Stream:
        ptr = 0x77

    cores: list[object] = []
    asked: list[int] = []

    def missing(device_id: int) -> object:
        asked.append(device_id)
        cores.extend([None] * (device_id + 1 - len(cores)))
        cores[device_id] = a.native_core
        return a.native_core

    hooks = Hooks(cores, lambda: Stream, missing)
    p = hooks.malloc(1000, 1)
    q = hooks.malloc(3000, 1)
    assert asked == [1]  # made once, then found in the list
    assert a.owns(p) and a.owns(q)
    assert {row.stream for row in a.state().blocks} == {0x77}  # blocks of CuPy's stream
    hooks.free(p, 1)
    hooks.free(q, 1)
    assert a.memory_allocated() == 0
    assert hooks.malloc(0, 1) == 0
    hooks.free(0, 1)
    with pytest.raises(ValueError, match=f"free of address {q:#x}, .* already freed"):
        hooks.free(q, 1)
    pointer_hooks = Hooks(cores, lambda: 0x99, missing)  # CuPy's get_current_stream_ptr
    r = pointer_hooks.malloc(700, 1)
    assert {row.stream for row in a.state().blocks if row.allocated} == {0x99}
    pointer_hooks.free(r, 1)
    bad = Hooks([], lambda: Stream, lambda device_id: object())
    with pytest.raises(TypeError):
        bad.malloc(512, 0)
    a.check_invariants()


def _alloc_hooks(a: CachingAllocator, *, memory: object = None,
                 pointer: object = None) -> tuple[object, list[int]]:
    """Hooks whose alloc() runs ``a`` as device 1, with CuPy's memory classes unless given."""
    from cupy.cuda.memory import MemoryPointer, PythonFunctionAllocatorMemory

    from jupyter_gpumem.engine._native import Hooks

    cores: list[object] = []
    asked: list[int] = []

    def missing(device_id: int) -> object:
        asked.append(device_id)
        cores.extend([None] * (device_id + 1 - len(cores)))
        cores[device_id] = a._core
        return a._core

    hooks = Hooks(cores, lambda: 0x55, missing, get_device=lambda: 1,
                  memory=memory or PythonFunctionAllocatorMemory,
                  pointer=pointer or MemoryPointer)
    return hooks, asked


def test_cupy_alloc_reports_the_rounded_block_size_as_cupys_pool_does() -> None:
    # CuPy's pool gives mem.size = its rounded block size; cupy.percentile's test fills it all.
    from cupy.cuda.memory import MemoryPointer, PythonFunctionAllocatorMemory

    from jupyter_gpumem.data.sizes import round_size

    a = CachingAllocator(SimulatedDevice(256 * MiB), native=True)
    hooks, asked = _alloc_hooks(a)
    for divisions in (None, 4):
        a.set_config(AllocatorConfig(roundup_power2_divisions=divisions))
        for n in (1, 16, 511, 512, 513, 1000, 4097, MiB - 1, MiB + 1, 5 * MiB + 3, 21 * MiB + 1):
            before = a.memory_stats()
            p = hooks.alloc(n)
            assert type(p) is MemoryPointer and type(p.mem) is PythonFunctionAllocatorMemory
            assert p.mem.size == round_size(n, divisions or 0)
            assert p.ptr == p.mem.ptr and a.owns(p.ptr) and p.mem.device_id == 1
            stats = a.memory_stats()
            assert stats["requested_bytes.all.current"] == n  # the request is still the request
            assert stats["allocated_bytes.all.current"] >= p.mem.size
            assert stats["allocation.all.allocated"] == before["allocation.all.allocated"] + 1
            assert {row[3] for row in a._core.state()[1] if row[6]} == {0x55}  # CuPy's stream
            mem = p.mem
            del p
            assert a.memory_allocated() > 0  # the memory object holds the block, not the pointer
            del mem  # its destructor calls hooks.free(ptr, 1)
            assert a.memory_allocated() == 0
    assert asked == [1]
    assert a.memory_stats()["allocation.all.freed"] == 22
    a.check_invariants()


def test_cupy_alloc_of_zero_bytes_and_bad_sizes() -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB), native=True)
    hooks, asked = _alloc_hooks(a)
    p = hooks.alloc(0)
    assert (p.ptr, p.mem.ptr, p.mem.size, p.mem.device_id) == (0, 0, 0, 1)
    assert asked == []  # no core is made for nothing
    with pytest.raises(ValueError, match="negative size"):
        hooks.alloc(-1)
    with pytest.raises(TypeError):
        hooks.alloc("512")
    del p
    assert a.memory_stats()["allocation.all.allocated"] == 0


def test_cupy_alloc_gives_the_block_back_when_building_the_pointer_fails() -> None:
    from cupy.cuda.memory import PythonFunctionAllocatorMemory

    a = CachingAllocator(SimulatedDevice(64 * MiB), native=True)

    def no_memory(*args: object) -> object:
        raise MemoryError("host memory")

    class ReadOnlySize:  # a memory object whose size cannot be set
        def __init__(self, size: int, malloc: object, free: object, device_id: int) -> None:
            self.ptr = 0

        @property
        def size(self) -> int:
            return 0

    def no_pointer(mem: object, offset: int) -> object:
        raise RuntimeError("no pointer")

    for memory, pointer, error in ((no_memory, None, MemoryError),
                                   (ReadOnlySize, None, AttributeError),
                                   (PythonFunctionAllocatorMemory, no_pointer, RuntimeError)):
        hooks, _ = _alloc_hooks(a, memory=memory, pointer=pointer)
        with pytest.raises(error):
            hooks.alloc(3000)
        assert a.memory_allocated() == 0
        assert a.memory_stats()["allocation.all.freed"] == a.memory_stats()[
            "allocation.all.allocated"]
    a.check_invariants()


def test_cupy_alloc_needs_cupys_classes() -> None:
    from jupyter_gpumem.engine._native import Hooks

    plain = Hooks([], lambda: 0, lambda device_id: None)
    with pytest.raises(TypeError, match="alloc"):
        plain.alloc(512)
    with pytest.raises(TypeError, match="all of"):
        Hooks([], lambda: 0, lambda device_id: None, get_device=lambda: 0)
