"""CuPy used on the simulated device: one line instead of CuPy's 40-line traceback.

On the simulated device (``%gpumem device sim``) there may be no GPU at all; a CuPy array then
fails deep inside CuPy with ``CUDARuntimeError`` (``cudaErrorInsufficientDriver`` where no
driver is installed, ``cudaErrorNoDevice`` where it sees none). ``no_gpu_hint`` turns that error
into one line saying so and how to exercise the simulated device instead. ``%%gpumem_trace``
raises it as a ``UsageError`` (IPython prints one line); under a plain cell the extension
prints it after the traceback, which stays the user's own.
"""

from __future__ import annotations

from jupyter_gpumem.runtime import registry

__all__ = ["NO_GPU_ERRORS", "no_gpu_hint"]

#: CUDA runtime errors that mean "no usable GPU here", not a mistake in the user's code.
NO_GPU_ERRORS = frozenset({
    "cudaErrorInsufficientDriver", "cudaErrorNoDevice", "cudaErrorDevicesUnavailable",
    "cudaErrorCompatNotSupportedOnDevice", "cudaErrorSystemDriverMismatch",
})


def _is_cupy_runtime_error(exc: BaseException) -> bool:
    return any(c.__name__ == "CUDARuntimeError" and c.__module__.startswith("cupy")
               for c in type(exc).__mro__)


def no_gpu_hint(exc: BaseException | None, backend: str | None = None) -> str | None:
    """One line for CuPy's ``CUDARuntimeError`` saying there is no GPU, while ``backend``
    (default: the runtime's) is the simulated device; None for anything else."""
    if exc is None or not _is_cupy_runtime_error(exc):
        return None
    if (backend if backend is not None else registry.backend()) != "sim":
        return None
    code = str(exc).split(":", 1)[0].strip()
    if code not in NO_GPU_ERRORS:
        return None
    return (f"CuPy needs a GPU ({code}); the simulated device is in use: allocate on it with "
            "jupyter_gpumem.caching_allocator_alloc(nbytes) and free with "
            "jupyter_gpumem.caching_allocator_delete(ptr).")
