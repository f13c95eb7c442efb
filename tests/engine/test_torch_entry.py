"""PyTorch's entry points into the C core (csrc/torch.c), called as PyTorch calls them.

ctypes calls a ``CFUNCTYPE`` function with the GIL released, which is the situation of PyTorch's
autograd threads in ``backward()``; a ``PYFUNCTYPE`` one keeps it, as an op run from Python
does. Both reach the same core as Python's ``malloc``/``free`` (CuPy's path), on a simulated
device. Note [Calls without the GIL] in torch.c says what each path may do.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from thread_hammer import Give, Take, hammer

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.oom import OutOfMemoryError

pytestmark = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
OP_ALLOC, OP_FREE = 0, 1
CACHED, SLOW, UNKNOWN = 0, 1, 2
FOREIGN = 0x1000  # an address no simulated device hands out


def _native() -> Any:
    from jupyter_gpumem.engine import _native

    return _native


class Entry:
    """alloc/free through the entry points' addresses, with the GIL held or released."""

    def __init__(self, gil: bool) -> None:
        kind = ctypes.PYFUNCTYPE if gil else ctypes.CFUNCTYPE
        alloc_addr, free_addr = _native().torch_entry_points()
        self._alloc = kind(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                           ctypes.c_void_p)(alloc_addr)
        self._free = kind(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                          ctypes.c_void_p)(free_addr)

    def alloc(self, size: int, device: int = 0, stream: int = 0) -> int:
        return self._alloc(size, device, stream or None) or 0

    def free(self, ptr: int, size: int = 0, device: int = 0, stream: int = 0) -> None:
        self._free(ptr, size, device, stream or None)


NOGIL = Entry(gil=False)
WITHGIL = Entry(gil=True)


def _bound(capacity: int = GiB, config: AllocatorConfig | None = None,
           device: SimulatedDevice | None = None) -> CachingAllocator:
    a = CachingAllocator(device or SimulatedDevice(capacity), config, native=True)
    _native().torch_bind(0, a.native_core)
    return a


@pytest.fixture(autouse=True)
def _clean_binding() -> Iterator[None]:
    """Every test starts with no core bound and ends having freed what it allocated."""
    n = _native()
    n.torch_bind(0, None)
    n.torch_set_missing(None)
    n.torch_take_error()
    n.torch_log(0)
    yield
    n.torch_log(0)
    for device in range(4):
        n.torch_bind(device, None)
    n.torch_set_missing(None)


def _log() -> list[tuple[int, ...]]:
    rows, _seen = _native().torch_log_read()
    return rows


def _counter(name: str) -> int:
    return int(_native().torch_counters()[name])


def test_entry_points_are_exported_by_name() -> None:
    n = _native()
    lib = ctypes.CDLL(n.__file__)  # the module already loaded: the same functions
    alloc = ctypes.cast(lib.jupyter_gpumem_torch_alloc, ctypes.c_void_p).value
    free = ctypes.cast(lib.jupyter_gpumem_torch_free, ctypes.c_void_p).value
    assert (alloc, free) == n.torch_entry_points()


@pytest.mark.parametrize("gil", [False, True])
def test_a_hit_takes_the_cached_path(gil: bool) -> None:
    a = _bound()
    entry = Entry(gil)
    warm = a.malloc(MiB)  # CuPy's side makes the segment
    a.free(warm)
    before = a.stats
    _native().torch_log(10)
    p = entry.alloc(MiB)
    assert p == warm  # the block the other library freed
    assert a.memory_allocated() == MiB
    entry.free(p, MiB)
    me = (threading.get_ident(), threading.get_native_id())
    assert _log() == [(OP_ALLOC, CACHED, int(gil), *me, 0, 0, MiB, p),
                      (OP_FREE, CACHED, int(gil), *me, 0, 0, MiB, p)]
    after = a.stats
    assert after.num_device_alloc == before.num_device_alloc
    assert a.memory_stats()["allocation.all.allocated"] == 2
    assert a.memory_allocated() == 0
    a.check_invariants()


