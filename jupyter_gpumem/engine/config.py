"""Allocator configuration: validated values, parsed from PyTorch's ``key:value,key:value`` form."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

from jupyter_gpumem.data.settings_text import from_env, key_values
from jupyter_gpumem.data.sizes import MiB

ENV_VAR = "JUPYTER_GPUMEM_ALLOC_CONF"
#: PyTorch refuses a max_split_size_mb of 20 or less: segments of 20 MiB must stay splittable.
MIN_MAX_SPLIT_SIZE_MB = 20
#: 1 PiB, more than any device holds, so a larger value would mean the same as unset; the bound
#: keeps max_split_size in bytes well inside the cores' 64-bit sizes.
MAX_MAX_SPLIT_SIZE_MB = 1 << 30
#: PyTorch's examples use 1 to 16 divisions; the bound keeps 512 B × divisions far from overflow
#: (with N divisions, rounding by steps starts above 512·N B).
MAX_ROUNDUP_POWER2_DIVISIONS = 1 << 10


@dataclass(frozen=True)
class AllocatorConfig:
    """Policy knobs, named as the keys of ``JUPYTER_GPUMEM_ALLOC_CONF``.

    ``None`` means "unset", which is PyTorch's default behaviour for every key. Bounds, checked
    here so both allocator cores see the same values: ``max_split_size_mb`` in (20, 2**30];
    ``roundup_power2_divisions`` a power of 2 in [1, 1024]; ``garbage_collection_threshold`` in
    (0, 1); ``per_process_memory_fraction`` in [0, 1]; ``expandable_segments`` a bool, written
    ``True`` or ``False`` in text as PyTorch spells it (Note [Expandable segments] in
    ``engine/expandable``).
    """

    max_split_size_mb: int | None = None
    roundup_power2_divisions: int | None = None
    garbage_collection_threshold: float | None = None
    per_process_memory_fraction: float | None = None
    expandable_segments: bool | None = None

    def __post_init__(self) -> None:
        if self.expandable_segments is not None and not isinstance(self.expandable_segments, bool):
            raise TypeError(f"expandable_segments must be a bool, got "
                            f"{type(self.expandable_segments).__name__}")
        _check_max_split(self.max_split_size_mb)
        _check_divisions(self.roundup_power2_divisions)
        _check_unit_interval(
            "garbage_collection_threshold", self.garbage_collection_threshold, open_=True
        )
        _check_unit_interval(
            "per_process_memory_fraction", self.per_process_memory_fraction, open_=False
        )

    @property
    def max_split_size(self) -> int | None:
        """``max_split_size_mb`` in bytes, or None when unset."""
        return None if self.max_split_size_mb is None else self.max_split_size_mb * MiB

    @classmethod
    def parse(cls, text: str) -> AllocatorConfig:
        """Parse ``"max_split_size_mb:64,garbage_collection_threshold:0.6"``."""
        return cls().updated(text)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AllocatorConfig:
        """The config in ``JUPYTER_GPUMEM_ALLOC_CONF``, or the defaults when it is unset."""
        return from_env(ENV_VAR, cls.parse, environ)

    def updated(self, text: str) -> AllocatorConfig:
        """A copy with the ``key:value,...`` pairs of ``text`` applied; ``none`` unsets a key.
        Every key is checked to be known before any value is read."""
        pairs = key_values(text)
        self._check_keys(key for key, _ in pairs)
        return self.with_values(**{key: _convert(key, raw) for key, raw in pairs})

    def with_values(self, **changes: object) -> AllocatorConfig:
        """A copy with the given keys changed; an unknown key raises ValueError."""
        self._check_keys(changes)
        return replace(self, **changes)  # type: ignore[arg-type]

    def _check_keys(self, keys: Iterable[str]) -> None:
        known = {f.name for f in fields(self)}
        for key in keys:
            if key not in known:
                raise ValueError(
                    f"unknown allocator option {key!r}; known options: {', '.join(sorted(known))}"
                )

    def as_text(self) -> str:
        """The set keys in ``key:value`` form; empty when everything is default."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return ",".join(f"{name}:{value}" for name, value in values if value is not None)


def _convert(key: str, raw: str) -> object:
    if raw.lower() in ("none", "unset"):
        return None
    if key == "expandable_segments":
        # PyTorch's parser (CUDAAllocatorConfig) takes exactly these two spellings.
        if raw not in ("True", "False"):
            raise ValueError(f"expandable_segments must be True or False, got {raw!r}")
        return raw == "True"
    want_int = key in ("max_split_size_mb", "roundup_power2_divisions")
    try:
        return int(raw) if want_int else float(raw)
    except ValueError:
        kind = "an integer" if want_int else "a number"
        raise ValueError(f"{key} must be {kind}, got {raw!r}") from None


def _check_max_split(value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_split_size_mb must be an int, got {type(value).__name__}")
    if not MIN_MAX_SPLIT_SIZE_MB < value <= MAX_MAX_SPLIT_SIZE_MB:
        raise ValueError(f"max_split_size_mb must be > {MIN_MAX_SPLIT_SIZE_MB} and <= "
                         f"{MAX_MAX_SPLIT_SIZE_MB} (MiB), got {value}")


def _check_divisions(value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"roundup_power2_divisions must be an int, got {type(value).__name__}")
    if value < 1 or value & (value - 1) or value > MAX_ROUNDUP_POWER2_DIVISIONS:
        raise ValueError(f"roundup_power2_divisions must be a power of 2 from 1 to "
                         f"{MAX_ROUNDUP_POWER2_DIVISIONS}, got {value}")


def _check_unit_interval(name: str, value: float | None, *, open_: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if math.isnan(value) or not (0.0 < value < 1.0 if open_ else 0.0 <= value <= 1.0):
        bounds = "strictly between 0 and 1" if open_ else "in [0, 1]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
