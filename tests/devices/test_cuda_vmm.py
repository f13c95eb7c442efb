"""CudaVirtualMemory (the CuPy device's expandable-segment calls) against a fake driver binding."""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fake_cuda_driver import CUresult, FakeDriver

from jupyter_gpumem.devices.cupy_device import DRIVER_MODULE, CudaVirtualMemory, load_cuda_driver
from jupyter_gpumem.engine.device import DeviceOutOfMemory

MiB = 1 << 20
G = 2 * MiB  # the fake's granularity


class Host:
    """What the CuPy device lends: device activation, context init and synchronize, recorded."""

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.events: list[str] = []

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        self.events.append("activate")
        self.driver.calls.append(("<activate>",))
        yield

    def init_context(self) -> None:
        self.events.append("init_context")
        self.driver.context = 0xC7

    def synchronize(self) -> None:
        self.events.append("synchronize")
        self.driver.calls.append(("<synchronize>",))


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    fake = FakeDriver(pages=16, context=0xC0)
    monkeypatch.setitem(sys.modules, DRIVER_MODULE, fake)
    return fake


def _vm(driver: FakeDriver, index: int = 0) -> tuple[CudaVirtualMemory, Host]:
    host = Host(driver)
    vm = CudaVirtualMemory(index, activate=host.activate, init_context=host.init_context,
                           synchronize=host.synchronize)
    return vm, host


def _after(driver: FakeDriver, mark: int) -> list[tuple[Any, ...]]:
    return [c for c in driver.calls[mark:] if not c[0].startswith(("<", "cuCtxGetCurrent"))]


def test_the_binding_is_imported_lazily_and_its_absence_names_the_package(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, DRIVER_MODULE, None)  # as if cuda-bindings were missing
    with pytest.raises(ImportError, match="cuda-bindings") as info:
        load_cuda_driver()
    assert "pip install cuda-bindings" in str(info.value)
    with pytest.raises(ImportError, match="cuda-bindings"):
        CudaVirtualMemory(0, activate=contextlib.nullcontext, init_context=lambda: None,
                          synchronize=lambda: None)