@pytest.mark.parametrize("gil", [False, True])
def test_a_miss_takes_the_gil_for_the_device(gil: bool) -> None:
    callers: list[int] = []

    class Watched(SimulatedDevice):
        def malloc(self, nbytes: int, stream: int = 0) -> int:
            callers.append(threading.get_ident())  # Python runs: this thread holds the GIL
            return super().malloc(nbytes, stream)

    a = _bound(device=Watched(GiB))
    _native().torch_log(10)
    p = Entry(gil).alloc(3 * MiB, stream=7)
    assert p and a.owns(p)
    assert callers == [threading.get_ident()]
    assert [row[:3] for row in _log()] == [(OP_ALLOC, SLOW, int(gil))]
    assert a.state().segments[0].stream == 7
    Entry(gil).free(p, 3 * MiB, stream=7)
    assert a.memory_allocated() == 0
    a.check_invariants()


def test_streams_key_the_pools_as_for_cupy() -> None:
    a = _bound()
    p = NOGIL.alloc(4 * KiB)  # PyTorch's default stream: handle 0, as CuPy's
    NOGIL.free(p, 4 * KiB)
    q = a.malloc(4 * KiB, 0)  # CuPy's array on the default stream reuses it
    assert q == p
    a.free(q)
    r = NOGIL.alloc(4 * KiB, stream=0x5000)  # a side stream: a pool of its own
    assert r != p
    assert {s.stream for s in a.state().segments} == {0, 0x5000}
    NOGIL.free(r, 4 * KiB, stream=0x5000)
    a.check_invariants()


@pytest.mark.parametrize("gil", [False, True])
def test_out_of_memory_returns_null_and_keeps_the_error(gil: bool) -> None:
    a = _bound(64 * MiB)
    entry = Entry(gil)
    assert entry.alloc(GiB) == 0
    error = _native().torch_take_error()
    assert isinstance(error, OutOfMemoryError)
    assert "out of memory" in str(error)
    assert error.__traceback__ is None  # no frames kept alive
    assert _native().torch_take_error() is None  # taken once
    assert a.stats.num_ooms == 1
    p = entry.alloc(MiB)  # the thread goes on: no exception was left pending
    assert p
    entry.free(p, MiB)


def test_a_device_error_returns_null_and_keeps_the_error() -> None:
    class Broken(SimulatedDevice):
        def malloc(self, nbytes: int, stream: int = 0) -> int:
            raise RuntimeError("the driver fell over")

    _bound(device=Broken(GiB))
    assert NOGIL.alloc(MiB) == 0
    error = _native().torch_take_error()
    assert isinstance(error, RuntimeError) and str(error) == "the driver fell over"


def test_zero_and_huge_sizes() -> None:
    a = _bound()
    assert NOGIL.alloc(0) == 0
    assert a.stats.num_ooms == 0 and a.memory_stats()["allocation.all.allocated"] == 0
    assert NOGIL.alloc(-1) == 0  # 2**64 - 1 as PyTorch's size_t: out of memory at once
    assert a.stats.num_ooms == 1
    assert isinstance(_native().torch_take_error(), OutOfMemoryError)
    assert a.memory_reserved() == 0


@pytest.mark.parametrize("gil", [False, True])
def test_unknown_and_double_frees_are_ignored_and_counted(gil: bool) -> None:
    a = _bound()
    entry = Entry(gil)
    unknown = _counter("unknown_frees")
    entry.free(FOREIGN, 512)
    assert _counter("unknown_frees") == unknown + 1
    p = entry.alloc(512)
    entry.free(p, 512)
    entry.free(p, 512)  # freed already
    assert _counter("unknown_frees") == unknown + 2
    entry.free(0, 0)  # PyTorch's empty tensors: nothing to do, nothing counted
    assert _counter("unknown_frees") == unknown + 2
    assert a.memory_stats()["allocation.all.freed"] == 1
    a.check_invariants()


def test_blocks_go_back_to_their_core_after_a_rebind_or_an_unbind() -> None:
    first = _bound()
    p = NOGIL.alloc(MiB)
    second = _bound()
    assert _native().torch_bound(0) is second.native_core
    NOGIL.free(p, MiB)  # handed out by the first core
    assert first.memory_allocated() == 0
    q = NOGIL.alloc(MiB)
    assert second.owns(q)
    _native().torch_bind(0, None)
    NOGIL.free(q, MiB)
    assert second.memory_allocated() == 0
    assert NOGIL.alloc(MiB) == 0  # no core bound, no missing()
    error = _native().torch_take_error()
    assert isinstance(error, RuntimeError) and "no allocator is bound" in str(error)
    first.check_invariants()
    second.check_invariants()


