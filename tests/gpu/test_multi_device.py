"""One allocator per CUDA device: arrays on device 1 go to device 1's allocator (needs 2 GPUs)."""

from __future__ import annotations

import gc

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem.runtime import registry

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def two_devices():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    gm.install()
    yield cupy
    gc.collect()
    gm.uninstall()
    for index in (0, 1):
        registry.get_allocator(index).record_history(False)
        registry.get_allocator(index).empty_cache()


def test_each_device_has_its_own_allocator(two_devices) -> None:
    cp = two_devices
    a0, a1 = registry.get_allocator(0), registry.get_allocator(1)
    assert a0 is not a1 and a1.device.index == 1
    base0, base1 = a0.memory_allocated(), a1.memory_allocated()
    with cp.cuda.Device(1):
        y = cp.arange(MiB // 2, dtype=cp.int64)  # 4 MiB on device 1
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            z = y * 2
        s.synchronize()
        total = int(z.sum())
    x = cp.ones(MiB // 4, dtype=cp.float32)  # 1 MiB on device 0
    assert a1.owns(y.data.ptr) and a1.owns(z.data.ptr) and not a0.owns(y.data.ptr)
    assert a0.owns(x.data.ptr) and not a1.owns(x.data.ptr)
    assert a1.memory_allocated() - base1 >= 8 * MiB
    assert a0.memory_allocated() - base0 >= MiB
    assert gm.memory_allocated(1) == a1.memory_allocated()
    assert gm.memory_allocated(cp.cuda.Device(1)) == gm.memory_allocated("cuda:1")
    n = MiB // 2
    assert total == n * (n - 1)
    assert {seg["stream"] for seg in a1.snapshot()["segments"]} >= {s.ptr}
    snap = gm.snapshot()
    assert {seg["device"] for seg in snap["segments"]} >= {0, 1}
    assert len(snap["device_traces"]) == 2
    del x, y, z
    gc.collect()
    assert a0.memory_allocated() == base0 and a1.memory_allocated() == base1
    a0.check_invariants()
    a1.check_invariants()


def test_an_oom_on_one_device_leaves_the_other_alone(two_devices) -> None:
    cp = two_devices
    from cupy.cuda.memory import OutOfMemoryError

    gm.set_per_process_memory_fraction(0.001, device=1)
    try:
        with cp.cuda.Device(1), pytest.raises(OutOfMemoryError, match="device 1"):
            cp.empty(1 << 30, dtype=cp.uint8)
        x = cp.empty(1 << 30, dtype=cp.uint8)  # device 0 is not capped
        assert registry.get_allocator(0).owns(x.data.ptr)
        del x
    finally:
        gm.set_per_process_memory_fraction(1.0, device=1)