def test_granularity_properties_and_a_whole_cycle(driver: FakeDriver) -> None:
    vm, _host = _vm(driver, index=0)
    assert driver.calls == []  # nothing happens until the first call
    assert vm.granularity() == G
    assert vm.granularity() == G  # computed once
    assert [c[0] for c in driver.calls].count("cuMemGetAllocationGranularity") == 1
    assert ("cuDeviceGetAttribute",
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            0) in driver.calls
    ptr = vm.reserve(5 * G + 1)  # rounded up to whole granules
    assert driver.reserved == {ptr: 6 * G}
    mark = len(driver.calls)
    vm.map(ptr + G, 3 * G)
    calls = _after(driver, mark)
    # one handle per granule, each mapped on its own, then one access call over the range
    assert [c[0] for c in calls] == ["cuMemCreate", "cuMemMap"] * 3 + ["cuMemSetAccess"]
    assert [c[1] for c in calls if c[0] == "cuMemCreate"] == [G, G, G]
    assert [(c[1], c[2]) for c in calls if c[0] == "cuMemMap"] == [
        (ptr + G, G), (ptr + 2 * G, G), (ptr + 3 * G, G)]
    assert calls[-1] == ("cuMemSetAccess", ptr + G, 3 * G, 1)
    rw = int(driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    assert set(driver.access.values()) == {(0, rw)}
    assert vm.mapped_bytes() == 3 * G and driver.physical_bytes() == 3 * G
    vm.unmap(ptr + G, 3 * G)
    assert driver.mappings == {} and driver.handles == {}
    vm.release(ptr, 5 * G + 1)
    assert driver.reserved == {} and vm.reserved_ranges() == {}


def test_any_granule_aligned_sub_range_unmaps_and_synchronizes_first(driver: FakeDriver) -> None:
    vm, _host = _vm(driver)
    ptr = vm.reserve(8 * G)
    vm.map(ptr, 6 * G)
    mark = len(driver.calls)
    vm.unmap(ptr + 2 * G, 2 * G)  # the middle of one map call
    calls = [c for c in driver.calls[mark:] if c[0] != "cuCtxGetCurrent"]
    handles = {a: h for a, (_, h) in driver.mappings.items()}
    assert [c[0] for c in calls] == ["<activate>", "<synchronize>",
                                     "cuMemUnmap", "cuMemRelease", "cuMemUnmap", "cuMemRelease"]
    assert [c[1:] for c in calls if c[0] == "cuMemUnmap"] == [(ptr + 2 * G, G), (ptr + 3 * G, G)]
    assert sorted(driver.mappings) == [ptr, ptr + G, ptr + 4 * G, ptr + 5 * G]
    assert driver.physical_bytes() == 4 * G
    # the hole maps again, and the rest unmaps in pieces of any granule-aligned size
    vm.map(ptr + 2 * G, G)
    vm.unmap(ptr + G, 2 * G)
    vm.unmap(ptr, G)
    vm.unmap(ptr + 4 * G, 2 * G)
    assert driver.mappings == {} and driver.handles == {}
    assert set(handles.values()).isdisjoint(driver.handles)
    vm.release(ptr, 8 * G)


def test_out_of_memory_mid_map_undoes_everything_newest_first(driver: FakeDriver) -> None:
    vm, _host = _vm(driver)
    ptr = vm.reserve(8 * G)
    vm.map(ptr, G)  # mapped before: must stay mapped
    driver.oom_after(3)
    mark = len(driver.calls)
    with pytest.raises(DeviceOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY") as info:
        vm.map(ptr + G, 5 * G)
    assert "after 3 of the 5 pages" in str(info.value)
    assert info.value.__context__ is None and info.value.__cause__ is None
    pickle.loads(pickle.dumps(info.value))  # crosses a process boundary (Dask) as it is
    calls = _after(driver, mark)
    made = [c[1] for c in calls if c[0] == "cuMemMap"]
    assert made == [ptr + G, ptr + 2 * G, ptr + 3 * G]
    tail = calls[len(made) * 2 + 1:]  # after the failing cuMemCreate: unmap+release, reversed
    assert [c[0] for c in tail] == ["cuMemUnmap", "cuMemRelease"] * 3
    assert [c[1] for c in tail if c[0] == "cuMemUnmap"] == made[::-1]
    assert "cuMemSetAccess" not in [c[0] for c in calls]
    assert list(driver.mappings) == [ptr] and len(driver.handles) == 1
    assert vm.mapped_bytes() == G
    # all or nothing: the same range maps once memory is there
    driver.oom_after(None)
    vm.map(ptr + G, 5 * G)
    assert vm.mapped_bytes() == 6 * G
    vm.unmap(ptr, 6 * G)
    vm.release(ptr, 8 * G)


def test_device_full_is_out_of_memory_too(driver: FakeDriver) -> None:
    vm, _ = _vm(driver)
    ptr = vm.reserve(32 * G)
    vm.map(ptr, 16 * G)  # the fake holds 16 pages
    with pytest.raises(DeviceOutOfMemory):
        vm.map(ptr + 16 * G, G)
    vm.unmap(ptr + 4 * G, G)
    vm.map(ptr + 16 * G, G)  # the page given back is usable again
    assert driver.physical_bytes() == 16 * G


@pytest.mark.parametrize("call", ["cuMemMap", "cuMemSetAccess"])
def test_other_errors_in_map_name_the_call_and_undo(driver: FakeDriver, call: str) -> None:
    vm, _ = _vm(driver)
    ptr = vm.reserve(4 * G)
    if call == "cuMemMap":  # fail the third page's map: its handle is released unmapped
        orig = driver.cuMemMap
        seen = []

        def flaky(*args: Any) -> Any:
            seen.append(args)
            if len(seen) == 3:
                driver.fail("cuMemMap", CUresult.CUDA_ERROR_NOT_SUPPORTED)
            return orig(*args)

        driver.cuMemMap = flaky  # type: ignore[method-assign]
    else:
        driver.fail(call, CUresult.CUDA_ERROR_NOT_SUPPORTED)
    with pytest.raises(RuntimeError, match=f"{call} failed on device 0: CUDA_ERROR_NOT_SUPPORTED"):
        vm.map(ptr, 4 * G)
    assert driver.mappings == {} and driver.handles == {}
    assert vm.mapped_bytes() == 0
    if call == "cuMemMap":
        assert driver.names().count("cuMemRelease") == 3  # two undone, one never mapped
    vm.release(ptr, 4 * G)


def test_the_first_map_error_is_raised_without_a_mapping(driver: FakeDriver) -> None:
    vm, _ = _vm(driver)
    ptr = vm.reserve(2 * G)
    driver.fail("cuMemMap", CUresult.CUDA_ERROR_NOT_SUPPORTED)
    with pytest.raises(RuntimeError, match="cuMemMap failed"):
        vm.map(ptr, 2 * G)
    assert driver.handles == {} and driver.mappings == {}


def test_errors_of_reserve_release_unmap_name_the_call(driver: FakeDriver) -> None:
    vm, _ = _vm(driver)
    driver.fail("cuMemAddressReserve", CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(DeviceOutOfMemory, match="cuMemAddressReserve"):
        vm.reserve(G)
    driver.fail("cuMemAddressReserve", CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(RuntimeError, match="cuMemAddressReserve failed on device 0: "
                                           "CUDA_ERROR_INVALID_VALUE"):
        vm.reserve(G)
    ptr = vm.reserve(2 * G)
    vm.map(ptr, 2 * G)
    driver.fail("cuMemUnmap")
    with pytest.raises(RuntimeError, match="cuMemUnmap failed"):
        vm.unmap(ptr, 2 * G)
    vm.unmap(ptr, 2 * G)  # nothing was forgotten: the same call works once the driver does
    driver.fail("cuMemAddressFree")
    with pytest.raises(RuntimeError, match="cuMemAddressFree failed"):
        vm.release(ptr, 2 * G)
    vm.release(ptr, 2 * G)
    assert driver.reserved == {}


def test_bad_calls_change_nothing(driver: FakeDriver) -> None:
    vm, _ = _vm(driver)
    ptr = vm.reserve(4 * G)
    vm.map(ptr, G)
    mark = len(driver.calls)
    bad: list[tuple[str, tuple[Any, ...], type[Exception]]] = [
        ("map", (ptr + 1, G), ValueError),  # not aligned
        ("map", (ptr, G + 1), ValueError),
        ("map", (ptr, 2 * G), ValueError),  # its first granule is mapped
        ("map", (ptr + 3 * G, 2 * G), ValueError),  # runs past the reservation
        ("map", (ptr, 0), ValueError),
        ("map", (ptr, 1.5), TypeError),
        ("unmap", (ptr, 2 * G), ValueError),  # the second granule is not mapped
        ("unmap", (ptr + G, G), ValueError),
        ("release", (ptr, 4 * G), ValueError),  # a granule is still mapped
        ("release", (ptr + G, 3 * G), ValueError),  # not a reservation's start
        ("release", (ptr, 2 * G), ValueError),  # not its whole size
        ("reserve", (0,), ValueError),
        ("reserve", (True,), TypeError),
    ]
    for name, args, error in bad:
        with pytest.raises(error):
            getattr(vm, name)(*args)
    assert _after(driver, mark) == []
    assert list(driver.mappings) == [ptr] and driver.reserved == {ptr: 4 * G}


def test_a_missing_context_is_made_current_first(driver: FakeDriver) -> None:
    driver.context = 0
    vm, host = _vm(driver)
    vm.granularity()
    assert host.events[:2] == ["activate", "init_context"]
    assert driver.names()[:4] == ["cuInit", "<activate>", "cuCtxGetCurrent", "cuCtxGetCurrent"]


def test_a_context_that_stays_missing_is_a_clear_error(driver: FakeDriver) -> None:
    driver.context = 0
    host = Host(driver)
    vm = CudaVirtualMemory(0, activate=host.activate, init_context=lambda: None,
                           synchronize=host.synchronize)
    with pytest.raises(RuntimeError, match="no CUDA context is current for device 0"):
        vm.granularity()


def test_a_device_without_vmm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver(vmm_supported=False)
    monkeypatch.setitem(sys.modules, DRIVER_MODULE, fake)
    vm, _ = _vm(fake)
    with pytest.raises(RuntimeError, match="does not support the CUDA virtual memory"):
        vm.reserve(G)


def test_the_device_ordinal_reaches_the_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver()
    monkeypatch.setitem(sys.modules, DRIVER_MODULE, fake)
    vm, _ = _vm(fake, index=3)
    ptr = vm.reserve(G)
    vm.map(ptr, G)
    assert ("cuMemGetAllocationGranularity", 3,
            fake.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM) in fake.calls
    assert ("cuMemCreate", G, 3, 0) in fake.calls
    assert set(fake.access.values()) == {
        (3, int(fake.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE))}
    vm.unmap(ptr, G)
    vm.release(ptr, G)
