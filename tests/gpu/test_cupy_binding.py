"""Our allocator under real CuPy arrays, and the torch.cuda.memory-style API, on a CUDA device."""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import subprocess
import threading

import numpy as np
import pytest

import jupyter_gpumem as gm
from jupyter_gpumem.runtime import registry

pytestmark = pytest.mark.gpu
MiB = 1 << 20
GiB = 1 << 30


def _workload(cp, seed: int = 7) -> list[np.ndarray]:
    """Elementwise, reductions, matmul (cuBLAS), FFT, sort and random: results on the host."""
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((512, 384), dtype=cp.float32)
    b = rng.standard_normal((384, 256), dtype=cp.float32)
    ints = rng.integers(0, 1 << 30, size=100_000, dtype=cp.int64)
    out = [
        cp.sin(a) * 3 + cp.exp(-a * a),
        a.sum(axis=0),
        cp.cumsum(a, axis=1),
        a.max(),
        a @ b,
        cp.fft.fft(a[:, :256].astype(cp.complex64), axis=1),
        cp.sort(ints),
        cp.argsort(ints[:5000]),
        cp.unique(ints % 1000),
        cp.random.RandomState(seed).uniform(size=1000),
    ]
    host = [cp.asnumpy(x) for x in out]
    cp.fft.config.get_plan_cache().clear()  # FFT plans hold work areas from the allocator
    return host


def _same_bits(xs: list[np.ndarray], ys: list[np.ndarray]) -> bool:
    return all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
               for x, y in zip(xs, ys, strict=True))


def test_results_equal_cupys_pool_bit_for_bit(cp, installed) -> None:
    ours = _workload(cp)
    assert installed.memory_stats()["allocation.all.allocated"] > 10
    gm.uninstall()
    theirs = _workload(cp)
    gm.install()
    assert _same_bits(ours, theirs)


def test_install_is_idempotent_and_uninstall_restores(cp) -> None:
    before = cp.cuda.get_allocator()
    gm.install()
    first = cp.cuda.get_allocator()
    gm.install()
    assert cp.cuda.get_allocator() == first != before
    assert gm.get_allocator_backend() == "jupyter_gpumem"
    gm.uninstall()
    assert cp.cuda.get_allocator() == before
    assert gm.get_allocator_backend() == "cupy"
    gm.uninstall()  # a second uninstall does nothing


def test_arrays_outlive_uninstall(cp, installed) -> None:
    base = installed.memory_allocated()
    keep = [cp.arange(n * 1000, dtype=cp.float64) for n in range(1, 20)]
    held = installed.memory_allocated() - base
    assert held >= sum(x.nbytes for x in keep)
    gm.uninstall()
    scratch = cp.ones(1 << 20)  # from CuPy's pool now, not ours
    assert installed.memory_allocated() - base == held
    total = float(sum(x.sum() for x in keep))
    assert total == sum(n * 1000 * (n * 1000 - 1) / 2 for n in range(1, 20))
    del keep, scratch
    gc.collect()
    assert installed.memory_allocated() == base  # every block came back to its owner, once
    installed.check_invariants()
    gm.install()


def test_non_default_streams_get_their_own_blocks(cp, installed) -> None:
    s1 = cp.cuda.Stream(non_blocking=True)
    s2 = cp.cuda.Stream(non_blocking=True)
    with s1:
        x = cp.ones(1 << 18, dtype=cp.float32)
        x *= 2
    with s2:
        y = cp.ones(1 << 18, dtype=cp.float32)
    s1.synchronize()
    s2.synchronize()
    streams = {seg["stream"] for seg in installed.snapshot()["segments"]
               for b in seg["blocks"] if b["state"] == "active_allocated"}
    assert {s1.ptr, s2.ptr} <= streams
    assert float(x.sum()) == 2 * (1 << 18)
    del x, y


def test_threads_allocate_at_once(cp, installed) -> None:
    base = installed.memory_allocated()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            with cp.cuda.Device(0):
                for i in range(200):
                    a = cp.full(1000 + (seed * 37 + i) % 5000, seed, dtype=cp.int32)
                    assert int(a.sum()) == seed * a.size
                    del a
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    gc.collect()
    assert installed.memory_allocated() == base
    installed.check_invariants()


def test_using_allocator_is_per_thread(cp) -> None:
    a = registry.get_allocator(0)
    base = a.memory_stats()["allocation.all.allocated"]
    with gm.using_allocator():
        x = cp.empty(4096, dtype=cp.uint8)
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(cp.empty(4096, cp.uint8).data.ptr))
        t.start()
        t.join()
    y = cp.empty(4096, dtype=cp.uint8)
    assert a.memory_stats()["allocation.all.allocated"] == base + 1  # only x
    assert a.owns(x.data.ptr) and not a.owns(y.data.ptr) and not a.owns(seen[0])
    del x, y


def test_oom_under_a_fraction_cap_then_recovery(cp, installed) -> None:
    from cupy.cuda.memory import OutOfMemoryError

    total = cp.cuda.runtime.memGetInfo()[1]
    gm.set_per_process_memory_fraction(0.01)
    ooms = gm.memory_stats()["num_ooms"]
    with pytest.raises(OutOfMemoryError) as info:
        cp.empty(int(total * 0.02), dtype=cp.uint8)
    message = str(info.value)
    assert "out of memory" in message and "per_process_memory_fraction=0.01" in message
    assert "Next step" in message
    assert isinstance(info.value, gm.OutOfMemoryError)
    assert gm.memory_stats()["num_ooms"] == ooms + 1
    gm.set_per_process_memory_fraction(1.0)
    big = cp.empty(int(total * 0.02), dtype=cp.uint8)  # recovered
    assert installed.owns(big.data.ptr)
    del big
    installed.check_invariants()


