"""Shared fixtures: a simulated device with a manual clock, and a guard on global state."""

from __future__ import annotations

import pytest

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ns=1_000_000, tick_ns=1_000)


@pytest.fixture
def device(clock: ManualClock) -> SimulatedDevice:
    return SimulatedDevice(8 * GiB, clock=clock)


@pytest.fixture
def allocator(device: SimulatedDevice) -> CachingAllocator:
    a = CachingAllocator(device, debug=True)
    yield a
    a.check_invariants()
