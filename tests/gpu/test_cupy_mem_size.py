"""What CuPy sees of our blocks: ``memptr.mem.size`` is the rounded block size, as with CuPy's own
pool (Note [The size CuPy sees] in engine/csrc/hooks.c), and every block still comes back."""

from __future__ import annotations

import gc

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem.data.sizes import round_size
from jupyter_gpumem.engine.allocator import CORE_ENV
from jupyter_gpumem.runtime import binding

pytestmark = pytest.mark.gpu
MiB = 1 << 20
NBYTES = [1, 16, 100, 511, 512, 513, 4096, 4097, MiB - 1, MiB, MiB + 1, 5 * MiB + 3,
          21 * MiB + 1]


@pytest.mark.parametrize("divisions", [None, 4])
def test_mem_size_is_the_rounded_block_size(cp, installed, divisions: int | None) -> None:
    installed.set_config(gm.AllocatorConfig(roundup_power2_divisions=divisions))
    for n in NBYTES:
        x = cp.empty(n, dtype=cp.int8)
        assert x.data.mem.size == round_size(n, divisions or 0), n
        block = installed.block_of(x.data.ptr)
        assert block is not None and block[0] == x.data.ptr
        assert block[1] >= x.data.mem.size  # every byte CuPy is told of is ours to use
        del x
    y = cp.empty(3, dtype=cp.float64)  # 24 B
    assert y.data.mem.size == 512
    del y


def test_cupy_percentile_memory_access(cp, installed) -> None:
    # The allocator of CuPy's test_percentile_memory_access: it fills all of mem.size with NaN.
    original = cp.cuda.get_allocator()
    sizes = []

    def controlled_allocator(size: int):
        memptr = original(size)
        sizes.append(memptr.mem.size)
        assert memptr.mem.size % 512 == 0
        x = cp.ndarray(memptr=memptr, shape=(memptr.mem.size // 4,), dtype=cp.float32)
        x.fill(cp.nan)
        return memptr

    a = cp.random.default_rng(0).random(5, dtype=cp.float32)
    q = cp.array((0, 100), dtype=cp.float32)
    cp.cuda.set_allocator(controlled_allocator)
    try:
        percentiles = cp.percentile(a, q, axis=None, method="linear")
    finally:
        cp.cuda.set_allocator(original)
    assert sizes and not cp.any(cp.isnan(percentiles))


def test_blocks_come_back_across_uninstall(cp, installed) -> None:
    start = installed.memory_stats()
    keep = [cp.empty(n, dtype=cp.int8) for n in NBYTES]
    assert [x.data.mem.size for x in keep] == [round_size(n) for n in NBYTES]
    mid = installed.memory_stats()
    assert mid["allocation.all.current"] == start["allocation.all.current"] + len(NBYTES)
    gm.uninstall()
    other = cp.empty(16, dtype=cp.int8)  # CuPy's pool now
    assert installed.memory_stats()["allocation.all.allocated"] == mid["allocation.all.allocated"]
    del keep, other
    gc.collect()
    end = installed.memory_stats()
    assert end["allocation.all.current"] == start["allocation.all.current"]
    assert end["allocated_bytes.all.current"] == start["allocated_bytes.all.current"]
    assert end["allocation.all.freed"] == start["allocation.all.freed"] + len(NBYTES)
    installed.check_invariants()
    gm.install()


def test_python_core_binding_reports_the_same_size(cp, installed, monkeypatch) -> None:
    # The Python twin of Hooks.alloc, used where the C core is not built.
    monkeypatch.setenv(CORE_ENV, "python")
    python_binding = binding._Binding()
    start = installed.memory_stats()["allocation.all.current"]
    with cp.cuda.using_allocator(python_binding.alloc):
        xs = [cp.empty(n, dtype=cp.int8) for n in NBYTES]
    assert [x.data.mem.size for x in xs] == [round_size(n) for n in NBYTES]
    assert installed.memory_stats()["allocation.all.current"] == start + len(NBYTES)
    del xs
    gc.collect()
    assert installed.memory_stats()["allocation.all.current"] == start