def test_empty_cache_gives_memory_back_to_the_device(cp, installed) -> None:
    installed.empty_cache()
    free_before = cp.cuda.runtime.memGetInfo()[0]
    x = cp.empty(GiB, dtype=cp.uint8)
    del x
    assert installed.memory_reserved() >= GiB
    assert cp.cuda.runtime.memGetInfo()[0] <= free_before - GiB + 64 * MiB  # still cached
    released = installed.empty_cache()
    assert released >= GiB
    assert cp.cuda.runtime.memGetInfo()[0] >= free_before - 64 * MiB


def test_api_on_the_device(cp, installed, tmp_path) -> None:
    x = cp.ones(3 * MiB // 4, dtype=cp.float32)
    stats = gm.memory_stats()
    assert stats["allocated_bytes.all.current"] >= 3 * MiB
    assert gm.memory_allocated() == stats["allocated_bytes.all.current"]
    assert gm.memory_allocated(0) == gm.memory_allocated(cp.cuda.Device(0))
    assert gm.memory_allocated("cuda:0") == gm.memory_allocated()
    assert gm.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"] > 0
    assert gm.max_memory_allocated() >= gm.memory_allocated()
    assert gm.memory_reserved() >= gm.memory_allocated()
    assert gm.memory_cached() == gm.memory_reserved()
    assert "memory summary, device ID 0" in gm.memory_summary()
    free, total = gm.mem_get_info()
    assert 0 < free < total
    assert gm.list_gpu_processes().startswith("GPU:0")
    breakdown = gm.memory_breakdown()
    assert breakdown["reserved"] == gm.memory_reserved()
    assert isinstance(breakdown["outside_allocator"], int) and breakdown["outside_allocator"] > 0
    with pytest.raises(TypeError):
        gm.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError):
        gm.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError):
        gm.caching_allocator_alloc(512, stream="default")
    ptr = gm.caching_allocator_alloc(1000, 0, cp.cuda.Stream(non_blocking=True))
    gm.caching_allocator_delete(ptr)
    with pytest.raises(ValueError):
        gm.caching_allocator_delete(ptr)
    with pytest.warns(FutureWarning):
        gm.reset_max_memory_allocated()

    gm.record_memory_history(max_entries=1000)
    y = cp.zeros(1 << 20, dtype=cp.float32)
    snap = gm.snapshot()
    gm.record_memory_history(None)
    alloc = [e for e in snap["device_traces"][0] if e["action"] == "alloc"][-1]
    assert alloc["frames"][0]["filename"] == __file__ or any(
        f["filename"] == __file__ for f in alloc["frames"])
    path = tmp_path / "dump.pickle"
    gm.dump_snapshot(str(path))
    from jupyter_gpumem.data.files import load_snapshot

    loaded = load_snapshot(str(path))
    assert len(loaded["segments"]) == len(gm.memory_snapshot())
    with open(path, "rb") as f:
        assert pickle.load(f)["segments"]  # a plain pickle PyTorch's viewer can read
    del x, y


def _build_pluggable(tmp_path) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test allocator")
    src = tmp_path / "alloc.c"
    src.write_text(r"""
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*free_t)(unsigned long long);
static alloc_t p_alloc;
static free_t p_free;
static long long n_alloc, n_free;
static int init(void) {
    if (p_alloc) return 1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return 0;
    p_alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    p_free = (free_t)dlsym(h, "cuMemFree_v2");
    return p_alloc && p_free;
}
void *torch_alloc(ssize_t size, int device, void *stream) {
    unsigned long long p = 0;
    if (!init() || p_alloc(&p, (size_t)size) != 0) return 0;
    n_alloc++;
    return (void *)p;
}
void torch_free(void *ptr, ssize_t size, int device, void *stream) {
    if (init()) p_free((unsigned long long)ptr);
    n_free++;
}
void *cupy_alloc(intptr_t param, size_t size) { return torch_alloc((ssize_t)size, 0, 0); }
void cupy_free(intptr_t param, void *ptr) { torch_free(ptr, 0, 0, 0); }
long long counts(int which) { return which ? n_free : n_alloc; }
""")
    so = tmp_path / "alloc.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", str(src), "-o", str(so), "-ldl"], check=True)
    return str(so)


@pytest.mark.parametrize("signature", ["torch", "cupy"])
def test_pluggable_c_allocator(cp, tmp_path, signature: str) -> None:
    import ctypes

    so = _build_pluggable(tmp_path)
    counts = ctypes.CDLL(so).counts
    counts.restype = ctypes.c_longlong
    names = ("torch_alloc", "torch_free") if signature == "torch" else ("cupy_alloc", "cupy_free")
    pluggable = gm.PluggableAllocator(so, *names, signature=signature)
    before = cp.cuda.get_allocator()
    gm.change_current_allocator(pluggable)
    try:
        assert gm.get_allocator_backend() == "pluggable"
        x = cp.arange(1 << 16, dtype=cp.float32)
        assert float(x.sum()) == (1 << 16) * ((1 << 16) - 1) / 2
        del x
        gc.collect()
    finally:
        cp.cuda.set_allocator(before)
    assert counts(0) >= 1 and counts(0) == counts(1)
    with pytest.raises(ValueError):
        gm.PluggableAllocator(so, "no_such_function", names[1])
    with pytest.raises(ValueError):
        gm.PluggableAllocator(os.path.join(str(tmp_path), "missing.so"), *names)
