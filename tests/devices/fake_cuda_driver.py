"""A stand-in for ``cuda.bindings.driver``: the VMM calls CudaVirtualMemory makes, with no GPU.

Each call returns a tuple whose first item is a CUresult, as the binding's do, and is recorded in
``calls`` as ``(name, args...)``. It enforces the driver's rules that matter here: cuMemCreate
sizes are granule multiples, cuMemMap needs a reserved and unmapped range, cuMemUnmap must cover
whole mappings, cuMemSetAccess needs a fully mapped range, cuMemAddressFree needs nothing mapped.
Physical memory has a capacity in pages, and ``oom_after(n)`` makes cuMemCreate fail with
CUDA_ERROR_OUT_OF_MEMORY once n more pages were created.
"""

from __future__ import annotations

import enum
from typing import Any

MiB = 1 << 20


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED = 102


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_INVALID = 0
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_INVALID = 0
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAccess_flags(enum.IntEnum):
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationGranularity_flags(enum.IntEnum):
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1


class CUdeviceptr:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class CUcontext(CUdeviceptr):
    pass


class CUmemGenericAllocationHandle(CUdeviceptr):
    pass


class CUmemLocation:
    def __init__(self) -> None:
        self.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_INVALID
        self.id = 0


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
        self.location = CUmemLocation()
        self.requestedHandleTypes = 0


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.location = CUmemLocation()
        self.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE


class FakeDriver:
    """The module object: install it as ``sys.modules["cuda.bindings.driver"]``."""

    CUresult = CUresult
    CUdevice_attribute = CUdevice_attribute
    CUmemAllocationType = CUmemAllocationType
    CUmemLocationType = CUmemLocationType
    CUmemAccess_flags = CUmemAccess_flags
    CUmemAllocationGranularity_flags = CUmemAllocationGranularity_flags
    CUdeviceptr = CUdeviceptr
    CUmemAllocationProp = CUmemAllocationProp
    CUmemAccessDesc = CUmemAccessDesc

    def __init__(self, *, granularity: int = 2 * MiB, pages: int = 64, context: int = 0xC0,
                 vmm_supported: bool = True) -> None:
        self.granularity = granularity
        self.pages = pages  # physical capacity, in granules
        self.context = context  # what cuCtxGetCurrent reports (0: none current)
        self.vmm_supported = vmm_supported
        self.calls: list[tuple[Any, ...]] = []
        self.reserved: dict[int, int] = {}  # start -> size
        self.handles: dict[int, int] = {}  # live handle -> size
        self.mappings: dict[int, tuple[int, int]] = {}  # start -> (size, handle)
        self.access: dict[int, tuple[int, int]] = {}  # mapping start -> (device, flags)
        self._next_va = 0x7000_0000_0000
        self._next_handle = 1
        self._oom_after: int | None = None
        self._fail: dict[str, CUresult] = {}

    # -- controls ----------------------------------------------------------------------------

    def oom_after(self, pages: int | None) -> None:
        """cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY once ``pages`` more were made."""
        self._oom_after = pages

    def fail(self, name: str, code: CUresult = CUresult.CUDA_ERROR_INVALID_VALUE) -> None:
        """The next call of ``name`` fails with ``code``."""
        self._fail[name] = code

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def physical_bytes(self) -> int:
        return sum(self.handles.values())

    def _enter(self, name: str, *args: Any) -> CUresult | None:
        self.calls.append((name, *args))
        return self._fail.pop(name, None)

    # -- the binding's calls -----------------------------------------------------------------

    def cuGetErrorName(self, err: Any) -> tuple[CUresult, bytes]:
        return CUresult.CUDA_SUCCESS, CUresult(int(err)).name.encode()

    def cuInit(self, flags: int) -> tuple[CUresult]:
        failed = self._enter("cuInit", flags)
        return ((failed or CUresult.CUDA_SUCCESS),)

    def cuCtxGetCurrent(self) -> tuple[CUresult, CUcontext]:
        failed = self._enter("cuCtxGetCurrent")
        return (failed or CUresult.CUDA_SUCCESS), CUcontext(self.context)

    def cuDeviceGet(self, ordinal: int) -> tuple[CUresult, int]:
        failed = self._enter("cuDeviceGet", ordinal)
        return (failed or CUresult.CUDA_SUCCESS), ordinal

    def cuDeviceGetAttribute(self, attrib: Any, dev: int) -> tuple[CUresult, int]:
        failed = self._enter("cuDeviceGetAttribute", attrib, dev)
        assert attrib is CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED
        return (failed or CUresult.CUDA_SUCCESS), int(self.vmm_supported)

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple[CUresult, int]:
        failed = self._enter("cuMemGetAllocationGranularity", prop.location.id, option)
        if failed:
            return failed, 0
        ok = (isinstance(prop, CUmemAllocationProp)
              and prop.type is CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
              and prop.location.type is CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
              and option is CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return (CUresult.CUDA_SUCCESS, self.granularity) if ok else (
            CUresult.CUDA_ERROR_INVALID_VALUE, 0)

    def cuMemAddressReserve(self, size: int, alignment: int, addr: Any,
                            flags: int) -> tuple[CUresult, CUdeviceptr]:
        failed = self._enter("cuMemAddressReserve", size, alignment, int(addr), flags)
        if failed:
            return failed, CUdeviceptr(0)
        if size <= 0 or size % self.granularity:
            return CUresult.CUDA_ERROR_INVALID_VALUE, CUdeviceptr(0)
        start = self._next_va
        self._next_va += size + 64 * self.granularity  # a gap: ranges never touch
        self.reserved[start] = size
        return CUresult.CUDA_SUCCESS, CUdeviceptr(start)

    def cuMemAddressFree(self, ptr: Any, size: int) -> tuple[CUresult]:
        ptr = int(ptr)
        failed = self._enter("cuMemAddressFree", ptr, size)
        if failed:
            return (failed,)
        if self.reserved.get(ptr) != size or any(ptr <= m < ptr + size for m in self.mappings):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        del self.reserved[ptr]
        return (CUresult.CUDA_SUCCESS,)

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[CUresult, int]:
        failed = self._enter("cuMemCreate", size, prop.location.id, flags)
        if failed:
            return failed, 0
        if (size % self.granularity or size <= 0 or flags
                or prop.type is not CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
                or prop.location.type is not CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE):
            return CUresult.CUDA_ERROR_INVALID_VALUE, 0
        pages = size // self.granularity
        full = self.physical_bytes() // self.granularity + pages > self.pages
        if full or (self._oom_after is not None and self._oom_after < pages):
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0
        if self._oom_after is not None:
            self._oom_after -= pages
        handle = self._next_handle
        self._next_handle += 1
        self.handles[handle] = size
        return CUresult.CUDA_SUCCESS, CUmemGenericAllocationHandle(handle)  # type: ignore[return-value]

    def cuMemRelease(self, handle: Any) -> tuple[CUresult]:
        handle = int(handle)
        failed = self._enter("cuMemRelease", handle)
        if failed:
            return (failed,)
        if handle not in self.handles or any(h == handle for _, h in self.mappings.values()):
            # the real driver keeps a mapped handle's memory until unmap; this class insists on
            # unmap first, the order CudaVirtualMemory uses
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        del self.handles[handle]
        return (CUresult.CUDA_SUCCESS,)

    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: Any,
                 flags: int) -> tuple[CUresult]:
        ptr, handle = int(ptr), int(handle)
        failed = self._enter("cuMemMap", ptr, size, offset, handle, flags)
        if failed:
            return (failed,)
        inside = any(s <= ptr and ptr + size <= s + n for s, n in self.reserved.items())
        overlaps = any(m < ptr + size and ptr < m + n for m, (n, _) in self.mappings.items())
        if (not inside or overlaps or offset or flags or self.handles.get(handle) != size
                or ptr % self.granularity):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.mappings[ptr] = (size, handle)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemSetAccess(self, ptr: Any, size: int, desc: Any, count: int) -> tuple[CUresult]:
        ptr = int(ptr)
        failed = self._enter("cuMemSetAccess", ptr, size, count)
        if failed:
            return (failed,)
        if count != len(desc) or not all(isinstance(x, CUmemAccessDesc) for x in desc):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        covered = [m for m in self.mappings if ptr <= m < ptr + size]
        if sum(self.mappings[m][0] for m in covered) != size:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)  # not fully mapped, or cuts a mapping
        for m in covered:
            self.access[m] = (desc[0].location.id, int(desc[0].flags))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemUnmap(self, ptr: Any, size: int) -> tuple[CUresult]:
        ptr = int(ptr)
        failed = self._enter("cuMemUnmap", ptr, size)
        if failed:
            return (failed,)
        covered = [m for m in self.mappings if ptr <= m < ptr + size]
        cut = any(m < ptr < m + n or m < ptr + size < m + n
                  for m, (n, _) in self.mappings.items())
        if not covered or cut or sum(self.mappings[m][0] for m in covered) != size:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        for m in covered:
            del self.mappings[m]
            self.access.pop(m, None)
        return (CUresult.CUDA_SUCCESS,)