def test_missing_makes_and_binds_a_core_on_first_use() -> None:
    made: list[tuple[int, CachingAllocator]] = []

    def missing(device: int) -> Any:
        a = CachingAllocator(SimulatedDevice(GiB), native=True)
        made.append((device, a))
        return a.native_core

    _native().torch_set_missing(missing)
    p = NOGIL.alloc(MiB, device=3)
    assert [d for d, _a in made] == [3]
    a = made[0][1]
    assert _native().torch_bound(3) is a.native_core and a.owns(p)
    q = NOGIL.alloc(MiB, device=3)  # bound now: not made again
    assert len(made) == 1
    NOGIL.free(p, MiB, device=3)
    NOGIL.free(q, MiB, device=3)
    assert a.memory_allocated() == 0

    _native().torch_set_missing(lambda device: "not a core")
    assert NOGIL.alloc(MiB, device=2) == 0
    assert isinstance(_native().torch_take_error(), TypeError)


def test_binding_refuses_bad_arguments() -> None:
    n = _native()
    with pytest.raises(ValueError, match="device"):
        n.torch_bind(-1, None)
    with pytest.raises(ValueError, match="device"):
        n.torch_bind(1 << 20, None)
    with pytest.raises(TypeError, match="C core"):
        n.torch_bind(0, object())
    with pytest.raises(TypeError, match="callable"):
        n.torch_set_missing(3)
    with pytest.raises(ValueError):
        n.torch_log(-1)


@pytest.mark.parametrize("gil", [False, True])
def test_recording_takes_the_gil_and_keeps_the_callers_stack(gil: bool) -> None:
    a = _bound()
    warm = a.malloc(4 * KiB, 0x1000)
    a.free(warm)
    a.record_history(stacks=True, max_entries=100)
    _native().torch_log(10)
    p = Entry(gil).alloc(4 * KiB, stream=0x1000)  # a hit, but history needs the GIL
    Entry(gil).free(p, 4 * KiB, stream=0x1000)
    assert [row[:3] for row in _log()] == [(OP_ALLOC, SLOW, int(gil)), (OP_FREE, SLOW, int(gil))]
    trace = a.snapshot(mark=False)["device_traces"][0]
    actions = [(trace[i]["action"], trace[i]["stream"]) for i in range(len(trace))]
    assert actions[-3:] == [("alloc", 0x1000), ("free_requested", 0x1000),
                            ("free_completed", 0x1000)]
    alloc_event = trace[len(trace) - 3]
    assert any(f["name"] == "test_recording_takes_the_gil_and_keeps_the_callers_stack"
               for f in alloc_event["frames"])
    a.record_history(False)


def test_a_block_holding_a_stack_is_freed_through_the_gil() -> None:
    a = _bound()
    a.record_history(stacks=True, max_entries=0)  # stacks of live blocks, no events
    p = NOGIL.alloc(MiB)
    a.record_history(False)
    _native().torch_log(10)
    NOGIL.free(p, MiB)  # its stack is let go with the GIL (PyMem)
    assert [row[:3] for row in _log()] == [(OP_FREE, SLOW, 0)]
    assert a.memory_allocated() == 0
    a.check_invariants()


def test_the_log_keeps_n_calls_and_counts_the_rest() -> None:
    a = _bound()
    _native().torch_log(3)
    for _ in range(5):
        NOGIL.free(NOGIL.alloc(512), 512)
    rows, seen = _native().torch_log_read()
    assert len(rows) == 3 and seen == 10
    _native().torch_log(0)
    NOGIL.free(NOGIL.alloc(512), 512)
    assert _native().torch_log_read()[1] == 10  # stopped
    assert a.memory_allocated() == 0


def test_time_pairs_runs_the_entry_points_from_c() -> None:
    a = _bound()
    for release in (True, False):
        assert _native().torch_time_pairs(MiB, 0, 1000, 0, release) > 0
    stats = a.memory_stats()
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 2000
    assert stats["num_device_alloc"] == 1
    _native().torch_bind(0, None)
    with pytest.raises(MemoryError, match="alloc 0 of"):
        _native().torch_time_pairs(MiB, 0, 10)
    assert isinstance(_native().torch_take_error(), RuntimeError)


