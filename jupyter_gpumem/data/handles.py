"""The addresses ``caching_allocator_alloc`` handed out, as the very int objects it returned, so
the holder search can tell a live handle from a stale copy of a freed address.

An int keeps nothing alive, but a block from ``caching_allocator_alloc`` stays allocated until
``caching_allocator_delete``: the variable holding the returned int is what the user acts on.
The search (``reach``) counts an int as holding a block only when it is the same object that
``caching_allocator_alloc`` returned for it and the block was not deleted since: an int that
merely equals an address (a list still holding freed addresses, one of which a new block
reuses) holds nothing.
"""

from __future__ import annotations

import threading

__all__ = ["any_handles", "forget", "handle_address", "handle_ids", "remember"]

_lock = threading.Lock()
_by_address: dict[int, int] = {}  # address -> the int object returned for it
_by_id: dict[int, int] = {}  # id of that object -> the object (kept alive, so ids stay unique)


def remember(handle: int) -> None:
    """``handle`` was just returned by ``caching_allocator_alloc``."""
    if handle <= 0:
        return
    with _lock:
        old = _by_address.pop(int(handle), None)
        if old is not None:
            _by_id.pop(id(old), None)
        _by_address[int(handle)] = handle
        _by_id[id(handle)] = handle


def forget(address: int) -> None:
    """The block at ``address`` was deleted (``caching_allocator_delete``)."""
    with _lock:
        old = _by_address.pop(int(address), None)
        if old is not None:
            _by_id.pop(id(old), None)


def handle_address(obj: int) -> int | None:
    """The block address ``obj`` is the live handle of, None when it is no handle."""
    return obj if _by_id.get(id(obj)) is obj else None


def any_handles() -> bool:
    """Whether any handle is live (else the search skips ints at once)."""
    return bool(_by_id)


def handle_ids() -> set[int]:
    """The ids of the live handles, for a quick test of a list of ints."""
    with _lock:
        return set(_by_id)
