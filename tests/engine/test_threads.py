"""Many threads allocating and freeing at once: nothing lost, nothing handed out twice."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
from thread_hammer import Give, Take, hammer

from jupyter_gpumem import CachingAllocator, ManualClock, OutOfMemoryError, SimulatedDevice

KiB = 1 << 10
MiB = 1 << 20
THREADS = 8
OPS = 1500


@pytest.fixture(autouse=True)
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("history", [False, True])
def test_concurrent_malloc_and_free(history: bool) -> None:
    device = SimulatedDevice(1 << 30, clock=ManualClock(tick_ns=1))
    a = CachingAllocator(device)
    if history:
        a.record_history(stacks=True, max_entries=1000)
    sizes = [1, 512, 4 * KiB, 100 * KiB, MiB, MiB + 1, 3 * MiB, 12 * MiB]

    def ways(tid: int) -> tuple[Take, Give]:
        def take(size: int) -> int | None:
            try:
                return int(a.malloc(size, stream=tid % 3))
            except OutOfMemoryError:
                return None

        return take, lambda p, _size: a.free(p)

    s = hammer(a, device, threads=THREADS, ops=OPS, sizes=sizes, ways=ways)
    assert s["requested_bytes.all.current"] == 0
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"]
    assert s["inactive_split.all.current"] == 0  # every segment is whole again
    assert s["num_device_alloc"] - s["num_device_free"] == s["segment.all.current"]


def test_concurrent_double_free_is_caught_once() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    ptrs = [a.malloc(512) for _ in range(200)]
    failures: list[int] = []
    lock = threading.Lock()

    def free_all() -> None:
        for p in ptrs:
            try:
                a.free(p)
            except ValueError:
                with lock:
                    failures.append(p)

    threads = [threading.Thread(target=free_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each block is freed by exactly one thread; the other three get an error.
    assert sorted(failures) == sorted(ptrs * 3)
    a.check_invariants()
    assert a.memory_stats()["allocation.all.freed"] == 200
