"""Many threads allocating and freeing at once: nothing lost, nothing handed out twice."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator

import pytest

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
    owner: dict[int, int] = {}  # live address -> thread that holds it
    owner_lock = threading.Lock()
    errors: list[BaseException] = []
    counts = [0] * THREADS
    start = threading.Barrier(THREADS)

    def work(tid: int) -> None:
        rng = random.Random(tid)
        mine: list[tuple[int, int]] = []
        try:
            start.wait()
            for _ in range(OPS):
                if mine and rng.random() < 0.45:
                    p, _size = mine.pop(rng.randrange(len(mine)))
                    with owner_lock:
                        assert owner.pop(p) == tid
                    a.free(p)
                else:
                    size = rng.choice(sizes)
                    try:
                        p = a.malloc(size, stream=tid % 3)
                    except OutOfMemoryError:
                        continue
                    with owner_lock:
                        assert p not in owner, f"{p:#x} handed to two threads"
                        owner[p] = tid
                    mine.append((p, size))
                    counts[tid] += 1
                if rng.random() < 0.01:
                    a.empty_cache()
            for p, _size in mine:
                with owner_lock:
                    owner.pop(p)
                a.free(p)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert owner == {}
    a.check_invariants()
    s = a.memory_stats()
    assert s["allocation.all.current"] == 0
    assert s["allocated_bytes.all.current"] == 0
    assert s["requested_bytes.all.current"] == 0
    assert s["allocation.all.allocated"] == s["allocation.all.freed"] == sum(counts)
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"]
    assert s["inactive_split.all.current"] == 0  # every segment is whole again
    a.empty_cache()
    assert a.memory_reserved() == 0
    assert device.live_segments() == {}
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
