"""``Owner``: how the holder search knows that an object's memory lies in a GPU block.

Each memory source names the array types of its library (``MemorySource.owners``): a CuPy
array, a PyTorch tensor, a JAX array. The search (``data.reach``) asks an object's type once
whether it ``matches``, then each object of it for its ``memory``. Plain data and functions:
no library is imported here (every type is recognised by its surface).

The search knows the built-in owners (``BUILT_IN``) from the start; a source's own reach it
through ``register`` (``sources.registry`` registers the owners of every source it makes, so a
third party's array type is found with no change to the search). ``search_owners()`` gives
them in the order the search asks them: Note [The order owners are asked in].
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BUILT_IN", "CUPY_ARRAY", "CUPY_POINTER", "TORCH_TENSOR", "Owner", "generation",
           "register", "registered", "search_owners"]


@dataclass(frozen=True)
class Owner:
    """How the holder search knows the arrays of a library: ``matches(type)`` says whether
    objects of a type may own device memory, ``memory(obj)`` gives ``(address, nbytes)`` of the
    memory one owns (None when it owns none; an exception counts as none). ``name`` is the type
    in words ("JAX array")."""

    name: str
    matches: Callable[[type], bool]
    memory: Callable[[Any], tuple[int, int] | None]


# -- the built-in owners ------------------------------------------------------------------------

def _tensor_type(t: type) -> bool:  # ``untyped_storage()``: a PyTorch tensor or parameter
    return getattr(t, "untyped_storage", None) is not None


def _tensor_memory(obj: Any) -> tuple[int, int] | None:
    storage = obj.untyped_storage()
    return int(storage.data_ptr()), int(storage.nbytes())


def _pointer_type(t: type) -> bool:  # ``.ptr`` and ``.mem``: a CuPy MemoryPointer
    return getattr(t, "ptr", None) is not None and getattr(t, "mem", None) is not None


def _pointer_memory(obj: Any) -> tuple[int, int] | None:
    return int(obj.ptr), 1  # where it points


def _array_type(t: type) -> bool:  # ``.data`` (a MemoryPointer) and ``.nbytes``: a CuPy array
    return getattr(t, "data", None) is not None


def _array_memory(obj: Any) -> tuple[int, int] | None:
    return int(obj.data.ptr), int(obj.nbytes)


#: PyTorch's tensors (and parameters): their storage's pointer and bytes.
TORCH_TENSOR = Owner("PyTorch tensor", _tensor_type, _tensor_memory)
#: CuPy's ``MemoryPointer``: the one byte it points at (a view owns its base's block).
CUPY_POINTER = Owner("CuPy MemoryPointer", _pointer_type, _pointer_memory)
#: CuPy's arrays, and any array made like one (``.data.ptr`` and ``.nbytes``).
CUPY_ARRAY = Owner("CuPy array", _array_type, _array_memory)
#: The owners the search knows without being told, in the order it asks them.
BUILT_IN = (TORCH_TENSOR, CUPY_POINTER, CUPY_ARRAY)


# -- the owners registered ----------------------------------------------------------------------

_lock = threading.Lock()
_registered: tuple[Owner, ...] = ()
_generation = 0


def register(owners: Iterable[Owner]) -> None:
    """Make the holder search know ``owners`` from its next search on (those it knows already
    are left as they are). TypeError, and nothing registered, when one is not an ``Owner``."""
    global _registered, _generation
    owners = tuple(owners)
    for owner in owners:
        if not isinstance(owner, Owner):
            raise TypeError(f"an owner is a jupyter_gpumem Owner(name, matches, memory), got "
                            f"{type(owner).__name__}")
    with _lock:
        new = tuple(o for o in dict.fromkeys(owners) if o not in BUILT_IN and o not in _registered)
        if new:
            _registered += new
            _generation += 1


def registered() -> tuple[Owner, ...]:
    """The owners registered, in the order they were."""
    return _registered


def generation() -> int:
    """A number that changes whenever an owner is registered (the search's per-type cache of
    what a type is holds while it stays the same)."""
    return _generation


def search_owners() -> tuple[Owner, ...]:
    """Every owner the search asks, in order: Note [The order owners are asked in]."""
    return (TORCH_TENSOR, CUPY_POINTER, *_registered, CUPY_ARRAY)


def reset() -> None:
    """Forget every owner registered (tests)."""
    global _registered, _generation
    with _lock:
        _registered = ()
        _generation += 1


# Note [The order owners are asked in]: a type is an owner's when the first owner that matches
# it says so. The narrow built-in owners come first (a PyTorch tensor: ``untyped_storage``; a
# CuPy MemoryPointer: ``ptr`` and ``mem``), then the registered ones in the order they were
# registered, and last the CuPy array, whose test is the broadest (any type with a ``data``
# attribute): a library's own array type with a ``data`` attribute is then still its own.
