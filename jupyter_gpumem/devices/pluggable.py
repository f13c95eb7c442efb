"""C allocators from a shared library, as ``torch.cuda.memory.CUDAPluggableAllocator`` loads them.

Two calling conventions are accepted:

- ``"cupy"`` (fast, no Python on the hot path): ``void* alloc(intptr_t param, size_t size)`` and
  ``void free(intptr_t param, void* ptr)``, handed to ``cupy.cuda.memory.CFunctionAllocator``;
- ``"torch"`` (PyTorch's): ``void* alloc(ssize_t size, int device, cudaStream_t stream)`` and
  ``void free(void* ptr, ssize_t size, int device, cudaStream_t stream)``, called through ctypes,
  so a library written for PyTorch works unchanged.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Literal

Signature = Literal["torch", "cupy"]


class PluggableAllocator:
    """An allocator in a ``.so`` file; make it CuPy's with ``change_current_allocator``."""

    def __init__(self, path_to_so_file: str | os.PathLike[str], alloc_fn_name: str,
                 free_fn_name: str, *, signature: Signature = "torch") -> None:
        if signature not in ("torch", "cupy"):
            raise ValueError(f"signature must be 'torch' or 'cupy', got {signature!r}")
        path = os.fspath(path_to_so_file)
        if not os.path.exists(path):
            raise ValueError(f"no shared library at {path!r}")
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise ValueError(f"cannot load {path!r}: {exc}") from None
        alloc = _symbol(lib, alloc_fn_name, path)
        free = _symbol(lib, free_fn_name, path)
        self.path = path
        self.signature = signature
        self._lib = lib
        from cupy.cuda import memory

        if signature == "cupy":
            alloc_addr = ctypes.cast(alloc, ctypes.c_void_p).value or 0
            free_addr = ctypes.cast(free, ctypes.c_void_p).value or 0
            self._allocator: Any = memory.CFunctionAllocator(0, alloc_addr, free_addr, lib)
        else:
            self._allocator = memory.PythonFunctionAllocator(*_torch_style(alloc, free))

    @property
    def malloc(self) -> Any:
        """The callable CuPy's ``set_allocator`` takes."""
        return self._allocator.malloc

    def allocator(self) -> Any:
        """The underlying CuPy allocator object."""
        return self._allocator

    def __repr__(self) -> str:
        return f"PluggableAllocator({self.path!r}, signature={self.signature!r})"


def _symbol(lib: ctypes.CDLL, name: str, path: str) -> Any:
    if not isinstance(name, str) or not name:
        raise TypeError(f"function names must be non-empty strings, got {name!r}")
    try:
        return getattr(lib, name)
    except AttributeError:
        raise ValueError(f"{path!r} has no function {name!r}") from None


def _torch_style(alloc: Any, free: Any) -> tuple[Any, Any]:
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    import cupy

    sizes: dict[int, tuple[int, int]] = {}  # ptr -> (size, stream): PyTorch's free wants both
    lock = threading.Lock()

    def malloc(size: int, device_id: int) -> int:
        stream = cupy.cuda.get_current_stream().ptr
        ptr = alloc(size, device_id, stream) or 0
        if size and not ptr:
            from cupy.cuda.memory import OutOfMemoryError

            raise OutOfMemoryError(size, 0)
        with lock:
            sizes[ptr] = (size, stream)
        return int(ptr)

    def release(ptr: int, device_id: int) -> None:
        with lock:
            size, stream = sizes.pop(ptr, (0, 0))
        free(ptr, size, device_id, stream)

    return malloc, release
