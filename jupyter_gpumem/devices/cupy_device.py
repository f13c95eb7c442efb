"""A CUDA device seen through CuPy: the only module, with ``runtime.binding``, that imports CuPy.

CuPy is imported when a CupyDevice is made, never at package import.
"""

from __future__ import annotations

import os
import time
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
