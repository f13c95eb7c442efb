"""Expandable segments on a real GPU: the CuPy device's VMM calls, parity with PyTorch's
``expandable_segments:True``, and CuPy arrays living in mapped pages.

(i) a self-check of CupyDevice's reserve/map/unmap/release, writing through CuPy, and a map that
    runs out of physical memory leaving nothing mapped; (ii) the random programs of
    test_torch_parity.py, PyTorch (a child process with PYTORCH_CUDA_ALLOC_CONF set, read at its
    first CUDA use) against ours on the CuPy device, every compared counter equal after every
    step; (iii) CuPy arrays made by our expandable allocator: values, a matmul, all pages back.

Run as a script (``--torch-child``) it is the PyTorch side of (ii).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":  # PyTorch's child process: tests/ is not on its path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
PARITY = Path(__file__).resolve().parent / "test_torch_parity.py"
EXPANDABLE = "expandable_segments:True"
MiB = 1 << 20
SEEDS, STEPS = (1, 2, 3), 400

pytestmark = pytest.mark.gpu


def _parity_module() -> Any:
    """test_torch_parity.py (its random programs and compared keys); it needs PyTorch."""
    return load_script(PARITY, "torch_parity_for_expandable")


def _expandable_config() -> Any:
    from jupyter_gpumem import AllocatorConfig

    try:
        config = AllocatorConfig(expandable_segments=True)  # type: ignore[call-arg]
    except TypeError:
        pytest.skip("this engine has no expandable_segments key yet")
    assert AllocatorConfig.parse(EXPANDABLE) == config
    return config


@pytest.fixture
def device(cp):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    from jupyter_gpumem.devices.cupy_device import CupyDevice

    return CupyDevice(0)


def _view(cp, ptr: int, nbytes: int) -> Any:
    """A uint8 CuPy array over [ptr, ptr+nbytes), owned by nobody."""
    mem = cp.cuda.UnownedMemory(ptr, nbytes, owner=None, device_id=0)
    return cp.ndarray((nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))


def _fill_and_check(cp, ptr: int, nbytes: int, value: int) -> None:
    a = _view(cp, ptr, nbytes)
    a.fill(value)
    a[nbytes // 2] = (value + 1) % 256
    cp.cuda.Device(0).synchronize()
    assert int(a[nbytes // 2]) == (value + 1) % 256
    assert int((a == value).sum()) == nbytes - 1
    del a
    cp.get_default_memory_pool().free_all_blocks()  # the temporaries above, out of the way


def _device_free(cp, device) -> int:
    cp.get_default_memory_pool().free_all_blocks()
    return int(device.mem_get_info()[0])


# -- (i) the device's VMM calls ----------------------------------------------------------------

def test_vmm_self_check(cp, device) -> None:
    gran = device.vmm_granularity()
    print(f"\nVMM self-check on {device.name}: granularity {gran} B")
    assert gran >= 64 * 1024 and gran & (gran - 1) == 0
    vm = device.virtual_memory()
    pages = 64
    free0 = _device_free(cp, device)
    ptr = device.reserve(2 * pages * gran)
    try:
        print(f"  reserved {2 * pages} pages at {ptr:#x}")
        assert ptr % gran == 0
        device.map(ptr, pages * gran)
        free1 = _device_free(cp, device)
        print(f"  mapped {pages} pages: device free fell by {(free0 - free1) / MiB:.0f} MiB")
        assert free0 - free1 >= pages * gran * 3 // 4
        _fill_and_check(cp, ptr, pages * gran, 7)
        # a second map call right after the first: one contiguous range through both
        device.map(ptr + pages * gran, 4 * gran)
        _fill_and_check(cp, ptr + (pages - 2) * gran, 6 * gran, 9)
        # a sub-range from the middle of one map call goes back, then maps again
        device.unmap(ptr + 3 * gran, 2 * gran)
        assert vm.mapped_bytes() == (pages + 2) * gran
        device.map(ptr + 3 * gran, 2 * gran)
        _fill_and_check(cp, ptr, (pages + 4) * gran, 11)
        print("  write/read through CuPy across map calls and a remapped hole: ok")
        device.unmap(ptr, 10 * gran)
        device.unmap(ptr + 10 * gran, (pages - 6) * gran)
        assert vm.mapped_bytes() == 0
    finally:
        for i in range(2 * pages):  # whatever a failed step left mapped
            if vm.mapped_bytes():
                with contextlib.suppress(ValueError):
                    device.unmap(ptr + i * gran, gran)
        device.release(ptr, 2 * pages * gran)
    free2 = _device_free(cp, device)
    print(f"  unmapped and released: device free back within {(free0 - free2) / MiB:.0f} MiB")
    assert free0 - free2 < 16 * gran
    assert vm.reserved_ranges() == {}


def test_vmm_out_of_memory_maps_nothing(cp, device) -> None:
    from jupyter_gpumem.engine.device import DeviceOutOfMemory

    gran = device.vmm_granularity()
    vm = device.virtual_memory()
    free0 = _device_free(cp, device)
    filler = None
    for margin in (256 * MiB, 512 * MiB, 1024 * MiB):  # fill the device but for the margin
        try:
            filler = cp.cuda.runtime.malloc(free0 - margin)
            break
        except cp.cuda.runtime.CUDARuntimeError:
            continue
    if filler is None:
        pytest.skip("could not fill the device with one cudaMalloc")
    try:
        span = (margin + 1024 * MiB) // gran * gran  # more than is left
        ptr = device.reserve(span)
        try:
            before = _device_free(cp, device)
            with pytest.raises(DeviceOutOfMemory) as info:
                device.map(ptr, span)
            print(f"\n  map past the device's memory ({before / MiB:.0f} MiB free): {info.value}")
            assert vm.mapped_bytes() == 0
            assert _device_free(cp, device) >= before - 4 * gran  # nothing of it kept
            device.map(ptr, 8 * gran)  # the device still maps what fits
            _fill_and_check(cp, ptr, 8 * gran, 3)
            device.unmap(ptr, 8 * gran)
        finally:
            device.release(ptr, span)
    finally:
        cp.cuda.runtime.free(filler)


# -- (ii) parity with PyTorch's expandable segments --------------------------------------------

def _torch_steps(seed: int, out: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=EXPANDABLE,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__, "--torch-child", str(seed), str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_same_numbers_as_pytorch_expandable(cp, device, tmp_path) -> None:
    pytest.importorskip("torch")
    from jupyter_gpumem import CachingAllocator

    config = _expandable_config()
    for seed in SEEDS:
        torch_side = _torch_steps(seed, tmp_path / f"torch-{seed}.json")
        if "skipped" in torch_side:
            pytest.skip(torch_side["skipped"])
        assert torch_side["expandable"], "PyTorch made no expandable segment: setting ignored?"
        ops = [tuple(op) for op in torch_side["ops"]]
        compared = torch_side["compared"]
        ours = CachingAllocator(device, config, debug=True)
        live: list[int] = []
        try:
            for step, ((op, arg), theirs) in enumerate(zip(ops, torch_side["stats"], strict=True)):
                if op == "alloc":
                    live.append(ours.malloc(arg, 0))
                elif op == "free":
                    ours.free(live.pop(arg % len(live)))
                else:
                    ours.empty_cache()
                mine = ours.memory_stats()
                diff = {k: (theirs.get(k), mine.get(k)) for k in compared
                        if theirs.get(k) != mine.get(k)}
                assert not diff, (f"seed {seed} step {step} "
                                  f"{ops[max(0, step - 3):step + 1]}: (torch, ours) {diff}")
        finally:
            for ptr in live:
                ours.free(ptr)
            ours.empty_cache()
        assert ours.memory_reserved() == 0
        print(f"\n  seed {seed}: {len(ops)} steps, every counter equal "
              f"(peak reserved {ours.memory_stats()['reserved_bytes.all.peak'] / MiB:.0f} MiB)")


def torch_child(seed: int, out: str) -> int:
    """PyTorch's side of (ii): run the program, write every step's counters as JSON."""
    import torch

    if not torch.cuda.is_available():
        Path(out).write_text(json.dumps({"skipped": "PyTorch sees no CUDA device"}))
        return 0
    parity = _parity_module()
    ops = parity._program(seed * 101 + len(EXPANDABLE), STEPS)
    stream = torch.cuda.current_stream().cuda_stream
    live: list[int] = []
    stats: list[dict[str, int]] = []
    expandable = False
    for op, arg in ops:
        if op == "alloc":
            live.append(torch.cuda.caching_allocator_alloc(arg, 0, stream))
        elif op == "free":
            torch.cuda.caching_allocator_delete(live.pop(arg % len(live)))
        else:
            torch.cuda.empty_cache()
        s = torch.cuda.memory_stats()
        stats.append({k: s.get(k) for k in parity.COMPARED})
        if not expandable and live:
            expandable = any(seg.get("is_expandable", False)
                             for seg in torch.cuda.memory_snapshot())
    for ptr in live:
        torch.cuda.caching_allocator_delete(ptr)
    Path(out).write_text(json.dumps({"ops": ops, "stats": stats, "compared": parity.COMPARED,
                                     "expandable": expandable, "torch": torch.__version__}))
    return 0


# -- (iii) CuPy arrays on our expandable allocator ---------------------------------------------

def test_cupy_arrays_live_in_mapped_pages(cp, device) -> None:
    import numpy as np
    from cupy.cuda.memory import PythonFunctionAllocator

    from jupyter_gpumem import CachingAllocator

    ours = CachingAllocator(device, _expandable_config())

    def malloc(size: int, device_id: int) -> int:
        return int(ours.malloc(size, int(cp.cuda.get_current_stream().ptr)))

    def free(ptr: int, device_id: int) -> None:
        ours.free(ptr)

    vm = device.virtual_memory()
    with cp.cuda.using_allocator(PythonFunctionAllocator(malloc, free).malloc):
        x = cp.zeros(1000, dtype=cp.float32)
        x[123] = 7.5
        assert float(x[123]) == 7.5 and float(x.sum()) == 7.5
        rng = np.random.default_rng(3)
        a_host = rng.standard_normal((512, 384), dtype=np.float32)
        b_host = rng.standard_normal((384, 256), dtype=np.float32)
        c = cp.asarray(a_host) @ cp.asarray(b_host)  # cuBLAS, workspace from ours too
        assert np.allclose(cp.asnumpy(c), a_host @ b_host, rtol=1e-4, atol=1e-3)
        big = cp.arange(48 * MiB // 4, dtype=cp.int32)  # spans many pages
        assert int(big[-1]) == 48 * MiB // 4 - 1 and int(big[::4096].sum()) == int(
            np.arange(48 * MiB // 4, dtype=np.int64)[::4096].sum())
        assert ours.memory_allocated() > 48 * MiB
        assert vm.mapped_bytes() >= ours.memory_allocated()  # the blocks sit in mapped pages
        print(f"\n  arrays on expandable segments: {ours.memory_reserved() / MiB:.0f} MiB "
              f"reserved, {vm.mapped_bytes() / MiB:.0f} MiB mapped")
        del x, c, big
        cp.cuda.Device(0).synchronize()
    gc.collect()
    ours.empty_cache()
    left = ours.memory_allocated()
    assert vm.mapped_bytes() == ours.memory_reserved()  # reserved counts mapped pages only
    if left:  # a library handle (cuBLAS) may keep a workspace block: its pages stay
        print(f"  {left} B still allocated after the arrays went (a library's workspace?)")
    else:
        assert ours.memory_reserved() == 0 and vm.mapped_bytes() == 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=(
        "PyTorch's side of the expandable-segments parity test (ii): run the random program of "
        f"SEED with PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}, write every step's counters to OUT."))
    parser.add_argument("--torch-child", nargs=2, metavar=("SEED", "OUT"), required=True)
    seed, out = parser.parse_args().torch_child
    try:
        number = int(seed)
    except ValueError:
        parser.error(f"SEED must be an integer, got {seed!r}")
    sys.exit(torch_child(number, out))
