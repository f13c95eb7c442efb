"""Received CuPy chunks are rebuilt through CuPy's allocator (Note [Transferred chunks]): the
deserializer, on a stand-in for CuPy backed by numpy; on a GPU, tests/gpu/test_dask_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed.protocol.serialize import dask_deserialize

from jupyter_gpumem.dask.transfers import route_through, through_cupy


class _Buffer:
    """What ``xp.empty`` gives: ``set`` copies host bytes in, ``data`` points at them."""

    made: ClassVar[list[int]] = []

    def __init__(self, nbytes: int) -> None:
        self.data = np.zeros(nbytes, np.uint8)
        _Buffer.made.append(nbytes)

    def set(self, host: np.ndarray) -> None:
        self.data[:] = host


class _Array:
    def __init__(self, shape: tuple[int, ...], dtype: str, memptr: np.ndarray,
                 strides: tuple[int, ...]) -> None:
        self.value = np.lib.stride_tricks.as_strided(memptr.view(dtype), shape, strides)


def _xp(array_type: type) -> Any:
    return SimpleNamespace(ndarray=array_type,
                           empty=lambda n, dtype: _Buffer(n))


def _header(a: np.ndarray) -> dict[str, Any]:
    return {"shape": a.shape, "typestr": a.dtype.str, "strides": a.strides}


def test_a_received_chunk_is_one_allocation_of_the_array_library_with_the_same_values() -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    _Buffer.made.clear()
    got = through_cupy(_xp(_Array))(_header(a), [memoryview(a.tobytes())])
    assert _Buffer.made == [a.nbytes]
    np.testing.assert_array_equal(got.value, a)
    # split frames (as a large message may come) are joined first
    raw = a.tobytes()
    got = through_cupy(_xp(_Array))(_header(a), [raw[:40], bytearray(raw[40:])])
    np.testing.assert_array_equal(got.value, a)


def test_routing_replaces_distributeds_function_and_undo_puts_it_back() -> None:
    class Chunk(_Array):
        pass

    def theirs(header: dict[str, Any], frames: list[Any]) -> str:
        return "theirs"

    dask_deserialize.register(Chunk, theirs)
    undo = route_through(_xp(Chunk))
    a = np.ones(5, np.int32)
    assert isinstance(dask_deserialize.dispatch(Chunk)(_header(a), [a.tobytes()]), Chunk)
    undo()
    assert dask_deserialize.dispatch(Chunk) is theirs


def test_with_no_function_of_distributeds_ours_is_the_only_one() -> None:
    class Lone(_Array):
        pass

    undo = route_through(_xp(Lone))
    a = np.ones(3, np.int8)
    assert isinstance(dask_deserialize.dispatch(Lone)(_header(a), [a.tobytes()]), Lone)
    undo()  # nothing to put back: ours stays, and still works
    assert isinstance(dask_deserialize.dispatch(Lone)(_header(a), [a.tobytes()]), Lone)
