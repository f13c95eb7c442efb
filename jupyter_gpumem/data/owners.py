"""``Owner``: how the holder search knows that an object's memory lies in a GPU block.

Each memory source names the array types of its library (``MemorySource.owners``): a CuPy
array, a PyTorch tensor, a JAX array. The search (``data.reach``) asks an object's type once
whether it ``matches``, then each object of it for its ``memory``. Plain data and functions:
no library is imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Owner"]


@dataclass(frozen=True)
class Owner:
    """How the holder search knows the arrays of a library: ``matches(type)`` says whether
    objects of a type may own device memory, ``memory(obj)`` gives ``(address, nbytes)`` of the
    memory one owns (None when it owns none; an exception counts as none). ``name`` is the type
    in words ("JAX array")."""

    name: str
    matches: Callable[[type], bool]
    memory: Callable[[Any], tuple[int, int] | None]
