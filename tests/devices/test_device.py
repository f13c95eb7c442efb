"""SimulatedDevice: capacity, addresses, errors, injected failures and other processes."""

from __future__ import annotations

import itertools

import pytest

from jupyter_gpumem import DeviceOutOfMemory, ManualClock, SimulatedDevice

MiB = 1 << 20
GiB = 1 << 30


def test_capacity_and_mem_get_info() -> None:
    d = SimulatedDevice(100 * MiB)
    assert d.mem_get_info() == (100 * MiB, 100 * MiB)
    p = d.malloc(30 * MiB)
    assert d.mem_get_info() == (70 * MiB, 100 * MiB)
    assert d.used == 30 * MiB
    assert d.live_segments() == {p: 30 * MiB}
    q = d.malloc(70 * MiB)  # exactly full is fine
    assert d.mem_get_info()[0] == 0
    with pytest.raises(DeviceOutOfMemory):
        d.malloc(1)
    d.free(p)
    d.free(q)
    assert d.mem_get_info() == (100 * MiB, 100 * MiB)
    assert (d.malloc_calls, d.free_calls) == (3, 2)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        SimulatedDevice(0)
    with pytest.raises(TypeError):
        SimulatedDevice(1.5)  # type: ignore[arg-type]
    d = SimulatedDevice(GiB)
    with pytest.raises(ValueError):
        d.malloc(0)
    with pytest.raises(ValueError):
        d.fail_next(-1)
    with pytest.raises(ValueError):
        d.hold_for_process(1, -5)


def test_addresses_are_aligned_distinct_and_not_zero() -> None:
    d = SimulatedDevice(GiB)
    ptrs = [d.malloc(n) for n in (512, 3 * MiB, 20 * MiB, 1)]
    assert all(p > 0 and p % (2 * MiB) == 0 for p in ptrs)
    ends = sorted((p, p + n) for p, n in d.live_segments().items())
    for (_, end), (start, _) in itertools.pairwise(ends):
        assert end <= start


def test_freed_addresses_are_reused() -> None:
    d = SimulatedDevice(GiB)
    a, b, c = d.malloc(4 * MiB), d.malloc(4 * MiB), d.malloc(4 * MiB)
    d.free(b)
    assert d.malloc(4 * MiB) == b  # the hole is used again
    d.free(a)
    d.free(b)
    # Two neighbouring holes merge: an 8 MiB segment fits where a and b were.
    assert d.malloc(8 * MiB) == a
    d.free(c)
    d.free(a)
    assert d.live_segments() == {}
    assert d.malloc(2 * MiB) == a  # the whole range is free again, from the start


def test_double_free_and_unknown_free() -> None:
    d = SimulatedDevice(GiB)
    p = d.malloc(MiB)
    with pytest.raises(ValueError, match="unknown or already-freed"):
        d.free(p + 512)
    d.free(p)
    with pytest.raises(ValueError, match="unknown or already-freed"):
        d.free(p)
    assert d.free_calls == 1
    assert d.used == 0


def test_fail_next() -> None:
    d = SimulatedDevice(GiB)
    d.fail_next(2)
    for _ in range(2):
        with pytest.raises(DeviceOutOfMemory, match="simulated"):
            d.malloc(MiB)
    p = d.malloc(MiB)
    assert d.live_segments() == {p: MiB}
    d.fail_next(1)
    d.fail_next(0)  # replaces, not adds
    d.free(d.malloc(MiB))


def test_hold_for_process() -> None:
    d = SimulatedDevice(100 * MiB)
    d.hold_for_process(4242, 60 * MiB, "python train.py")
    d.hold_for_process(7, 10 * MiB)
    assert d.mem_get_info() == (30 * MiB, 100 * MiB)
    assert d.held_by_others == 70 * MiB
    assert d.processes() == [(7, "other process", 10 * MiB),
                             (4242, "python train.py", 60 * MiB)]
    with pytest.raises(DeviceOutOfMemory):
        d.malloc(31 * MiB)
    p = d.malloc(30 * MiB)
    d.hold_for_process(4242, 0)  # releases
    assert d.processes() == [(7, "other process", 10 * MiB)]
    assert d.mem_get_info()[0] == 60 * MiB
    d.free(p)


