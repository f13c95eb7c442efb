"""Which allocators the module-level API and the magics talk to: CUDA's or a simulated device's.

There is one CachingAllocator per device. On the "cuda" backend they sit on CupyDevices and are
made when first asked for; on the "sim" backend they sit on SimulatedDevices, so the whole
product can be tried with no GPU. Switching backends keeps both sets alive: blocks handed out
by one still go back to it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from jupyter_gpumem.data.sizes import GiB
from jupyter_gpumem.devices.simulated import SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.config import AllocatorConfig

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot, TraceEntry

Backend = Literal["cuda", "sim"]

_lock = threading.RLock()
_backend: Backend = "cuda"
_cuda: dict[int, CachingAllocator] = {}
_sim: dict[int, CachingAllocator] = {}
_default_config: AllocatorConfig | None = None
#: Called with the new backend after every switch (the extension refreshes its views).
_listeners: list[Callable[[Backend], None]] = []
_no_gpu_reason: list[str | None] = []  # asked once: [reason] after the first question


def backend() -> Backend:
    return _backend


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold the registry's (reentrant) lock: no allocator is made or switched meanwhile."""
    with _lock:
        yield


def no_gpu_reason() -> str | None:
    """Why CuPy sees no CUDA device here, in one line; None when it sees one. Asked once a
    process (a driver does not appear while the process runs)."""
    if not _no_gpu_reason:
        from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason

        _no_gpu_reason.append(cuda_unavailable_reason())
    return _no_gpu_reason[0]


def no_gpu() -> bool:
    """True on the CUDA backend of a machine where CuPy sees no device."""
    return _backend == "cuda" and no_gpu_reason() is not None


def current_allocator() -> CachingAllocator | None:
    """The allocator of the current device on the current backend, for a notebook's views and
    hooks; None when there is none (the CUDA backend with no GPU, or a CUDA error making it)."""
    if no_gpu():
        return None
    try:
        return get_allocator(None)
    except Exception:  # a CUDA error while making the allocator: nothing to show or record
        return None


def default_config() -> AllocatorConfig:
    """The config new allocators start with: JUPYTER_GPUMEM_ALLOC_CONF, read once."""
    global _default_config
    with _lock:
        if _default_config is None:
            _default_config = AllocatorConfig.from_env()
        return _default_config


def set_default_config(config: AllocatorConfig) -> None:
    global _default_config
    with _lock:
        _default_config = config


def use_simulated_device(capacity: int = 80 * GiB, *, devices: int = 1,
                         config: AllocatorConfig | None = None,
                         fresh: bool = False) -> list[CachingAllocator]:
    """Point the module-level API and ``%gpumem`` at simulated devices.

    The first call makes ``devices`` simulated devices of ``capacity`` bytes; later calls reuse
    them unless ``fresh`` is true (blocks of the old ones must have been freed by then).
    """
    global _backend
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"capacity must be a positive int of bytes, got {capacity!r}")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive int, got {devices!r}")
    with _lock:
        if fresh or not _sim:
            busy = [i for i, a in _sim.items() if a.memory_allocated()]
            if busy:
                raise ValueError(
                    f"simulated device(s) {busy} still hold live blocks; free them first"
                )
            _sim.clear()
            for i in range(devices):
                device = SimulatedDevice(capacity, index=i, name=f"Simulated GPU {i}")
                _sim[i] = CachingAllocator(device, config or default_config())
        _backend = "sim"
        allocators = [_sim[i] for i in sorted(_sim)]
    _notify()
    return allocators


def use_cuda() -> None:
    """Point the module-level API and ``%gpumem`` back at the CUDA devices."""
    global _backend
    with _lock:
        _backend = "cuda"
    _notify()


