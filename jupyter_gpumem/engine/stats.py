"""Counters of the caching allocator, with PyTorch's semantics and key names.

A :class:`Stat` changes only through ``increase``, ``decrease`` and the two resets. A
:class:`PoolStat` holds one Stat for the aggregate and one for each pool, and updates the
aggregate and the pool's counter together.

Note [Sizes near 2**63]
~~~~~~~~~~~~~~~~~~~~~~~
Both cores keep their books in signed 64-bit integers (the C core's ``int64_t``) and agree at
every size they accept:

- ``current`` and ``peak`` never pass ``INT64_MAX``: reserved bytes are bounded by it (a segment
  or a page that would take them past it fails as if the device were full), and every other
  ``current`` is a part of reserved bytes or a count of blocks;
- the accumulated counters ``allocated`` and ``freed`` saturate: once the sum passes
  ``INT64_MAX`` (2**63 - 1) they stay at it until ``reset_accumulated``. Three malloc+free pairs
  of 4 EiB make ``allocated_bytes.all.allocated`` 2**63 - 1 in both cores, never a wrapped or
  an unbounded number. PyTorch's ``int64_t`` counters overflow there (undefined behaviour);
- a device reports at most ``INT64_MAX`` bytes (``set_vmm`` and ``SimulatedDevice`` refuse a
  larger total with ValueError).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from jupyter_gpumem.data.sizes import INT64_MAX

POOL_NAMES = ("all", "large_pool", "small_pool")
FIELDS = ("current", "peak", "allocated", "freed")

#: The pooled counters, in PyTorch's order. ``active`` and ``active_bytes`` follow ``allocation``
#: and ``allocated_bytes``; see Note [No pending frees] in ``allocator``.
POOLED_STATS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)

#: The pooled counters the cores keep (the ``active*`` ones are derived), in exchange order.
STORED_POOLED = (
    "allocation",
    "segment",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)


class Stat:
    """One counter: its current value, its peak, and what was added and removed in total."""

    __slots__ = ("allocated", "current", "freed", "peak")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.allocated > INT64_MAX:  # Note [Sizes near 2**63]
            self.allocated = INT64_MAX
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount
        if self.freed > INT64_MAX:
            self.freed = INT64_MAX

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = 0
        self.freed = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "current": self.current,
            "peak": self.peak,
            "allocated": self.allocated,
            "freed": self.freed,
        }

    def __repr__(self) -> str:
        return (
            f"Stat(current={self.current}, peak={self.peak}, "
            f"allocated={self.allocated}, freed={self.freed})"
        )


class PoolStat:
    """A counter kept for all pools together and for the large and the small pool."""

    __slots__ = ("all", "large", "small")

    def __init__(self) -> None:
        self.all = Stat()
        self.large = Stat()
        self.small = Stat()

    def increase(self, small: bool, amount: int) -> None:
        # Inlined Stat.increase twice: this runs on every malloc.
        s = self.all
        s.current += amount
        s.allocated += amount
        if s.allocated > INT64_MAX:
            s.allocated = INT64_MAX
        if s.current > s.peak:
            s.peak = s.current
        s = self.small if small else self.large
        s.current += amount
        s.allocated += amount
        if s.allocated > INT64_MAX:
            s.allocated = INT64_MAX
        if s.current > s.peak:
            s.peak = s.current

    def decrease(self, small: bool, amount: int) -> None:
        s = self.all
        s.current -= amount
        s.freed += amount
        if s.freed > INT64_MAX:
            s.freed = INT64_MAX
        s = self.small if small else self.large
        s.current -= amount
        s.freed += amount
        if s.freed > INT64_MAX:
            s.freed = INT64_MAX

    def stats(self) -> tuple[Stat, Stat, Stat]:
        """The three counters in ``POOL_NAMES`` order."""
        return (self.all, self.large, self.small)


@dataclass
class AllocatorStats:
    """Every counter of one allocator (one device)."""

    allocation: PoolStat = field(default_factory=PoolStat)
    segment: PoolStat = field(default_factory=PoolStat)
    inactive_split: PoolStat = field(default_factory=PoolStat)
    allocated_bytes: PoolStat = field(default_factory=PoolStat)
    reserved_bytes: PoolStat = field(default_factory=PoolStat)
    inactive_split_bytes: PoolStat = field(default_factory=PoolStat)
    requested_bytes: PoolStat = field(default_factory=PoolStat)
    oversize_allocations: Stat = field(default_factory=Stat)
    oversize_segments: Stat = field(default_factory=Stat)
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    num_sync_all_streams: int = 0

    def to_tuple(self) -> tuple[int, ...]:
        """Every counter, flat, in the order the allocator cores exchange them."""
        out: list[int] = []
        for name in STORED_POOLED:
            pooled: PoolStat = getattr(self, name)
            for stat in pooled.stats():
                out += (stat.current, stat.peak, stat.allocated, stat.freed)
        for single in (self.oversize_allocations, self.oversize_segments):
            out += (single.current, single.peak, single.allocated, single.freed)
        out += (self.num_alloc_retries, self.num_ooms, self.num_device_alloc,
                self.num_device_free, self.num_sync_all_streams)
        return tuple(out)

    @classmethod
    def from_tuple(cls, values: tuple[int, ...]) -> AllocatorStats:
        """The inverse of ``to_tuple``."""
        st = cls()
        it = iter(values)
        for stat in st._all_stats():
            stat.current, stat.peak, stat.allocated, stat.freed = (next(it) for _ in range(4))
        (st.num_alloc_retries, st.num_ooms, st.num_device_alloc, st.num_device_free,
         st.num_sync_all_streams) = it
        return st

    def pooled(self) -> dict[str, PoolStat]:
        """The pooled counters by PyTorch name, the derived ``active*`` ones included."""
        return {
            "allocation": self.allocation,
            "segment": self.segment,
            "active": self.allocation,
            "inactive_split": self.inactive_split,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "active_bytes": self.allocated_bytes,
            "inactive_split_bytes": self.inactive_split_bytes,
            "requested_bytes": self.requested_bytes,
        }

    def _all_stats(self) -> list[Stat]:
        stats = [s for name in STORED_POOLED for s in getattr(self, name).stats()]
        return [*stats, self.oversize_allocations, self.oversize_segments]

    def reset_peak(self) -> None:
        for stat in self._all_stats():
            stat.reset_peak()

    def reset_accumulated(self) -> None:
        for stat in self._all_stats():
            stat.reset_accumulated()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_sync_all_streams = 0

    def as_flat_dict(self, max_split_size: int) -> dict[str, int]:
        """PyTorch's ``memory_stats()`` dict: ``"allocated_bytes.all.current"`` and so on."""
        out: dict[str, int] = {}
        for name, pooled in self.pooled().items():
            for pool_name, stat in zip(POOL_NAMES, pooled.stats(), strict=True):
                for key, value in stat.as_dict().items():
                    out[f"{name}.{pool_name}.{key}"] = value
        for name in ("oversize_allocations", "oversize_segments"):
            single: Stat = getattr(self, name)
            for key, value in single.as_dict().items():
                out[f"{name}.{key}"] = value
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["max_split_size"] = max_split_size
        return dict(sorted(out.items()))


