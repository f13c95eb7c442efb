"""NVML: which processes use a GPU, and how much memory the device has in use.

pynvml and the driver may be missing; every function here then raises ``NvmlUnavailable`` with
one line that says why, never a traceback.
"""

from __future__ import annotations

import threading
from typing import Any

from jupyter_gpumem.data.sizes import MiB

_lock = threading.Lock()
_initialised: bool | str = False  # True, or the one-line reason NVML cannot be used


class NvmlUnavailable(RuntimeError):
    """NVML cannot answer here; the message is one line."""


def _nvml() -> Any:
    global _initialised
    with _lock:
        if isinstance(_initialised, str):
            raise NvmlUnavailable(_initialised)
        try:
            import pynvml
        except ImportError:
            _initialised = "pynvml is not installed (pip install nvidia-ml-py)"
            raise NvmlUnavailable(_initialised) from None
        if not _initialised:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                _initialised = f"NVML is unavailable: {_reason(exc)}"
                raise NvmlUnavailable(_initialised) from None
            _initialised = True
        return pynvml


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "LibraryNotFound" in type(exc).__name__ or "not found" in text.lower():
        return "the NVIDIA driver library was not found (no GPU driver on this machine?)"
    if "DriverNotLoaded" in type(exc).__name__:
        return "the NVIDIA driver is not loaded"
    return text


def _handle(pynvml: Any, pci_bus_id: str | None, index: int) -> Any:
    try:
        if pci_bus_id:
            return pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML has no device {pci_bus_id or index}: {_reason(exc)}") from None


def _ask(index: int, pci_bus_id: str | None, function: str, what: str) -> tuple[Any, Any]:
    """pynvml, and ``pynvml.<function>(handle)`` of the device; an NVML error becomes
    ``NvmlUnavailable("NVML cannot <what>: ...")``."""
    pynvml = _nvml()
    handle = _handle(pynvml, pci_bus_id, index)
    try:
        return pynvml, getattr(pynvml, function)(handle)
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot {what}: {_reason(exc)}") from None


def processes(index: int, pci_bus_id: str | None = None) -> list[tuple[int, str, int]]:
    """``(pid, name, bytes)`` of the compute processes on a device, largest first."""
    pynvml, procs = _ask(index, pci_bus_id, "nvmlDeviceGetComputeRunningProcesses",
                         "list processes")
    out = []
    for p in procs:
        try:
            name = pynvml.nvmlSystemGetProcessName(p.pid)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except pynvml.NVMLError:
            name = "?"
        used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
        out.append((int(p.pid), name.rsplit("/", 1)[-1], used))
    return sorted(out, key=lambda row: -row[2])


def memory_info(index: int, pci_bus_id: str | None = None) -> tuple[int, int, int]:
    """``(free, total, used)`` bytes of a device as NVML reports them."""
    _, info = _ask(index, pci_bus_id, "nvmlDeviceGetMemoryInfo", "read memory info")
    return int(info.free), int(info.total), int(info.used)


def format_processes(index: int, rows: list[tuple[int, str, int]]) -> str:
    """PyTorch's ``list_gpu_processes`` text."""
    lines = [f"GPU:{index}"]
    if not rows:
        lines.append("no processes are running")
    for pid, _name, used in rows:
        lines.append(f"process {pid:>10d} uses {used / MiB:>12.3f} MB GPU memory")
    return "\n".join(lines)
