"""memory_summary(): PyTorch's table, compared as exact strings."""

from __future__ import annotations

from jupyter_gpumem import CachingAllocator
from jupyter_gpumem.render.summary import format_summary

MiB = 1 << 20


def scripted(a: CachingAllocator) -> None:
    # A 1000 B request (1024 B block, small pool, 2 MiB segment split), a 3 MiB one (large
    # pool, 20 MiB segment split, 17 MiB left), then the small one freed (its segment merges
    # back whole). Sizes are shown in the unit the "all" row's value picks (PyTorch's
    # _format_size: KiB from 768 KiB on, MiB from 768 MiB on).
    s = a.malloc(1000)
    a.malloc(3 * MiB)
    a.free(s)


EXPECTED = """\
|===========================================================================|
|                jupyter_gpumem memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |   3072 KiB |   3073 KiB |   3073 KiB |   1024 B   |
|       from large pool |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |
|       from small pool |      0 KiB |      1 KiB |      1 KiB |   1024 B   |
|---------------------------------------------------------------------------|
| Active memory         |   3072 KiB |   3073 KiB |   3073 KiB |   1024 B   |
|       from large pool |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |
|       from small pool |      0 KiB |      1 KiB |      1 KiB |   1024 B   |
|---------------------------------------------------------------------------|
| Requested memory      |   3072 KiB |   3072 KiB |   3072 KiB |   1000 B   |
|       from large pool |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |
|       from small pool |      0 KiB |      0 KiB |      0 KiB |   1000 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |
|       from large pool |  20480 KiB |  20480 KiB |  20480 KiB |      0 B   |
|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |  17408 KiB |  19455 KiB |  19455 KiB |   2047 KiB |
|       from large pool |  17408 KiB |  17408 KiB |  17408 KiB |      0 KiB |
|       from small pool |      0 KiB |   2047 KiB |   2047 KiB |   2047 KiB |
|---------------------------------------------------------------------------|
| Allocations           |       1    |       2    |       2    |       1    |
|       from large pool |       1    |       1    |       1    |       0    |
|       from small pool |       0    |       1    |       1    |       1    |
|---------------------------------------------------------------------------|
| Active allocs         |       1    |       2    |       2    |       1    |
|       from large pool |       1    |       1    |       1    |       0    |
|       from small pool |       0    |       1    |       1    |       1    |
|---------------------------------------------------------------------------|
| GPU reserved segments |       2    |       2    |       2    |       0    |
|       from large pool |       1    |       1    |       1    |       0    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       1    |       2    |       2    |       1    |
|       from large pool |       1    |       1    |       1    |       0    |
|       from small pool |       0    |       1    |       1    |       1    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
"""

EXPECTED_ABBREVIATED = """\
|===========================================================================|
|                jupyter_gpumem memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |   3072 KiB |   3073 KiB |   3073 KiB |   1024 B   |
|---------------------------------------------------------------------------|
| Active memory         |   3072 KiB |   3073 KiB |   3073 KiB |   1024 B   |
|---------------------------------------------------------------------------|
| Requested memory      |   3072 KiB |   3072 KiB |   3072 KiB |   1000 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |  17408 KiB |  19455 KiB |  19455 KiB |   2047 KiB |
|---------------------------------------------------------------------------|
| Allocations           |       1    |       2    |       2    |       1    |
|---------------------------------------------------------------------------|
| Active allocs         |       1    |       2    |       2    |       1    |
|---------------------------------------------------------------------------|
| GPU reserved segments |       2    |       2    |       2    |       0    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       1    |       2    |       2    |       1    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
"""


def test_memory_summary_exact(allocator: CachingAllocator) -> None:
    scripted(allocator)
    text = allocator.memory_summary()
    assert text == EXPECTED
    assert all(len(line) == 77 for line in text.splitlines())  # 75 between the bars


def test_memory_summary_abbreviated_exact(allocator: CachingAllocator) -> None:
    scripted(allocator)
    assert allocator.memory_summary(abbreviated=True) == EXPECTED_ABBREVIATED


def test_big_values_switch_units_and_counts_get_k() -> None:
    stats = dict.fromkeys(
        (f"{name}.{pool}.{field}"
         for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                      "reserved_bytes", "active_bytes", "inactive_split_bytes",
                      "requested_bytes")
         for pool in ("all", "large_pool", "small_pool")
         for field in ("current", "peak", "allocated", "freed")), 0)
    stats.update({f"{name}.{field}": 0 for name in ("oversize_allocations", "oversize_segments")
                  for field in ("current", "peak", "allocated", "freed")})
    stats.update(num_ooms=3, num_alloc_retries=12)
    # 800 MiB passes 768 MiB: shown in MiB. 767 KiB stays in bytes. 750 000 allocations: K.
    stats["allocated_bytes.all.current"] = 800 * MiB
    stats["allocated_bytes.large_pool.current"] = 800 * MiB
    stats["allocated_bytes.all.peak"] = 767 * 1024
    stats["allocation.all.allocated"] = 750_000
    stats["allocation.small_pool.allocated"] = 1_234
    text = format_summary(stats, device=2, abbreviated=False)
    lines = text.splitlines()
    # The pool rows take the unit of the "all" row: 1234 allocations show as 1 K.
    expected = {
        1: "|                jupyter_gpumem memory summary, device ID 2                 |",
        3: "|            CUDA OOMs: 3            |        cudaMalloc retries: 12        |",
        7: "| Allocated memory      |    800 MiB | 785408 B   |      0 B   |      0 B   |",
        8: "|       from large pool |    800 MiB |      0 B   |      0 B   |      0 B   |",
        27: "| Allocations           |       0    |       0    |     750 K  |       0    |",
        29: "|       from small pool |       0    |       0    |       1 K  |       0    |",
    }
    assert {i: lines[i] for i in expected} == expected
