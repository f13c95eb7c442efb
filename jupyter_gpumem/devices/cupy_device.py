"""A CUDA device seen through CuPy: the only module, with ``runtime.binding``, that imports CuPy.

CuPy is imported when a CupyDevice is made, never at package import. The virtual-memory calls
of expandable segments (reserve, map, unmap, release) go through NVIDIA's ``cuda.bindings``
driver binding, imported only when expandable segments are first used: see CudaVirtualMemory.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jupyter_gpumem.devices import nvml
from jupyter_gpumem.engine.device import DeviceOutOfMemory

CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation


class NoDeviceError(RuntimeError):
    """No CUDA device is usable here; the message says why in one line."""


def cuda_unavailable_reason() -> str | None:
    """None when CuPy sees at least one CUDA device, else one line saying why not."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); pip install cupy-cuda12x"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError, or a missing driver library
        return f"no CUDA device is visible ({_one_line(exc)})"
    if count == 0:
        return "no CUDA device is visible (the driver reports 0 devices)"
    return None


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def current_device_index() -> int:
    """CuPy's current CUDA device (NoDeviceError where CuPy sees none)."""
    require_cuda()
    import cupy

    return int(cupy.cuda.runtime.getDevice())


def require_cuda() -> None:
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise NoDeviceError(
            f"jupyter_gpumem: {reason}. To try the tools without a GPU, call "
            "jupyter_gpumem.use_simulated_device() or run %gpumem device sim."
        )


