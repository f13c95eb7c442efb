"""The replayed device's size when none is given: what the recorded allocator could use (Note
[The replayed device's size]), so an out-of-memory error on a GPU shared with a CUDA context,
workspaces or other processes is reproduced, not replayed away on the GPU's whole size."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.columns import plain_snapshot
from jupyter_gpumem.whatif.compare import suggest_config
from jupyter_gpumem.whatif.replay import UNLIMITED, prepare, replay
from tests.fragmentation_workload import CAPACITY, MiB, run_workload

OUTSIDE = 3 * CAPACITY  # held by "another process": the allocator can use CAPACITY of it


def recorded(native: bool) -> tuple[CachingAllocator, dict[str, Any]]:
    """The fragmentation workload on a device 4x its size, most of it held outside."""
    device = SimulatedDevice(CAPACITY + OUTSIDE)
    device.hold_for_process(4242, OUTSIDE, "trainer")
    allocator = CachingAllocator(device, native=native)
    allocator.record_history(stacks=False)
    run_workload(allocator)
    return allocator, plain_snapshot(allocator.snapshot())  # its tests edit the trace's dicts


def oom_event(snap: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(snap["device_traces"][0]) if e["action"] == "oom")


@pytest.mark.parametrize("native", [False, True])
def test_an_oom_beside_other_processes_is_reproduced(native: bool) -> None:
    allocator, snap = recorded(native)
    result = replay(snap)
    # the device's 4 GiB, of which the allocator could use 600 MiB reserved + 424 MiB free
    assert (result.capacity, result.outside) == (CAPACITY + OUTSIDE, OUTSIDE)
    assert result.num_ooms == allocator.stats.num_ooms == 1
    assert result.first_oom == oom_event(snap)
    assert result.peak_reserved == allocator.stats.reserved_bytes.all.peak
    assert ("replayed on the device's 4.0 GiB, 3.0 GiB of it in use outside the allocator, "
            "which could use 1.0 GiB: its 600 MiB reserved plus the 424 MiB the device had free "
            "at its first out-of-memory error") in result.notes
    assert result.text().splitlines()[0].endswith(
        "on a device of 4.0 GiB (3.0 GiB of it in use outside the allocator): 1 out-of-memory "
        f"error, the first at event {result.first_oom}")
    # on the whole GPU the error would be replayed away: what the old default did
    assert replay(snap, capacity=CAPACITY + OUTSIDE).fits


@pytest.mark.parametrize("native", [False, True])
def test_a_pytorch_trace_uses_the_oom_events_device_free(native: bool) -> None:
    _, snap = recorded(native)
    del snap["jupyter_gpumem"]  # PyTorch's pickle has no device total, only the oom's free
    prepared = prepare(snap)
    assert (prepared.capacity, prepared.program.outside) == (CAPACITY, 0)  # total unknown
    assert ("replayed on a device of 1.0 GiB, what the allocator could use: its 600 MiB "
            "reserved plus the 424 MiB the device had free at its first out-of-memory error (the "
            "trace does not say the device's size)") in prepared.notes
    found = suggest_config(prepared)
    assert not found.baseline.fits and found.improves
    assert found.best is not None and found.best.peak_reserved == 700 * MiB


def test_the_tightest_of_several_ooms() -> None:
    _, snap = recorded(True)
    trace = snap["device_traces"][0]
    at = oom_event(snap)
    second = copy.deepcopy(trace[at])
    second["device_free"] = 100 * MiB  # a later error, when the device had less free
    trace.append(second)
    prepared = prepare(snap)
    assert prepared.capacity - prepared.program.outside == 600 * MiB + 100 * MiB
    assert any("at the tightest of its out-of-memory errors" in n for n in prepared.notes)


@pytest.mark.parametrize("native", [False, True])
def test_without_an_oom_the_snapshot_free_memory_counts(native: bool) -> None:
    device = SimulatedDevice(CAPACITY + OUTSIDE)
    device.hold_for_process(4242, OUTSIDE)
    allocator = CachingAllocator(device, native=native)
    allocator.record_history(stacks=False)
    allocator.malloc(100 * MiB)
    prepared = prepare(allocator.snapshot())
    assert prepared.capacity - prepared.program.outside == CAPACITY
    assert any("when the snapshot was taken" in n for n in prepared.notes)
    # a device all the allocator's: its total, and nothing to say
    alone = CachingAllocator(SimulatedDevice(CAPACITY), native=native)
    alone.record_history(stacks=False)
    alone.malloc(100 * MiB)
    quiet = prepare(alone.snapshot())
    assert (quiet.capacity, quiet.program.outside) == (CAPACITY, 0)
    assert not any("replayed on" in n for n in quiet.notes)


def test_a_trace_that_says_nothing_is_replayed_unlimited() -> None:
    allocator = CachingAllocator(SimulatedDevice(CAPACITY))
    allocator.record_history(stacks=False)
    allocator.malloc(100 * MiB)
    snap = dict(allocator.snapshot())
    del snap["jupyter_gpumem"]
    prepared = prepare(snap)
    assert prepared.capacity == UNLIMITED
    assert any("unlimited device (pass capacity=)" in n for n in prepared.notes)


def test_a_given_capacity_wins_and_is_checked() -> None:
    _, snap = recorded(True)
    assert prepare(snap, 5 * CAPACITY).capacity == 5 * CAPACITY
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="capacity must be a positive int"):
            prepare(snap, bad)  # type: ignore[arg-type]
    assert prepare(snap).program.recorded_ooms == 1
    assert AllocatorConfig() == prepare(snap).recorded


def test_a_result_reads_as_words_in_ipython() -> None:
    from IPython.lib.pretty import pretty

    _, snap = recorded(True)
    failed, fitted = replay(snap), replay(snap, "max_split_size_mb:64")
    first = failed.text().splitlines()
    assert first[0] == (f"gpumem replay of {failed.events} events under defaults, on a device "
                        f"of 4.0 GiB (3.0 GiB of it in use outside the allocator): 1 "
                        f"out-of-memory error, the first at event {failed.first_oom}")
    assert first[1] == ("  peak reserved 600 MiB, peak allocated 600 MiB; 1 segment at the end "
                        "(peak 1); 1 retry")
    assert pretty(fitted).splitlines()[:2] == [
        f"gpumem replay of {fitted.events} events under max_split_size_mb:64, on a device of "
        "4.0 GiB (3.0 GiB of it in use outside the allocator): fits",
        "  peak reserved 700 MiB, peak allocated 700 MiB; 2 segments at the end (peak 2); "
        "0 retries"]
    assert all(line.startswith("note: ") for line in pretty(fitted).splitlines()[2:])


@pytest.mark.parametrize("native", [False, True])
def test_a_memory_fraction_stays_a_share_of_the_whole_device(native: bool) -> None:
    """Recorded under a fraction of a device partly held outside: the replay's device has the
    recorded total, so the fraction caps at the same bytes and the run is reproduced exactly."""
    device = SimulatedDevice(4 * CAPACITY)
    device.hold_for_process(4242, CAPACITY, "trainer")
    allocator = CachingAllocator(device, AllocatorConfig(per_process_memory_fraction=0.25),
                                 native=native)
    allocator.record_history(stacks=False)
    run_workload(allocator)  # 1 GiB allowed: the fraction, not the device, refuses it
    snap = allocator.snapshot()
    result = replay(snap)
    assert result.capacity == 4 * CAPACITY and result.outside > 0
    assert (result.num_ooms, result.peak_reserved) == (
        allocator.stats.num_ooms, allocator.stats.reserved_bytes.all.peak)
    assert replay(snap, "max_split_size_mb:64,per_process_memory_fraction:0.25").fits


def test_defaults_by_name_as_the_magic_takes_it() -> None:
    from jupyter_gpumem.whatif.compare import compare

    _, snap = recorded(True)
    shown = compare(snap, ["defaults", "max_split_size_mb:64"])
    assert [r.config for r in shown.results] == [AllocatorConfig(),
                                                 AllocatorConfig(max_split_size_mb=64)]
    assert replay(snap, " Defaults ").num_ooms == 1
    with pytest.raises(ValueError, match="expected key:value"):
        replay(snap, "defualts")
