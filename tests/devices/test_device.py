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