class CupyDevice:
    """Segments from ``cudaMalloc`` on one device, memory info, and NVML's process list."""

    def __init__(self, index: int) -> None:
        import cupy

        self._cupy = cupy
        self._runtime = cupy.cuda.runtime
        self.index = index
        self.clock = time.perf_counter_ns
        props = self._runtime.getDeviceProperties(index)
        name = props.get("name", b"CUDA device")
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        try:
            self.pci_bus_id: str | None = self._runtime.deviceGetPCIBusId(index)
        except Exception:
            self.pci_bus_id = None
        self._vm: CudaVirtualMemory | None = None

    def malloc(self, nbytes: int, stream: int) -> int:
        runtime = self._runtime
        with self._cupy.cuda.Device(self.index):
            try:
                return int(runtime.malloc(nbytes))
            except runtime.CUDARuntimeError as exc:
                if exc.status != CUDA_ERROR_MEMORY_ALLOCATION:  # not sticky: nothing to clear
                    raise
                message = str(exc)
        # raised outside the except: no CUDA error as its context, so the OOM error built on
        # it pickles (a Dask worker sends it to the client) whatever CuPy's errors do
        raise DeviceOutOfMemory(message)

    def free(self, ptr: int) -> None:
        with self._cupy.cuda.Device(self.index):
            self._runtime.free(ptr)

    # -- expandable segments: the VirtualMemoryDevice calls -------------------------------------

    def virtual_memory(self) -> CudaVirtualMemory:
        """The driver's VMM calls on this device; made (and cuda.bindings imported) on first use."""
        if self._vm is None:
            runtime = self._runtime
            cuda = self._cupy.cuda
            index = self.index
            self._vm = CudaVirtualMemory(
                index,
                activate=lambda: cuda.Device(index),
                # cudaFree(0) makes the runtime create (or retain) the primary context and make
                # it current: the context CuPy and every cudaMalloc'd segment use
                init_context=lambda: runtime.free(0),
                synchronize=runtime.deviceSynchronize,
            )
        return self._vm

    def vmm_granularity(self) -> int:
        return self.virtual_memory().granularity()

    def reserve(self, nbytes: int) -> int:
        return self.virtual_memory().reserve(nbytes)

    def release(self, ptr: int, nbytes: int) -> None:
        self.virtual_memory().release(ptr, nbytes)

    def map(self, ptr: int, nbytes: int) -> None:
        self.virtual_memory().map(ptr, nbytes)

    def unmap(self, ptr: int, nbytes: int) -> None:
        self.virtual_memory().unmap(ptr, nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        with self._cupy.cuda.Device(self.index):
            free, total = self._runtime.memGetInfo()
        return int(free), int(total)

    def processes(self) -> list[tuple[int, str, int]]:
        """Other processes on this device, from NVML; empty when NVML cannot tell."""
        try:
            rows = nvml.processes(self.index, self.pci_bus_id)
        except nvml.NvmlUnavailable:
            return []
        me = os.getpid()
        return [row for row in rows if row[0] != me]

    def nvml_processes(self) -> list[tuple[int, str, int]]:
        """Every compute process on this device, this one included; raises NvmlUnavailable."""
        return nvml.processes(self.index, self.pci_bus_id)


def cupy_oom_error() -> Any:
    """The exception class our CUDA allocators raise: CuPy's OutOfMemoryError, and ours."""
    global _OOM_CLASS
    if _OOM_CLASS is None:
        from cupy.cuda.memory import OutOfMemoryError as CupyOutOfMemoryError

        from jupyter_gpumem.engine.oom import OomReport, OutOfMemoryError, explain_oom

        class GpumemOutOfMemoryError(CupyOutOfMemoryError, OutOfMemoryError):  # type: ignore[misc]
            """CuPy's OutOfMemoryError, raised by jupyter_gpumem with the whole story."""

            def __init__(self, report: OomReport) -> None:
                self.report = report
                MemoryError.__init__(self, explain_oom(report))

            def __reduce__(self) -> Any:  # this class is made here: rebuild it by a function
                return rebuild_cupy_oom, (self.report, self.args, dict(self.__dict__))

        GpumemOutOfMemoryError.__module__ = "jupyter_gpumem"
        _OOM_CLASS = GpumemOutOfMemoryError
    return _OOM_CLASS


_OOM_CLASS: Any = None


def rebuild_cupy_oom(report: Any, args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Unpickle the class of ``cupy_oom_error`` (a Dask worker's OOM, in the notebook)."""
    from jupyter_gpumem.engine.oom import rebuild_oom

    return rebuild_oom(cupy_oom_error(), report, args, state)


# -- expandable segments: the CUDA driver's virtual memory management (VMM) API -----------------
#
# Which binding, and why: NVIDIA's ``cuda.bindings.driver`` (package cuda-bindings), not our C
# core. The C core is device-agnostic by design: it builds and is tested on CI with no CUDA
# toolkit, and it reaches a device only through the Device protocol; linking it against libcuda
# would tie the extension's build to a CUDA installation. These calls run only when a segment
# grows or shrinks (a cached malloc/free never reaches the device), where the driver's own
# cost (tens of µs per cuMemCreate/cuMemMap) dwarfs a Python call, so Python costs nothing that
# matters. And the binding is NVIDIA's maintained one, with the driver's structs and enums
# typed for each CUDA version, where ctypes would mean hand-written struct layouts.

DRIVER_MODULE = "cuda.bindings.driver"


def load_cuda_driver() -> Any:
    """``cuda.bindings.driver``, or an ImportError that names the package to install."""
    try:
        return importlib.import_module(DRIVER_MODULE)
    except ImportError as exc:
        raise ImportError(
            "jupyter_gpumem: expandable_segments needs NVIDIA's CUDA driver binding, the "
            "package cuda-bindings (pip install cuda-bindings, the major version of your CUDA "
            f"driver); importing {DRIVER_MODULE} failed: {_one_line(exc)}"
        ) from None


class CudaVirtualMemory:
    """Virtual ranges and their physical pages on one device, through the driver's VMM API.

    ``reserve`` takes address space only (cuMemAddressReserve). ``map`` backs a granule-aligned
    range with physical memory: one cuMemCreate handle per granule, each mapped on its own
    (cuMemMap), then read/write access for the device (cuMemSetAccess). ``cuMemUnmap`` must
    cover whole mappings, so one mapping per granule is what lets ``unmap`` give back any
    granule-aligned sub-range: it unmaps and releases each granule's handle, which frees that
    physical page. ``release`` frees a reserved range once nothing in it is mapped.

    ``map`` is all or nothing: when the device runs out of memory (cuMemCreate says
    CUDA_ERROR_OUT_OF_MEMORY) it unmaps and releases whatever this call made and raises
    DeviceOutOfMemory. Any other CUDA error raises a RuntimeError naming the call and the error.
    Every call runs with this device current (``activate``) and a current context (the primary
    one, as CuPy uses: ``init_context`` makes it current where there is none yet).
    """

    def __init__(self, index: int, *, activate: Callable[[], Any],
                 init_context: Callable[[], Any], synchronize: Callable[[], Any],
                 driver: Any = None) -> None:
        self.index = index
        self._activate = activate
        self._init_context = init_context
        self._synchronize = synchronize
        self._driver = load_cuda_driver() if driver is None else driver
        self._lock = threading.Lock()
        self._granularity = 0
        self._prop: Any = None
        self._access: Any = None
        self._reserved: dict[int, int] = {}  # start of each reserved range -> its size
        self._handles: dict[int, Any] = {}  # address of each mapped granule -> its handle

    # -- the VirtualMemoryDevice calls -------------------------------------------------------

    def granularity(self) -> int:
        """The minimum granularity of a pinned allocation on this device, in bytes."""
        with self._lock:
            return self._granule()

    def reserve(self, nbytes: int) -> int:
        size = _positive_size("reserve", nbytes)
        d = self._driver
        with self._lock, self._current():
            gran = self._granule()
            size = -(-size // gran) * gran
            err, ptr = d.cuMemAddressReserve(size, 0, d.CUdeviceptr(0), 0)
            if _is_oom(d, err):
                raise DeviceOutOfMemory(
                    f"cuMemAddressReserve of {size} B failed: {_error_name(d, err)}")
            self._check("cuMemAddressReserve", err)
            start = int(ptr)
            self._reserved[start] = size
            return start

    def release(self, ptr: int, nbytes: int) -> None:
        d = self._driver
        with self._lock:
            gran = self._granule()
            size = -(-_positive_size("release", nbytes) // gran) * gran
            if self._reserved.get(ptr) != size:
                raise ValueError(f"release({ptr:#x}, {nbytes}): not a range that reserve "
                                 "handed out, or not its whole size")
            still = [a for a in self._handles if ptr <= a < ptr + size]
            if still:
                raise ValueError(f"release({ptr:#x}, {nbytes}): {len(still)} granule(s) in it "
                                 "are still mapped; unmap them first")
            with self._current():
                (err,) = d.cuMemAddressFree(ptr, size)
                self._check("cuMemAddressFree", err)
            del self._reserved[ptr]

    def map(self, ptr: int, nbytes: int) -> None:
        d = self._driver
        with self._lock:
            gran = self._granule()
            granules = self._granules("map", ptr, nbytes, gran)
            mapped = [a for a in granules if a in self._handles]
            if mapped:
                raise ValueError(f"map({ptr:#x}, {nbytes}): {len(mapped)} granule(s) in it "
                                 f"are mapped already, the first at {mapped[0]:#x}")
            made: list[tuple[int, Any]] = []  # (address, handle) mapped by this call
            with self._current():
                try:
                    for addr in granules:
                        err, handle = d.cuMemCreate(gran, self._prop, 0)
                        if _is_oom(d, err):
                            raise DeviceOutOfMemory(
                                f"cuMemCreate of a {gran} B page failed ({_error_name(d, err)})"
                                f" after {len(made)} of the {len(granules)} pages of a "
                                f"{nbytes} B map")
                        self._check("cuMemCreate", err)
                        (err,) = d.cuMemMap(addr, gran, 0, handle, 0)
                        if err != d.CUresult.CUDA_SUCCESS:
                            d.cuMemRelease(handle)  # not mapped: only the handle to give back
                            self._check("cuMemMap", err)
                        made.append((addr, handle))
                    (err,) = d.cuMemSetAccess(ptr, nbytes, [self._access], 1)
                    self._check("cuMemSetAccess", err)
                except BaseException:
                    self._undo(made)
                    raise
            for addr, handle in made:
                self._handles[addr] = handle

    def unmap(self, ptr: int, nbytes: int) -> None:
        d = self._driver
        with self._lock:
            gran = self._granule()
            granules = self._granules("unmap", ptr, nbytes, gran)
            missing = [a for a in granules if a not in self._handles]
            if missing:
                raise ValueError(f"unmap({ptr:#x}, {nbytes}): {len(missing)} granule(s) in it "
                                 f"are not mapped, the first at {missing[0]:#x}")
            with self._current():
                # cuMemUnmap does not wait for work in flight: kernels queued on any stream may
                # still read these pages (cudaFree waits; this must too)
                self._synchronize()
                for addr in granules:
                    (err,) = d.cuMemUnmap(addr, gran)
                    self._check("cuMemUnmap", err)
                    (err,) = d.cuMemRelease(self._handles.pop(addr))
                    self._check("cuMemRelease", err)

    # -- bookkeeping, for tests and the self-check -------------------------------------------

    def mapped_bytes(self) -> int:
        with self._lock:
            return len(self._handles) * self._granularity

    def reserved_ranges(self) -> dict[int, int]:
        with self._lock:
            return dict(self._reserved)

    # -- helpers -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """This device current in this thread, with a current context."""
        d = self._driver
        with self._activate():
            err, ctx = d.cuCtxGetCurrent()
            self._check("cuCtxGetCurrent", err)
            if not int(ctx):
                self._init_context()
                err, ctx = d.cuCtxGetCurrent()
                self._check("cuCtxGetCurrent", err)
                if not int(ctx):
                    raise RuntimeError(f"jupyter_gpumem: no CUDA context is current for device "
                                       f"{self.index}, even after the runtime initialised it")
            yield

    def _granule(self) -> int:
        """The granularity (computed once, under the lock), with the structs the calls need."""
        if self._granularity:
            return self._granularity
        d = self._driver
        (err,) = d.cuInit(0)  # done already by CuPy's runtime in this process; harmless again
        self._check("cuInit", err)
        with self._current():
            err, dev = d.cuDeviceGet(self.index)
            self._check("cuDeviceGet", err)
            err, supported = d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED, dev)
            self._check("cuDeviceGetAttribute", err)
            if not supported:
                raise RuntimeError(f"jupyter_gpumem: device {self.index} does not support the "
                                   "CUDA virtual memory management that expandable_segments needs")
            prop = d.CUmemAllocationProp()
            prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = self.index
            access = d.CUmemAccessDesc()
            access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = self.index
            access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            err, gran = d.cuMemGetAllocationGranularity(
                prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            self._check("cuMemGetAllocationGranularity", err)
        if int(gran) <= 0:
            raise RuntimeError(f"cuMemGetAllocationGranularity gave {int(gran)} on device "
                               f"{self.index}")
        self._prop, self._access = prop, access
        self._granularity = int(gran)
        return self._granularity

    def _granules(self, call: str, ptr: int, nbytes: int, gran: int) -> list[int]:
        """The granule addresses of [ptr, ptr+nbytes); ValueError unless aligned and reserved."""
        _positive_size(call, nbytes)
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError(f"{call}: ptr must be an int, got {type(ptr).__name__}")
        if ptr % gran or nbytes % gran:
            raise ValueError(f"{call}({ptr:#x}, {nbytes}): address and size must be multiples "
                             f"of the granularity, {gran} B")
        if not any(s <= ptr and ptr + nbytes <= s + n for s, n in self._reserved.items()):
            raise ValueError(f"{call}({ptr:#x}, {nbytes}): not inside one reserved range")
        return list(range(ptr, ptr + nbytes, gran))

    def _undo(self, made: list[tuple[int, Any]]) -> None:
        """Unmap and release what a failed ``map`` made, newest first; the first failure wins."""
        d = self._driver
        failures: list[str] = []
        for addr, handle in reversed(made):
            (err,) = d.cuMemUnmap(addr, self._granularity)
            if err != d.CUresult.CUDA_SUCCESS:
                failures.append(f"cuMemUnmap at {addr:#x}: {_error_name(d, err)}")
            (err,) = d.cuMemRelease(handle)
            if err != d.CUresult.CUDA_SUCCESS:
                failures.append(f"cuMemRelease at {addr:#x}: {_error_name(d, err)}")
        if failures:
            raise RuntimeError("jupyter_gpumem: undoing a failed map failed too: "
                               + "; ".join(failures))

    def _check(self, call: str, err: Any) -> None:
        d = self._driver
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{call} failed on device {self.index}: {_error_name(d, err)}")


def _positive_size(call: str, nbytes: int) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"{call}: nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes <= 0:
        raise ValueError(f"{call}: nbytes must be positive, got {nbytes}")
    return nbytes


def _is_oom(driver: Any, err: Any) -> bool:
    return bool(err == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY)


def _error_name(driver: Any, err: Any) -> str:
    """``CUDA_ERROR_OUT_OF_MEMORY`` and the like, however the binding spells its enums."""
    name = getattr(err, "name", None)
    if isinstance(name, str) and name:
        return name
    try:
        status, text = driver.cuGetErrorName(err)
        if status == driver.CUresult.CUDA_SUCCESS and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        pass
    return f"CUresult {int(err)}"
