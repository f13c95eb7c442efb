"""The layout at a trace's start, rebuilt in a fresh allocator before a replay runs.

``plan(program.initial, device bytes)`` says how to carve every segment of the start layout
(made once a program: ``suggest_config`` replays it dozens of times); ``rebuild(allocator,
device, plan)`` makes them, with their blocks, through the allocator's own malloc and free,
under the default config, and returns the recorded and replayed addresses of the live blocks:

- segments are made in address order (an expandable segment at its reserved range's base), so
  their replayed addresses keep the recorded order;
- while a segment is carved every other one is wholly handed out, so each malloc can only be
  served from the segment being carved. A classic large segment is first obtained whole (a
  request of its size gets exactly that segment) and given back to the cache; a small one comes
  with its first block. Its blocks are then allocated in address order, a free block in chunks
  of at most 1 MiB in the small pool (a larger request would go to the large pool). At the end
  the free chunks are freed and merge back into the recorded free blocks;
- an expandable segment is carved under ``expandable_segments:True`` from its base (Note [The
  virtual range] in ``whatif.program``): its unmapped stretches are carved mapped, as holes,
  and unmapped at the end by one ``empty_cache()`` while nothing else is cached. When a later
  segment of the same stream and pool follows, the earlier one's unmapped end is carved as a
  hole too, so that the later one's carving cannot land in it. Holes need physical memory only
  while the layout is made: the simulated device is lifted by their bytes meanwhile. Where
  they cannot be carved (a device smaller than the recorded one, an inferred base that asks
  for too much), ``plan(holes=False)`` lays the ranges side by side and the replay says so;
- a free block of at most 1 MiB in a large-pool expandable segment cannot be asked for (the
  request goes to the small pool): it is carved with the piece before it as one block, which is
  then freed and asked for at the piece's size, leaving the free block split off behind it.
  Only one at a range's start with nothing before it (a base not known) is held with the live
  block after it (``absorbed``; ``prepare`` says so).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from jupyter_gpumem.data.sizes import SMALL_BUFFER, SMALL_SIZE
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.engine.blocks import segment_size_for
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.expandable import address_space_size

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import SegmentInfo
    from jupyter_gpumem.devices.simulated import SimulatedDevice
    from jupyter_gpumem.engine.allocator import CachingAllocator

__all__ = ["Plan", "Rebuilt", "absorbed_blocks", "cached_before", "inferred_bases", "plan",
           "rebuild"]

Int64s = np.ndarray[Any, np.dtype[np.int64]]

#: The config an expandable segment of the start layout is carved under.
_EXPANDABLE = AllocatorConfig(expandable_segments=True)
#: The most bytes of holes carved for one layout (beyond it the page books of the simulated
#: device would be too large); a layout needing more is refused (``plan``).
MAX_HOLES = 1 << 40

LIVE, FREE, HOLE = 0, 1, 2


@dataclass(slots=True)
class Piece:
    """A stretch of a segment to carve: a live block, a free block or an unmapped hole; with
    ``split`` bytes of a free block after it carved along (a free block of at most 1 MiB in a
    large-pool expandable segment)."""

    address: int
    size: int
    kind: int
    split: int = 0


@dataclass
class Rebuilt:
    """The live blocks of the start layout: recorded and replayed addresses."""

    recorded: Int64s
    replayed: Int64s


@dataclass
class _Carver:
    allocator: CachingAllocator
    recorded: list[int] = field(default_factory=list)
    replayed: list[int] = field(default_factory=list)
    free_later: list[int] = field(default_factory=list)
    holes: list[int] = field(default_factory=list)
    splits: list[tuple[int, Piece, int]] = field(default_factory=list)  # (ptr, piece, stream)

    def carve(self, pieces: list[Piece], origin: int, stream: int, small: bool,
              base: int | None, what: int) -> int:
        """Allocate ``pieces`` (contiguous from ``origin``) in order; ``base`` is the replayed
        address of ``origin`` when known. Returns it."""
        malloc = self.allocator.malloc
        recorded, replayed = self.recorded.append, self.replayed.append
        for piece in pieces:
            size = piece.size + piece.split
            if piece.kind == LIVE and not piece.split and base is not None:
                ptr = malloc(size, stream)  # the common piece: one malloc, nothing to keep
                if ptr - base != piece.address - origin:
                    raise _cannot(what)
                recorded(piece.address)
                replayed(ptr)
                continue
            chunk = min(size, SMALL_SIZE) if small and piece.kind != LIVE else size
            taken = 0
            ptr = 0
            while taken < size:
                part = min(chunk, size - taken)
                ptr = malloc(part, stream)
                if base is None:
                    base = ptr - (piece.address + taken - origin)
                if ptr - base != piece.address + taken - origin:
                    raise _cannot(what)
                if piece.split:
                    self.splits.append((ptr, piece, stream))
                elif piece.kind == FREE:
                    self.free_later.append(ptr)
                elif piece.kind == HOLE:
                    self.holes.append(ptr)
                taken += part
            if piece.kind == LIVE and not piece.split:
                recorded(piece.address)
                replayed(ptr)
        assert base is not None
        return base

    def settle_splits(self) -> None:
        """Leave each split-off free block behind its piece: free the two carved as one, ask
        for the piece's size (the only cached block that fits it). From the highest address
        down, so that no free block left behind merges with the next one freed."""
        for ptr, piece, stream in sorted(self.splits, key=lambda s: -s[0]):
            self.allocator.free(ptr)
            again = self.allocator.malloc(piece.size, stream)
            if again != ptr:
                raise ValueError(f"the free block at {piece.address + piece.size:#x} at the "
                                 "trace's start cannot be rebuilt by this allocator's policy")
            if piece.kind == LIVE:
                self.recorded.append(piece.address)
                self.replayed.append(ptr)
            else:
                self.holes.append(ptr)


@dataclass
class Plan:
    """How to carve a start layout, made once for any number of replays: each segment (or
    expandable segment) with its pieces, and the bytes of its holes (``plan``)."""

    units: list[tuple[SegmentInfo, list[Piece], int]]  # (first segment, pieces, origin)
    lift: int  # bytes of the holes: the device is lifted by them while they are mapped


def plan(segments: list[SegmentInfo], total: int, *, holes: bool = True) -> Plan:
    """The plan of ``segments`` on a device of ``total`` bytes. ``holes`` False: the mapped
    ranges of each expandable segment are laid side by side (no holes between them).
    ValueError when the holes would pass the segment's reserved range or ``MAX_HOLES``."""
    units = _units(segments, holes)
    lift = 0
    out: list[tuple[SegmentInfo, list[Piece], int]] = []
    for k, unit in enumerate(units):
        if not unit.ranges:
            out.append((unit.first, _classic_pieces(unit.first), unit.origin))
            continue
        pieces = _expandable_pieces(unit.ranges, unit.origin)
        last = pieces[-1]
        end = last.address + last.size + last.split
        span = address_space_size(total, unit.first["segment_type"] == "small")
        if holes and end - unit.origin > span:
            raise ValueError(f"its ranges from {unit.origin:#x} pass the "
                             f"{format_bytes(span)} an expandable segment reserves here")
        if holes and _followed(units, k) and end - unit.origin < span:
            # Note [The virtual range]: the next segment must not land in this one's end
            pieces.append(Piece(end, span - (end - unit.origin), HOLE))
        lift += sum(p.size for p in pieces if p.kind == HOLE)
        out.append((unit.first, pieces, unit.origin))
    if lift > MAX_HOLES:
        raise ValueError(f"its unmapped stretches hold {format_bytes(lift)}, more than "
                         f"{format_bytes(MAX_HOLES)} (MAX_HOLES)")
    return Plan(out, lift)