def on_switch(listener: Callable[[Backend], None]) -> Callable[[], None]:
    """Call ``listener`` after every backend switch; returns a function that unsubscribes."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener) if listener in _listeners else None


def _notify() -> None:
    for listener in list(_listeners):
        listener(_backend)


def device_index(device: Any = None) -> int:
    """Resolve ``None | int | "cuda:N" | cupy.cuda.Device`` to a device index of the backend."""
    if device is None:
        if _backend == "sim":
            return 0
        from jupyter_gpumem.devices.cupy_device import require_cuda

        require_cuda()
        import cupy

        return int(cupy.cuda.runtime.getDevice())
    if isinstance(device, bool):
        raise TypeError("device must be None, an int, 'cuda:N' or a cupy.cuda.Device, not bool")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        head, _, tail = device.partition(":")
        if head != "cuda" or (tail and not tail.isdigit()):
            raise ValueError(f"expected 'cuda' or 'cuda:N', got {device!r}")
        index = int(tail) if tail else device_index(None)
    elif hasattr(device, "id") and isinstance(device.id, int):  # cupy.cuda.Device
        index = device.id
    else:
        raise TypeError(
            "device must be None, an int, 'cuda:N' or a cupy.cuda.Device, "
            f"not {type(device).__name__}"
        )
    if index < 0:
        raise ValueError(f"device index must be >= 0, got {index}")
    return index


def get_allocator(device: Any = None) -> CachingAllocator:
    """The allocator of ``device`` on the current backend, made if needed."""
    index = device_index(device)
    with _lock:
        if _backend == "sim":
            if index not in _sim:
                raise ValueError(f"no simulated device {index} (there are {len(_sim)})")
            return _sim[index]
        return cuda_allocator(index)


def cuda_allocator(index: int) -> CachingAllocator:
    """The allocator of CUDA device ``index``, made when first asked for (whatever the backend:
    the CuPy binding always allocates on the CUDA devices)."""
    with _lock:
        allocator = _cuda.get(index)
        if allocator is None:
            allocator = _cuda[index] = _make_cuda_allocator(index)
        return allocator


def _make_cuda_allocator(index: int) -> CachingAllocator:
    from jupyter_gpumem.devices.cupy_device import CupyDevice, cupy_oom_error, require_cuda

    require_cuda()
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if index >= count:
        raise ValueError(f"device {index} does not exist; {count} CUDA device(s) are visible")
    return CachingAllocator(CupyDevice(index), default_config(), oom_error=cupy_oom_error())


def allocators() -> dict[int, CachingAllocator]:
    """The allocators made so far on the current backend, by device index."""
    with _lock:
        return dict(_sim if _backend == "sim" else _cuda)


def cuda_allocators() -> dict[int, CachingAllocator]:
    """The allocators made so far on the CUDA devices, by device index."""
    with _lock:
        return dict(_cuda)


def snapshot_of(allocators: Mapping[int, CachingAllocator], *, mark: bool = True) -> Snapshot:
    """One snapshot of several devices' allocators (by device index): each one's own snapshot
    when there is one, else their segments together, each device's trace at its index, and
    each one's extension keys under ``jupyter_gpumem["devices"][str(index)]``. ``mark`` as
    ``CachingAllocator.snapshot``."""
    from jupyter_gpumem.data.schema import SCHEMA_VERSION

    if len(allocators) == 1:
        return next(iter(allocators.values())).snapshot(mark=mark)
    segments: list[Any] = []
    traces: list[Sequence[TraceEntry]] = [[] for _ in range(max(allocators, default=-1) + 1)]
    extra: dict[str, Any] = {}
    for index in sorted(allocators):
        one = allocators[index].snapshot(mark=mark)
        segments.extend(one["segments"])
        traces[index] = one["device_traces"][index]
        extra[str(index)] = one.get("jupyter_gpumem", {})
    return {"segments": segments, "device_traces": traces, "schema": SCHEMA_VERSION,
            "jupyter_gpumem": {"devices": extra}}


def simulated_allocators() -> dict[int, CachingAllocator]:
    """The allocators of the simulated devices made so far (on either backend), by index."""
    with _lock:
        return dict(_sim)
