"""``snapshot(mark=False)``: the tool's own views read the allocator without adding a
"snapshot" event to the user's history; the user's ``snapshot()`` still logs one, as PyTorch's
``_snapshot()`` does. Both cores."""

from __future__ import annotations

import os
from typing import Any

import pytest

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.devices.simulated import ManualClock
from jupyter_gpumem.engine.allocator import native_core_available

MiB = 1 << 20
#: The C core wherever it is built, and always under CI=true (a broken build fails, not skips).
WITH_C = native_core_available() or os.environ.get("CI") == "true"
CORES = [pytest.param(False, id="python"), pytest.param(True, id="c", marks=pytest.mark.skipif(
    not WITH_C, reason="the C core is not built"))]


def busy(native: bool, *, stacks: bool = False, max_entries: int = 100_000
         ) -> tuple[CachingAllocator, list[int]]:
    """An allocator recording history, with live and cached blocks and a few events."""
    a = CachingAllocator(SimulatedDevice(1 << 30, clock=ManualClock(tick_ns=1000)),
                         native=native)
    a.record_history(stacks=stacks, max_entries=max_entries)
    live = [a.malloc(n) for n in (3 * MiB, 512, 40 * MiB)]
    a.free(live.pop(1))
    return a, live


def actions(snap: Any) -> list[str]:
    return [e["action"] for e in snap["device_traces"][0]]


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("stacks", [False, True], ids=["events", "stacks"])
def test_an_unmarked_snapshot_records_nothing(native: bool, stacks: bool) -> None:
    a, live = busy(native, stacks=stacks)
    first = a.snapshot(mark=False)
    second = a.snapshot(mark=False)
    assert "snapshot" not in actions(first)
    assert first == second  # the second read sees no event the first one added
    for p in live:
        a.free(p)


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("stacks", [False, True], ids=["events", "stacks"])
def test_a_marked_snapshot_records_one_event_and_is_otherwise_the_same(
        native: bool, stacks: bool) -> None:
    a, live = busy(native, stacks=stacks)
    plain = a.snapshot(mark=False)
    marked = a.snapshot(mark=True)
    trace, marked_trace = plain["device_traces"][0], marked["device_traces"][0]
    assert len(marked_trace) == len(trace) + 1
    assert marked_trace[:-1] == trace
    event = marked_trace[-1]
    assert event["action"] == "snapshot"
    assert event["size"] == a.memory_stats()["allocated_bytes.all.current"]
    rest = {k: v for k, v in marked.items() if k != "device_traces"}
    assert rest == {k: v for k, v in plain.items() if k != "device_traces"}
    # the default marks, and the mark is recorded: a later unmarked read still shows it
    a.snapshot()
    assert actions(a.snapshot(mark=False))[-2:] == ["snapshot", "snapshot"]
    for p in live:
        a.free(p)


@pytest.mark.parametrize("native", CORES)
def test_an_unmarked_snapshot_drops_no_event_from_a_full_ring(native: bool) -> None:
    a, live = busy(native, max_entries=4)
    before = a.snapshot(mark=False)
    after = a.snapshot(mark=False)
    assert after["jupyter_gpumem"]["history_dropped"] == before["jupyter_gpumem"][
        "history_dropped"]
    assert after["device_traces"] == before["device_traces"]
    a.snapshot()
    assert a.snapshot(mark=False)["jupyter_gpumem"]["history_dropped"] == before[
        "jupyter_gpumem"]["history_dropped"] + 1
    for p in live:
        a.free(p)


@pytest.mark.parametrize("native", CORES)
def test_mark_means_nothing_while_history_is_off(native: bool) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), native=native)
    p = a.malloc(MiB)
    assert a.snapshot(mark=True) == a.snapshot(mark=False)
    assert a.snapshot()["device_traces"] == [[]]
    a.free(p)


@pytest.mark.parametrize("native", CORES)
@pytest.mark.parametrize("bad", [0, 1, "no", None])
def test_mark_must_be_a_bool(native: bool, bad: object) -> None:
    a, live = busy(native)
    before = a.snapshot(mark=False)
    with pytest.raises(TypeError, match="mark"):
        a.snapshot(mark=bad)  # type: ignore[arg-type]
    assert a.snapshot(mark=False) == before
    for p in live:
        a.free(p)
