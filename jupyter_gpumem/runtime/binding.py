"""Put our allocators under CuPy arrays, as CuPy's ``PythonFunctionAllocator`` would.

One CachingAllocator per device (``registry``). ``install`` makes it CuPy's allocator for the
whole process, ``using_allocator`` for one thread and one ``with`` block. Every CuPy memory object
keeps the free function it was made with, so an array made before ``uninstall`` still goes back
to the allocator that made it.

The allocator CuPy calls is ``_Binding.alloc(size) -> MemoryPointer``. It makes the memory object
itself, so that ``memptr.mem.size`` is the rounded block size, as with CuPy's own pool, not the
requested size that ``PythonFunctionAllocator`` stores: see Note [The size CuPy sees] in
``engine/csrc/hooks.c``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.runtime import registry

_lock = threading.Lock()
_installed: _Binding | None = None
_previous: Any = None  # CuPy's allocator before install


class _Binding:
    """The allocator CuPy calls (``alloc``), and the free function its memory objects call.

    With the C core they are ``_native.Hooks``: CuPy calls straight into C, which asks CuPy
    for the device and the current stream, runs the core and builds the MemoryPointer, with no
    Python frame in between. Otherwise Python functions do the same over the Python core.
    ``malloc_fn``/``free_fn`` are the pair a ``PythonFunctionAllocator`` would take.
    """

    def __init__(self) -> None:
        import cupy
        from cupy.cuda.device import get_device_id
        from cupy.cuda.memory import MemoryPointer, PythonFunctionAllocatorMemory

        from jupyter_gpumem.data.sizes import round_size

        # CuPy's get_current_stream_ptr skips making a Stream object; older CuPys lack it.
        stream_ptr = getattr(cupy.cuda.stream, "get_current_stream_ptr", None)
        get_stream = stream_ptr or cupy.cuda.get_current_stream
        if _use_c_hooks():
            from jupyter_gpumem.engine import _native

            Hooks = _native.Hooks

            cores: list[Any] = []

            def missing(device_id: int) -> Any:
                with registry.locked():
                    allocator = registry.cuda_allocator(device_id)
                    if not allocator.native:
                        raise TypeError(f"device {device_id}'s allocator has no C core")
                    cores.extend([None] * (device_id + 1 - len(cores)))
                    cores[device_id] = core = allocator.native_core
                    return core

            hooks = Hooks(cores, get_stream, missing, get_device=get_device_id,
                          memory=PythonFunctionAllocatorMemory, pointer=MemoryPointer)
            self.malloc_fn: Callable[[int, int], int] = hooks.malloc
            self.free_fn: Callable[[int, int], None] = hooks.free
            self.alloc: Callable[[int], Any] = hooks.alloc
        else:
            table: dict[int, Any] = {}  # device index -> CachingAllocator, filled on first use

            def allocator_for(device_id: int) -> Any:
                a = table.get(device_id)
                if a is None:
                    with registry.locked():
                        a = table[device_id] = registry.cuda_allocator(device_id)
                return a

            def current_stream() -> int:
                return int(stream_ptr()) if stream_ptr else int(get_stream().ptr)

            def malloc(size: int, device_id: int) -> int:
                a = table.get(device_id) or allocator_for(device_id)
                return int(a.malloc(size, current_stream()))

            def free(ptr: int, device_id: int) -> None:
                table[device_id].free(ptr)

            def alloc(size: int) -> Any:
                # As Hooks.alloc: a memory object of size 0 (it calls no malloc), then our
                # block's address and rounded size. The Python core reads its divisions before
                # its lock too; this reads them just before it (the C path rounds under the lock).
                device_id = get_device_id()
                mem = PythonFunctionAllocatorMemory(0, None, free, device_id)
                if size:
                    a = table.get(device_id) or allocator_for(device_id)
                    divisions = a.config.roundup_power2_divisions or 0
                    mem.ptr = a.malloc(size, current_stream())
                    mem.size = round_size(size, divisions)
                return MemoryPointer(mem, 0)

            self.malloc_fn = malloc
            self.free_fn = free
            self.alloc = alloc


def _use_c_hooks() -> bool:
    import os

    from jupyter_gpumem.engine.allocator import CORE_ENV, native_core_available

    return native_core_available() and os.environ.get(CORE_ENV, "auto").lower() != "python"


def _binding() -> _Binding:
    global _shared
    if _shared is None:
        _shared = _Binding()
    return _shared


_shared: _Binding | None = None


def install(config: AllocatorConfig | None = None) -> None:
    """Make our caching allocator CuPy's allocator for every thread (a no-op when it already is).

    ``config`` (if given) is applied to every CUDA allocator, made now or later.
    """
    from jupyter_gpumem.devices.cupy_device import require_cuda

    global _installed, _previous
    if config is not None and not isinstance(config, AllocatorConfig):
        raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
    require_cuda()
    import cupy

    with _lock:
        if config is not None:
            registry.set_default_config(config)
            for allocator in registry.cuda_allocators().values():
                allocator.set_config(config)
        if _installed is not None:
            return
        binding = _binding()
        _previous = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(binding.alloc)
        _installed = binding


def uninstall() -> None:
    """Give CuPy back the allocator it had before ``install``. Live arrays stay valid."""
    global _installed, _previous
    with _lock:
        if _installed is None:
            return
        import cupy

        current = cupy.cuda.get_allocator()
        if _is_ours(current):
            cupy.cuda.set_allocator(_previous)
        _installed = None
        _previous = None


def installed() -> bool:
    return _installed is not None


def _is_ours(allocator: Any) -> bool:
    return _shared is not None and allocator is _shared.alloc


@contextlib.contextmanager
def using_allocator() -> Iterator[None]:
    """Use our caching allocator for CuPy in this thread, inside the ``with`` block only."""
    from jupyter_gpumem.devices.cupy_device import require_cuda

    require_cuda()
    import cupy

    with cupy.cuda.using_allocator(_binding().alloc):
        yield


def current_backend_name() -> str:
    """What allocates CuPy's memory in this thread now: see ``get_allocator_backend``."""
    try:
        import cupy
    except ImportError:
        return "none"
    current = cupy.cuda.get_allocator()
    if _is_ours(current):
        return "jupyter_gpumem"
    owner = getattr(current, "__self__", None)
    if owner is not None and type(owner).__name__ == "CFunctionAllocator":
        return "pluggable"
    if owner is not None and type(owner).__name__ == "PythonFunctionAllocator":
        return "pluggable"
    if current is None:
        return "cudaMalloc"
    return "cupy"
