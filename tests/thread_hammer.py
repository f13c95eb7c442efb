"""Threads hammering one allocator at once: each takes blocks and gives them back at random (with
``empty_cache`` now and then), then the books must balance: no block handed to two threads, none
lost, every counter back to zero and every segment released."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: ``take(size)``: an address, or None where the allocator refused (out of memory).
Take = Callable[[int], "int | None"]
#: ``give(address, size)``.
Give = Callable[[int, int], None]


def hammer(a: Any, device: Any, *, threads: int, ops: int, sizes: Sequence[int],
           ways: Callable[[int], tuple[Take, Give]]) -> dict[str, int]:
    """Run ``threads`` threads of ``ops`` steps, thread ``tid`` taking and giving through
    ``ways(tid)``; assert the books balance and return the stats from before the final
    ``empty_cache``."""
    owner: dict[int, int] = {}  # live address -> thread that holds it
    owner_lock = threading.Lock()
    errors: list[BaseException] = []
    counts = [0] * threads
    start = threading.Barrier(threads)

    def work(tid: int) -> None:
        rng = random.Random(tid)
        take, give = ways(tid)
        mine: list[tuple[int, int]] = []
        try:
            start.wait()
            for _ in range(ops):
                if mine and rng.random() < 0.45:
                    p, size = mine.pop(rng.randrange(len(mine)))
                    with owner_lock:
                        assert owner.pop(p) == tid
                    give(p, size)
                else:
                    size = rng.choice(sizes)
                    got = take(size)
                    if got is not None:
                        with owner_lock:
                            assert got not in owner, f"{got:#x} handed to two threads"
                            owner[got] = tid
                        mine.append((got, size))
                        counts[tid] += 1
                if rng.random() < 0.01:
                    a.empty_cache()
            for p, size in mine:
                with owner_lock:
                    owner.pop(p)
                give(p, size)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []
    assert owner == {}
    a.check_invariants()
    stats: dict[str, int] = a.memory_stats()
    assert stats["allocation.all.current"] == 0
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == sum(counts)
    a.empty_cache()
    assert a.memory_reserved() == 0
    assert device.live_segments() == {}
    return stats
