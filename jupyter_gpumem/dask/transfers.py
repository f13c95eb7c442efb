"""CuPy chunks that arrive from another worker, allocated through CuPy (so through our allocator).

Note [Transferred chunks]: over TCP, ``distributed`` sends a CuPy array as host bytes and the
receiving worker rebuilds it with ``dask_deserialize`` for ``cupy.ndarray``
(``distributed/protocol/cupy.py``). That copy goes through Numba (``numba.cuda.to_device``) or
RMM, not CuPy's allocator, so the chunks a worker receives — every operand of a matmul or a
reduction that lives elsewhere — were invisible to our stats: on two H200s a worker held 192 MiB
of chunks while our allocator counted 64 MiB. While the plugin is set up, the worker rebuilds
such arrays with ``cupy.empty`` and one host-to-device copy instead: same bytes, same result
type, one allocation of ours per chunk. Teardown puts distributed's own function back.
Arrays sent device-to-device (UCX's ``cuda_deserialize``) are not changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Deserializer = Callable[[dict[str, Any], list[Any]], Any]


def through_cupy(xp: Any) -> Deserializer:
    """A ``dask_deserialize`` for ``xp.ndarray`` (``xp`` is CuPy; tests pass a stand-in) that
    copies the host frame into an array of ``xp.empty``."""
    import numpy

    def deserialize(header: dict[str, Any], frames: list[Any]) -> Any:
        parts = [numpy.frombuffer(memoryview(f).cast("B"), numpy.uint8) for f in frames]
        host = parts[0] if len(parts) == 1 else numpy.concatenate(parts)  # one frame: no copy
        device = xp.empty(host.nbytes, dtype=numpy.uint8)
        device.set(host)
        return xp.ndarray(shape=header["shape"], dtype=header["typestr"], memptr=device.data,
                          strides=header["strides"])

    return deserialize


def route_through(xp: Any) -> Callable[[], None]:
    """Rebuild received ``xp.ndarray`` chunks with ``through_cupy(xp)``; returns the undo."""
    import importlib

    # a dask.utils.Dispatch, untyped (the package's name ``serialize`` is also a function)
    dask_deserialize: Any = importlib.import_module(
        "distributed.protocol.serialize").dask_deserialize
    try:  # distributed's own, registered lazily on first use: make it load now, or it would
        original: Deserializer | None = dask_deserialize.dispatch(xp.ndarray)  # replace ours
    except (ImportError, TypeError):  # its Numba/RMM route is missing: ours is the only one
        original = None
    ours = through_cupy(xp)
    dask_deserialize.register(xp.ndarray, ours)

    def undo() -> None:
        if original is not None and dask_deserialize.dispatch(xp.ndarray) is ours:
            dask_deserialize.register(xp.ndarray, original)

    return undo


def route_cupy_transfers() -> Callable[[], None] | None:
    """``route_through(cupy)`` where CuPy is there; None (nothing to undo) where it is not."""
    try:
        import cupy
    except ImportError:
        return None
    return route_through(cupy)
