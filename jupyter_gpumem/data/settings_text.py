"""PyTorch's settings form, ``key:value,key:value``, as the allocator options
(``JUPYTER_GPUMEM_ALLOC_CONF``) and the load limits (``JUPYTER_GPUMEM_LOAD_LIMITS``) both use it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


def key_values(text: str) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of ``text`` in order, stripped; empty items are skipped and an
    item without a value raises ValueError."""
    pairs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = (s.strip() for s in item.partition(":"))
        if not sep or not raw:
            raise ValueError(f"expected key:value, got {item!r}")
        pairs.append((key, raw))
    return pairs


def from_env(var: str, parse: Callable[[str], T],
             environ: Mapping[str, str] | None = None) -> T:
    """``parse`` of the environment variable ``var`` (empty when unset); its errors name ``var``."""
    env = os.environ if environ is None else environ
    try:
        return parse(env.get(var, ""))
    except ValueError as exc:
        raise ValueError(f"{var}: {exc}") from None