def test_injected_clock() -> None:
    clock = ManualClock(start_ns=5_000, tick_ns=10)
    d = SimulatedDevice(GiB, clock=clock, index=3, name="Sim")
    assert (d.index, d.name) == (3, "Sim")
    assert d.clock() == 5_000
    assert d.clock() == 5_010
    clock.advance(1_000)
    assert d.clock() == 6_020


# -- the address space: one for segments and virtual ranges, below 2**63 -----------------------


def _disjoint(d: SimulatedDevice) -> bool:
    ranges = sorted([(p, p + n) for p, n in d.live_segments().items()]
                    + [(p, p + n) for p, n in d.reserved_ranges().items()])
    return all(end <= start for (_, end), (start, _) in itertools.pairwise(ranges))


def test_segments_and_virtual_ranges_never_overlap() -> None:
    # 13 ranges of 90 GiB (an 80 GiB device's expandable segments) pass the segments' base
    from jupyter_gpumem.devices.simulated import SIMULATED_BASE

    d = SimulatedDevice(80 * GiB)
    bases = [d.reserve(90 * GiB) for _ in range(13)]
    assert max(bases) + 90 * GiB > SIMULATED_BASE
    segments = [d.malloc(5 * GiB) for _ in range(12)]
    assert _disjoint(d)
    d.free(segments[3])
    assert d.malloc(5 * GiB) == segments[3]  # a freed segment's range is used again
    for base in bases[:4]:
        d.release(base, 90 * GiB)
    assert _disjoint(d) and d.reserve(90 * GiB) > max(bases)  # the next range, not a freed one


def test_a_map_of_2_61_bytes_is_one_range() -> None:
    d = SimulatedDevice(4 << 60)
    base = d.reserve(1 << 61)
    d.map(base, 1 << 60)
    d.map(base + (1 << 60), 1 << 60)
    assert d.mapped_bytes == d.used == 1 << 61
    with pytest.raises(ValueError, match=f"page at {base + (1 << 60):#x}, which is already"):
        d.map(base + (1 << 60), 4 * MiB)
    with pytest.raises(ValueError, match="still mapped"):
        d.release(base, 1 << 61)
    d.unmap(base + 2 * MiB, (1 << 61) - 4 * MiB)  # the middle: two pages stay
    assert d.mapped_bytes == 4 * MiB
    with pytest.raises(ValueError, match=f"page at {base + 2 * MiB:#x}, which is not mapped"):
        d.unmap(base, 4 * MiB)
    d.unmap(base, 2 * MiB)
    d.unmap(base + (1 << 61) - 2 * MiB, 2 * MiB)
    d.release(base, 1 << 61)
    assert d.mapped_bytes == d.used == 0 and d.reserved_ranges() == {}


def test_the_address_space_ends_below_2_63() -> None:
    from jupyter_gpumem.devices.simulated import ADDRESS_END

    d = SimulatedDevice((1 << 63) - 1)
    p = d.malloc(1 << 62)
    with pytest.raises(DeviceOutOfMemory, match="out of address space"):
        d.malloc((1 << 62) - (1 << 46))  # the device has room, the addresses do not
    q = d.malloc(1 << 61)
    r = d.reserve(1 << 60)
    with pytest.raises(DeviceOutOfMemory, match="out of address space"):
        d.reserve(1 << 60)
    assert r + (1 << 60) <= ADDRESS_END and q + (1 << 61) <= ADDRESS_END
    d.release(r, 1 << 60)
    assert d.reserve(1 << 60) == r  # wrapped round to the range given back
    assert _disjoint(d)
    d.free(q)
    d.free(p)


def test_a_capacity_above_2_63_minus_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"at most 2\*\*63 - 1 B"):
        SimulatedDevice(1 << 63)
    assert SimulatedDevice((1 << 63) - 1).mem_get_info() == ((1 << 63) - 1,) * 2
