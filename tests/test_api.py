"""The torch.cuda.memory-style module API: on a simulated device, and on a machine with no GPU."""

from __future__ import annotations

import pickle
import sys
import warnings

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem import api
from jupyter_gpumem.devices import cupy_device as _cupy_device
from jupyter_gpumem.devices import nvml
from jupyter_gpumem.runtime import registry

MiB = 1 << 20
NO_GPU = _cupy_device.cuda_unavailable_reason() is not None


def test_the_api_on_a_simulated_device(sim, tmp_path) -> None:
    p = gm.caching_allocator_alloc(3 * MiB)
    q = gm.caching_allocator_alloc(1000, 0, 7)
    stats = gm.memory_stats()
    assert stats["allocated_bytes.all.current"] == 3 * MiB + 1024
    assert stats["segment.all.current"] == 2  # a 20 MiB large segment and a 2 MiB small one
    assert gm.memory_allocated() == gm.memory_allocated(0) == gm.memory_allocated("cuda:0")
    assert gm.memory_reserved() == 22 * MiB == gm.memory_cached()
    assert gm.max_memory_allocated() == 3 * MiB + 1024
    assert gm.memory_stats_as_nested_dict()["segment"]["small_pool"]["current"] == 1
    assert "memory summary, device ID 0" in gm.memory_summary()
    assert gm.get_allocator_backend() == "simulated"
    assert {seg["stream"] for seg in gm.memory_snapshot()} == {0, 7}
    gm.caching_allocator_delete(q)
    gm.caching_allocator_delete(p)
    with pytest.raises(ValueError, match="not allocated"):
        gm.caching_allocator_delete(p)
    assert gm.max_memory_allocated() == 3 * MiB + 1024
    gm.reset_peak_memory_stats()
    assert gm.max_memory_allocated() == 0
    with pytest.warns(FutureWarning):
        gm.reset_max_memory_allocated()
    with pytest.warns(FutureWarning):
        gm.reset_max_memory_cached()
    gm.reset_accumulated_memory_stats()
    assert gm.memory_stats()["allocation.all.allocated"] == 0
    gm.empty_cache()
    assert gm.memory_reserved() == 0 and gm.max_memory_reserved() == 22 * MiB
    free, total = gm.mem_get_info()
    assert free == total == sim.device.mem_get_info()[1]


def test_memory_fraction_checks_and_caps(sim) -> None:
    with pytest.raises(TypeError, match="must be `float`"):
        gm.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match="Allowed range"):
        gm.set_per_process_memory_fraction(1.5)
    assert gm.get_per_process_memory_fraction() == 1.0
    gm.set_per_process_memory_fraction(0.02)  # about 20 MiB of the 1 GiB device
    assert gm.get_per_process_memory_fraction() == 0.02
    with pytest.raises(gm.OutOfMemoryError, match=r"per_process_memory_fraction=0\.02"):
        gm.caching_allocator_alloc(30 * MiB)
    assert gm.memory_stats()["num_ooms"] == 1
    gm.set_per_process_memory_fraction(1.0)
    gm.caching_allocator_delete(gm.caching_allocator_alloc(30 * MiB))