def rebuild(allocator: CachingAllocator, device: SimulatedDevice, layout: Plan) -> Rebuilt:
    """Carve ``layout`` in ``allocator``, fresh on ``device``, under the default config; see the
    module's docstring."""
    classic = allocator.config
    carver = _Carver(allocator)
    with _lifted(device, layout.lift):
        for seg, pieces, origin in layout.units:
            _make(carver, seg, pieces, origin, classic)
        allocator.set_config(_EXPANDABLE)
        carver.settle_splits()
        for ptr in carver.holes:
            allocator.free(ptr)
        if carver.holes:
            allocator.empty_cache()  # only the holes are cached: their pages are unmapped
        allocator.set_config(classic)
    for ptr in carver.free_later:
        allocator.free(ptr)
    return Rebuilt(np.array(carver.recorded, np.int64), np.array(carver.replayed, np.int64))


def _make(carver: _Carver, seg: SegmentInfo, pieces: list[Piece], origin: int,
          classic: AllocatorConfig) -> None:
    """Carve one segment (classic, or an expandable one from its base)."""
    allocator = carver.allocator
    stream = seg["stream"]
    small = seg["segment_type"] == "small"
    expandable = bool(seg.get("is_expandable"))
    kind = _EXPANDABLE if expandable else classic
    if allocator.config != kind:  # a config change walks every live block: not per segment
        allocator.set_config(kind)
    total = seg["total_size"]
    if small and not expandable and total != SMALL_BUFFER:
        raise ValueError(f"segment {seg['address']:#x}: a small-pool segment of {total} "
                         f"bytes (the policy makes only {SMALL_BUFFER})")
    if not small and not expandable and segment_size_for(total) != total:
        raise ValueError(f"segment {seg['address']:#x}: a large-pool segment of {total} "
                         "bytes, which the policy never makes (expandable segments?)")
    base = None
    if not small:
        extent = pieces[-1].address + pieces[-1].size + pieces[-1].split - origin
        base = allocator.malloc(extent, stream)
        allocator.free(base)
    carver.carve(pieces, origin, stream, small, base, seg["address"])


@dataclass
class _Unit:
    """What is carved in one go: a classic segment (no ``ranges``), or mapped ranges of one
    expandable segment (``key``: its base, stream and pool) from ``origin``."""

    first: SegmentInfo
    origin: int
    ranges: list[SegmentInfo]
    key: tuple[int, int, str] | None = None