def _flat_layout() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The keys of ``as_flat_dict`` in its (sorted) order, and where each value lies in
    ``to_tuple``'s counters followed by the max split size."""
    where: dict[str, int] = {}
    at = 0
    for name in STORED_POOLED:
        for pool in POOL_NAMES:
            for key in FIELDS:
                where[f"{name}.{pool}.{key}"] = at
                at += 1
    for derived, stored in (("active", "allocation"), ("active_bytes", "allocated_bytes")):
        for pool in POOL_NAMES:
            for key in FIELDS:
                where[f"{derived}.{pool}.{key}"] = where[f"{stored}.{pool}.{key}"]
    for name in ("oversize_allocations", "oversize_segments"):
        for key in FIELDS:
            where[f"{name}.{key}"] = at
            at += 1
    for name in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                 "num_sync_all_streams", "max_split_size"):
        where[name] = at
        at += 1
    keys = tuple(sorted(where))
    return keys, tuple(where[k] for k in keys)


_FLAT_KEYS, _FLAT_AT = _flat_layout()


def flat_stats(values: tuple[int, ...], max_split_size: int) -> dict[str, int]:
    """``AllocatorStats.from_tuple(values).as_flat_dict(max_split_size)``, read straight from the
    cores' counters (the ledger asks for it twice a cell: no objects made on the way)."""
    both = (*values, max_split_size)
    return dict(zip(_FLAT_KEYS, map(both.__getitem__, _FLAT_AT), strict=True))


def nest_stats(flat: dict[str, int]) -> dict[str, object]:
    """PyTorch's ``memory_stats_as_nested_dict``: split every key at its dots."""
    nested: dict[str, object] = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node[leaf] = value
    return nested


class Watermark:
    """A named peak of allocated and reserved bytes that leaves the user's peak stats alone.

    The per-cell ledger starts one per cell; see ``CachingAllocator.start_watermark``. While it
    runs, reading a peak first brings it up to date (the allocator's hot path keeps only one
    running peak, which every watermark takes its share of when read).
    """

    __slots__ = ("_peak_allocated", "_peak_reserved", "_refresh", "name", "start_allocated",
                 "start_reserved")

    def __init__(self, name: str, allocated: int, reserved: int,
                 refresh: Callable[[], None] | None = None) -> None:
        self.name = name
        self.start_allocated = allocated
        self.start_reserved = reserved
        self._peak_allocated = allocated
        self._peak_reserved = reserved
        self._refresh = refresh

    def observe(self, allocated: int, reserved: int) -> None:
        """Raise the peaks to at least these values."""
        if allocated > self._peak_allocated:
            self._peak_allocated = allocated
        if reserved > self._peak_reserved:
            self._peak_reserved = reserved

    def stop(self) -> None:
        """Freeze the peaks: later reads no longer refresh them."""
        self._refresh = None

    @property
    def running(self) -> bool:
        return self._refresh is not None

    @property
    def peak_allocated(self) -> int:
        if self._refresh is not None:
            self._refresh()
        return self._peak_allocated

    @property
    def peak_reserved(self) -> int:
        if self._refresh is not None:
            self._refresh()
        return self._peak_reserved

    def __repr__(self) -> str:
        return (
            f"Watermark({self.name!r}, peak_allocated={self.peak_allocated}, "
            f"peak_reserved={self.peak_reserved})"
        )