def test_bad_arguments_change_nothing(sim) -> None:
    before = gm.memory_stats()
    with pytest.raises(ValueError, match="size must be >= 0, got -1"):
        gm.caching_allocator_alloc(-1)
    for bad_size, kind in ((1.5, "float"), ("1", "str"), (True, "bool")):
        with pytest.raises(TypeError, match=f"size must be an int, got {kind}"):
            gm.caching_allocator_alloc(bad_size)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stream"):
        gm.caching_allocator_alloc(512, stream="default")
    with pytest.raises(TypeError):
        gm.memory_stats(device=1.0)
    with pytest.raises(ValueError):
        gm.memory_stats(device="gpu:0")
    with pytest.raises(ValueError, match="no simulated device 3"):
        gm.memory_stats(device=3)
    with pytest.raises(ValueError):
        gm.record_memory_history(enabled="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        gm.record_memory_history(max_entries=0)
    assert gm.memory_stats() == before


def test_history_snapshot_and_dump(sim, tmp_path) -> None:
    gm.record_memory_history(max_entries=100)
    p = gm.caching_allocator_alloc(5000)  # this line allocates
    line = sys._getframe().f_lineno - 1
    snap = gm.snapshot()
    alloc = [e for e in snap["device_traces"][0] if e["action"] == "alloc"][-1]
    assert (alloc["frames"][0]["filename"], alloc["frames"][0]["line"]) == (__file__, line)
    gm.record_memory_history("state")  # stacks of live blocks only, no events
    gm.caching_allocator_delete(p)
    assert gm.snapshot()["device_traces"][0] == []
    gm.record_memory_history(None)
    path = tmp_path / "snap.pickle"
    gm.dump_snapshot(str(path))
    with open(path, "rb") as f:
        assert pickle.load(f)["segments"] == gm.memory_snapshot()


def test_processes_and_breakdown_on_a_simulated_device(sim) -> None:
    sim.device.hold_for_process(4242, 64 * MiB, "trainer")
    try:
        assert gm.list_gpu_processes() == (
            "GPU:0\nprocess       4242 uses       64.000 MB GPU memory")
        p = gm.caching_allocator_alloc(MiB)
        breakdown = gm.memory_breakdown()
        assert breakdown["reserved"] == 2 * MiB and breakdown["allocated"] == MiB
        assert breakdown["other_processes"] == 64 * MiB
        assert breakdown["outside_allocator"] == 64 * MiB
        assert breakdown["this_process_outside_allocator"] == 0
        gm.caching_allocator_delete(p)
    finally:
        sim.device.hold_for_process(4242, 0)


@pytest.mark.skipif(not NO_GPU, reason="checks the answers given where no GPU is visible")
def test_no_gpu_answers_like_pytorch_or_says_why_in_one_line() -> None:
    assert registry.backend() == "cuda"
    assert gm.memory_stats() == {} and gm.memory_stats_as_nested_dict() == {}
    assert gm.memory_allocated() == gm.max_memory_reserved() == gm.memory_cached() == 0
    assert gm.memory_snapshot() == []
    gm.empty_cache()  # nothing to do
    lines = gm.list_gpu_processes().splitlines()
    assert lines[0] == "GPU:0" and len(lines) == 2 and "no CUDA device" in lines[1]
    for call in (gm.mem_get_info, gm.reset_peak_memory_stats, gm.memory_summary,
                 lambda: gm.caching_allocator_alloc(512), gm.install,
                 lambda: gm.set_per_process_memory_fraction(0.5)):
        with pytest.raises(gm.NoDeviceError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and "%gpumem device sim" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gm.get_allocator_backend() in ("cupy", "cudaMalloc", "none")


def test_nvml_missing_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(nvml, "_initialised", False)
    import pynvml

    def fail() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    with pytest.raises(nvml.NvmlUnavailable) as info:
        nvml.processes(0)
    assert "\n" not in str(info.value) and "driver" in str(info.value)
    with pytest.raises(nvml.NvmlUnavailable):  # remembered: NVML is not asked again
        nvml.memory_info(0)


def test_pluggable_allocator_refuses_bad_libraries(tmp_path) -> None:
    with pytest.raises(ValueError, match="no shared library"):
        gm.PluggableAllocator(str(tmp_path / "missing.so"), "a", "f")
    with pytest.raises(ValueError, match="signature"):
        gm.PluggableAllocator(str(tmp_path / "x.so"), "a", "f", signature="c")  # type: ignore[arg-type]
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not a library")
    with pytest.raises(ValueError, match="cannot load"):
        gm.PluggableAllocator(str(bogus), "a", "f")


def test_the_api_module_lists_every_torch_name() -> None:
    torch_names = {
        "caching_allocator_alloc", "caching_allocator_delete", "set_per_process_memory_fraction",
        "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
        "reset_accumulated_memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated",
        "reset_max_memory_cached", "memory_allocated", "max_memory_allocated", "memory_reserved",
        "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_snapshot",
        "memory_summary", "list_gpu_processes", "mem_get_info", "record_memory_history",
        "snapshot", "dump_snapshot", "get_allocator_backend", "change_current_allocator",
    }
    assert torch_names <= set(api.__all__)
    assert all(callable(getattr(gm, name)) for name in torch_names | {"PluggableAllocator"})


@pytest.mark.parametrize("core", ["c", "python"])
def test_a_handle_is_a_new_int_so_a_freed_copy_never_holds(core, monkeypatch) -> None:
    # a core may hand out the int object it keeps for an address: a variable still holding
    # the freed handle must not hold the block that reuses the address (``data.handles``)
    from jupyter_gpumem.data.holders import find_holders
    from jupyter_gpumem.runtime import registry

    if core == "c" and not gm.CachingAllocator(gm.SimulatedDevice(1 << 20)).native:
        pytest.skip("the C core is not built")
    monkeypatch.setenv("JUPYTER_GPUMEM_CORE", core)
    allocator = registry.use_simulated_device(1 << 30, fresh=True)[0]
    try:
        old = gm.caching_allocator_alloc(1 << 20)
        gm.caching_allocator_delete(old)
        new = gm.caching_allocator_alloc(1 << 20)
        assert new == old and new is not old
        assert find_holders({"old": old, "new": new}, [(new, allocator.block_of(new)[1])]) == {
            new: ["new"]}
        gm.caching_allocator_delete(new)
    finally:
        registry.use_cuda()