def _cannot(what: int) -> ValueError:
    return ValueError(f"the layout of segment {what:#x} at the trace's start cannot be rebuilt "
                      "by this allocator's policy")


def _units(segments: list[SegmentInfo], holes: bool) -> list[_Unit]:
    """Each classic segment alone, and the mapped ranges of each expandable segment together
    from its base (or, not ``holes``, each alone: side by side), in address order of their
    origins."""
    units: list[_Unit] = []
    by_key: dict[tuple[int, int, str], _Unit] = {}
    for seg in sorted(segments, key=lambda s: s["address"]):
        if not seg.get("is_expandable"):
            units.append(_Unit(seg, seg["address"], []))
            continue
        key = (seg.get("virtual_address", seg["address"]), seg["stream"], seg["segment_type"])
        if not holes:
            units.append(_Unit(seg, seg["address"], [seg], key))
        elif key in by_key:
            by_key[key].ranges.append(seg)
        else:
            by_key[key] = _Unit(seg, key[0], [seg], key)
            units.append(by_key[key])
    return sorted(units, key=lambda u: u.origin)


def _followed(units: list[_Unit], k: int) -> bool:
    """Whether a later unit is of another expandable segment of the same stream and pool (and
    none of unit ``k``'s own segment follows)."""
    key = units[k].key
    assert key is not None
    later = [u.key for u in units[k + 1:] if u.key is not None and u.key[1:] == key[1:]]
    return bool(later) and key not in later


def _classic_pieces(seg: SegmentInfo) -> list[Piece]:
    pieces = [Piece(b["address"], b["size"], FREE if b["state"] == "inactive" else LIVE)
              for b in seg["blocks"]]
    cursor = seg["address"]
    for p in pieces:
        cursor += p.size
    if cursor != seg["address"] + seg["total_size"]:
        raise ValueError(f"the blocks of segment {seg['address']:#x} do not cover it")
    return pieces


def _expandable_pieces(ranges: list[SegmentInfo], origin: int) -> list[Piece]:
    """The pieces of one expandable segment from ``origin``: holes before and between its
    mapped ranges, their blocks, and split-off free blocks (the module's docstring)."""
    small = ranges[0]["segment_type"] == "small"
    pieces: list[Piece] = []
    cursor = origin
    for seg in ranges:
        if seg["address"] < cursor:
            raise ValueError(f"segment {seg['address']:#x} lies before its segment's base")
        if seg["address"] > cursor:
            pieces.append(Piece(cursor, seg["address"] - cursor, HOLE))
        carry = 0
        for b in seg["blocks"]:
            kind = FREE if b["state"] == "inactive" else LIVE
            if not small and kind == FREE and b["size"] <= SMALL_SIZE:
                if pieces and pieces[-1].address + pieces[-1].size == b["address"]:
                    pieces[-1].split = b["size"]
                else:  # nothing before it: held with the live block after it
                    carry = b["size"]
                continue
            if carry:
                pieces.append(Piece(b["address"] - carry, b["size"] + carry, kind))
                carry = 0
            else:
                pieces.append(Piece(b["address"], b["size"], kind))
        cursor = seg["address"] + seg["total_size"]
        last = pieces[-1] if pieces else None
        if last is None or last.address + last.size + last.split != cursor:
            raise ValueError(f"the blocks of segment {seg['address']:#x} do not cover it")
    return pieces


def absorbed_blocks(segments: list[SegmentInfo]) -> int:
    """Free blocks of at most 1 MiB at the start of a large-pool expandable range with nothing
    before it to split them from: held with the live block after them."""
    count = 0
    for seg in segments:
        if not seg.get("is_expandable") or seg["segment_type"] == "small" or not seg["blocks"]:
            continue
        first = seg["blocks"][0]
        if (first["state"] == "inactive" and first["size"] <= SMALL_SIZE
                and seg.get("virtual_address", seg["address"]) == seg["address"]):
            count += 1
    return count


def cached_before(segments: list[SegmentInfo]) -> bool:
    """Whether a classic large-pool segment of the start layout is cached whole (one garbage
    collection may release: its age before the trace is not recorded)."""
    return any(not seg.get("is_expandable") and seg["segment_type"] == "large"
               and len(seg["blocks"]) == 1 and seg["blocks"][0]["state"] == "inactive"
               for seg in segments)


def inferred_bases(segments: list[SegmentInfo]) -> int:
    """Expandable segments of the start layout whose base is inferred, not recorded (Note
    [The virtual range])."""
    return len({(seg.get("virtual_address"), seg["stream"], seg["segment_type"])
                for seg in segments
                if seg.get("is_expandable") and not seg.get("virtual_size")})


@contextmanager
def _lifted(device: SimulatedDevice, extra: int) -> Iterator[None]:
    """The device ``extra`` bytes larger meanwhile (the holes' pages, mapped while carved)."""
    device.total += extra
    try:
        yield
    finally:
        device.total -= extra
