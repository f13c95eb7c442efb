"""What a CuPy array looks like to the holder search (``.data.ptr`` and ``.nbytes``), with no
GPU: for the holder tests and the ledger bench."""

from __future__ import annotations


class _Memory:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class Array:
    """``.data.ptr`` and ``.nbytes``, like a CuPy array (a view when ``ptr`` is inside a block)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self._memory = _Memory(ptr)
        self.nbytes = nbytes

    @property
    def data(self) -> _Memory:
        return self._memory
