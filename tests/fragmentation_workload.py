"""A fragmentation workload: out of memory under the default config, fits with max_split_size_mb.

On a 1 GiB device: 600 MiB allocated and freed leaves a cached 600 MiB segment; a 100 MiB
request then splits it (the default splits any block), so the next 600 MiB request finds no
block and no room for a segment: out of memory with 500 MiB cached in the pinned segment. With
``max_split_size_mb`` set to 64 (or up to 512) the 600 MiB block is oversize, never split: the
100 MiB request gets a segment of its own and the 600 MiB request reuses the cached one.
"""

from __future__ import annotations

MiB = 1 << 20
CAPACITY = 1024 * MiB
#: The workload as lines of a notebook cell (``g`` is jupyter_gpumem); ``y`` stays live.
CELL_BEFORE = ("x = g.caching_allocator_alloc(600 * MiB); g.caching_allocator_delete(x)\n"
               "y = g.caching_allocator_alloc(100 * MiB)")
CELL_OOM = "z = g.caching_allocator_alloc(600 * MiB)"


def run_workload(allocator) -> int:
    """Run it on ``allocator`` (history on); returns the live 100 MiB block's address."""
    from jupyter_gpumem import OutOfMemoryError

    x = allocator.malloc(600 * MiB)
    allocator.free(x)
    y = allocator.malloc(100 * MiB)
    try:
        allocator.malloc(600 * MiB)
    except OutOfMemoryError:
        pass
    else:
        raise AssertionError("the workload should run out of memory")
    return y