# -- many threads at once --------------------------------------------------------------------

THREADS = 6
OPS = 1500
SIZES = [1, 512, 4 * KiB, 100 * KiB, MiB, MiB + 1, 3 * MiB, 12 * MiB, 25 * MiB]


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("history", [False, True])
def test_threads_with_and_without_the_gil_share_one_core(history: bool,
                                                         fast_switching: None) -> None:
    """PyTorch's threads (entry points, GIL released or held) and CuPy's (Python malloc/free)
    hammer one core at once, with misses, OOMs and empty_cache: no block is handed out twice,
    none is lost, the books balance."""
    device = SimulatedDevice(512 * MiB)
    a = _bound(device=device)
    if history:
        a.record_history(stacks=True, max_entries=1000)

    def ways(tid: int) -> tuple[Take, Give]:
        kind = tid % 3  # 0: no GIL (autograd), 1: with the GIL (an op), 2: CuPy's Python path
        entry = Entry(gil=kind == 1)
        stream = (tid % 2) * 0x1000
        if kind == 2:
            def take(size: int) -> int | None:
                try:
                    return int(a.malloc(size, stream))
                except OutOfMemoryError:
                    return None

            return take, lambda p, _size: a.free(p)
        return (lambda size: entry.alloc(size, 0, stream) or None,
                lambda p, size: entry.free(p, size, 0, stream))

    hammer(a, device, threads=THREADS, ops=OPS, sizes=SIZES, ways=ways)
    if history:
        a.record_history(False)
    _native().torch_take_error()


# -- the entry points follow the policy exactly ------------------------------------------------

PROGRAM = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.one_of(st.integers(1, 4096),
                                              st.sampled_from([MiB, MiB + 1, 3 * MiB, 21 * MiB]),
                                              st.integers(1, 48 * MiB)),
                  st.sampled_from([0, 0x1000])),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=80,
)
CONFIGS = st.builds(
    AllocatorConfig,
    max_split_size_mb=st.sampled_from([None, 21, 32]),
    roundup_power2_divisions=st.sampled_from([None, 4]),
    garbage_collection_threshold=st.sampled_from([None, 0.5]),
    per_process_memory_fraction=st.sampled_from([None, 0.5]),
    expandable_segments=st.sampled_from([None, True]),
)


@settings(max_examples=int(os.environ.get("JUPYTER_GPUMEM_FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, program=PROGRAM, gil=st.booleans())
def test_entry_points_follow_the_python_core(config: AllocatorConfig, program: list,
                                             gil: bool) -> None:
    """One program through the entry points (C core) and through the Python core's malloc/free:
    the same addresses, the same OOMs, the same counters and blocks."""
    reference = CachingAllocator(SimulatedDevice(256 * MiB), config, native=False)
    a = _bound(256 * MiB, config)
    entry = Entry(gil)
    live: list[tuple[int, int, int]] = []  # (ptr, size, stream), the same in both
    for op, arg, stream in program:
        if op == "alloc":
            try:
                want = reference.malloc(arg, stream)
            except OutOfMemoryError:
                want = 0
            got = entry.alloc(arg, 0, stream)
            assert got == want
            if got:
                live.append((got, arg, stream))
            else:
                assert isinstance(_native().torch_take_error(), OutOfMemoryError)
        elif op == "free" and live:
            p, size, stream = live.pop(arg % len(live))
            reference.free(p)
            entry.free(p, size, 0, stream)
        elif op == "empty_cache":
            assert a.empty_cache() == reference.empty_cache()
        assert a.stats.to_tuple() == reference.stats.to_tuple(), (op, arg)
    ours, theirs = (x.state() for x in (a, reference))
    assert [row[:7] for row in ours.blocks] == [row[:7] for row in theirs.blocks]  # not stacks
    assert ([row[:4] + row[5:] for row in ours.segments]
            == [row[:4] + row[5:] for row in theirs.segments])
    for p, size, stream in live:
        entry.free(p, size, 0, stream)
    a.check_invariants()
    _native().torch_bind(0, None)
