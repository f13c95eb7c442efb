"""The allocator the binding gives CuPy, on a simulated device: CuPy's own memory classes (they
need no GPU to be made), with CuPy's device and stream lookups stood in for."""

from __future__ import annotations

import gc

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.sizes import round_size
from jupyter_gpumem.engine.allocator import CORE_ENV, native_core_available
from jupyter_gpumem.runtime import binding, registry

MiB = 1 << 20
CORES = ["python"] + (["c"] if native_core_available() else [])


@pytest.fixture(params=CORES)
def bound(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A fresh binding over a simulated allocator as CUDA device 0, with the given core."""
    import cupy

    monkeypatch.setenv(CORE_ENV, request.param)
    monkeypatch.setattr(cupy.cuda.device, "get_device_id", lambda: 0)
    monkeypatch.setattr(cupy.cuda.stream, "get_current_stream_ptr", lambda: 0x42, raising=False)
    a = CachingAllocator(SimulatedDevice(256 * MiB), native=request.param == "c")
    monkeypatch.setitem(registry._cuda, 0, a)
    yield binding._Binding(), a
    gc.collect()
    assert a.memory_allocated() == 0
    a.check_invariants()


@pytest.mark.parametrize("divisions", [None, 4])
def test_alloc_reports_the_rounded_block_size(bound, divisions: int | None) -> None:
    from cupy.cuda.memory import MemoryPointer

    b, a = bound
    a.set_config(AllocatorConfig(roundup_power2_divisions=divisions))
    for n in (1, 16, 100, 511, 512, 513, 5000, MiB + 1, 5 * MiB + 3):
        p = b.alloc(n)
        assert type(p) is MemoryPointer
        assert p.mem.size == round_size(n, divisions or 0)  # as CuPy's pool: 16 B -> 512 B
        assert (p.mem.device_id, p.ptr) == (0, p.mem.ptr)
        assert a.owns(p.ptr)
        assert a.memory_stats()["requested_bytes.all.current"] == n
        del p  # the memory object's destructor gives the block back
        assert a.memory_allocated() == 0
    assert a.memory_stats()["allocation.all.freed"] == 9


def test_alloc_of_zero_bytes_takes_no_block(bound) -> None:
    b, a = bound
    p = b.alloc(0)
    assert (p.ptr, p.mem.size) == (0, 0)
    assert a.memory_stats()["allocation.all.allocated"] == 0
