"""Which user variables hold a block: for the blocks that survive a trace and the OOM panel.

A variable holds a block when it is a CuPy array (anything with ``.data.ptr`` and ``.nbytes``)
whose bytes fall in the block. On the simulated device addresses are plain ints, so an int that
equals a live block's address also counts as holding it, unless ``addresses=False``: an int
keeps nothing alive (``del`` on it frees nothing), so the OOM panel does not count it. Lists,
tuples and dicts are looked into one level deep (``xs[3]``, ``d['w']``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_CONTAINER_ITEMS", "find_holders"]

#: Elements of one list/tuple/dict looked at when searching for holders.
MAX_CONTAINER_ITEMS = 1000


def _pointer_range(obj: Any) -> tuple[int, int] | None:
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return (obj, 0) if obj > 0 else None
    data = getattr(type(obj), "data", None)  # avoid triggering properties on arbitrary objects
    if data is None or not hasattr(obj, "nbytes"):
        return None
    try:
        ptr = int(obj.data.ptr)
        nbytes = int(obj.nbytes)
    except Exception:
        return None
    return (ptr, nbytes) if ptr else None


def find_holders(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]], *,
                 addresses: bool = True) -> dict[int, list[str]]:
    """Which names of ``namespace`` hold each block ``(address, size)``: address -> names.

    See the module docstring for what counts as holding a block."""
    if not blocks:
        return {}
    ordered = sorted(blocks)
    starts = [a for a, _ in ordered]
    exact = {a for a, _ in ordered}
    out: dict[int, list[str]] = {}

    def match(name: str, obj: Any) -> None:
        rng = _pointer_range(obj)
        if rng is None:
            return
        ptr, nbytes = rng
        if isinstance(obj, int):
            if addresses and ptr in exact:
                out.setdefault(ptr, []).append(name)
            return
        i = bisect.bisect_right(starts, ptr) - 1
        if i >= 0:
            addr, size = ordered[i]
            if addr <= ptr and ptr + max(nbytes, 1) <= addr + size:
                names = out.setdefault(addr, [])
                if name not in names:
                    names.append(name)

    for name, value in list(namespace.items()):
        if name.startswith("_") or isinstance(value, type):
            continue
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value[:MAX_CONTAINER_ITEMS]):
                match(f"{name}[{i}]", item)
        elif isinstance(value, dict):
            for k, item in list(value.items())[:MAX_CONTAINER_ITEMS]:
                match(f"{name}[{k!r}]", item)
        else:
            match(name, value)
    return out
