"""Replay: under its own config a trace gives back what was recorded; under another config, what
the same program gives when run under it. Programs are random, recorded on the simulated device
with both cores, with empty_cache calls, OOMs, the retry ladder, garbage collection and
max_split_size."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import jupyter_gpumem as gm
from jupyter_gpumem import (
    AllocatorConfig,
    CachingAllocator,
    OutOfMemoryError,
    SimulatedDevice,
    replay_segments,
)
from jupyter_gpumem.data.columns import plain_snapshot
from jupyter_gpumem.engine.allocator import CORE_ENV, native_core_available
from jupyter_gpumem.whatif.program import build_program
from jupyter_gpumem.whatif.replay import ReplayResult, replay, run

MiB = 1 << 20
CAPACITY = 256 * MiB
CORES = [False, True] if native_core_available() else [False]

# -- programs ----------------------------------------------------------------------------------

Op = tuple[Any, ...]


@dataclass
class Outcome:
    """What running a program did: the allocator, and which ops failed."""

    allocator: CachingAllocator
    failed_allocs: set[int] = field(default_factory=set)  # op indexes of failed allocs
    first_failed_op: int | None = None
    event_of_op: dict[int, int] = field(default_factory=dict)  # op -> its alloc/oom event


def run_program(ops: list[Op], config: AllocatorConfig, *, native: bool, record_from: int = 0,
                capacity: int = CAPACITY) -> Outcome:
    """Run ``ops``; history (and the peaks) start at op ``record_from``. An alloc that fails
    leaves its slot empty, and its free is skipped; a probe frees its block at once."""
    a = CachingAllocator(SimulatedDevice(capacity), config, native=native)
    out = Outcome(a)
    live: dict[int, int] = {}
    for k, op in enumerate(ops):
        if k == record_from:
            a.record_history(stacks=False, max_entries=1 << 20)
            a.reset_peak_memory_stats()
            a.reset_accumulated_memory_stats()
        kind = op[0]
        if kind in ("alloc", "probe"):
            _, slot, size, stream = op
            try:
                ptr = a.malloc(size, stream)
            except OutOfMemoryError:
                ptr = 0
                out.failed_allocs.add(k)
                if out.first_failed_op is None and k >= record_from:
                    out.first_failed_op = k
            if a.recording:
                info = a._core.history_info()
                out.event_of_op[k] = info[3] + info[4] - 1
            if kind == "alloc" and ptr:
                live[slot] = ptr
            elif ptr:
                a.free(ptr)
        elif kind == "free":
            ptr = live.pop(op[1], 0)
            if ptr:
                a.free(ptr)
        else:
            a.empty_cache()
    if record_from >= len(ops):
        a.record_history(stacks=False)
        a.reset_peak_memory_stats()
        a.reset_accumulated_memory_stats()
    return out


sizes = st.one_of(
    st.integers(1, 1 * MiB),  # small pool
    st.integers(1 * MiB + 1, 10 * MiB),  # 20 MiB segments
    st.integers(10 * MiB, 48 * MiB),  # own segments, oversize under a small max_split
)


@st.composite
def programs(draw: st.DrawFn, max_ops: int = 60) -> list[Op]:
    ops: list[Op] = []
    slots: list[int] = []
    for k in range(draw(st.integers(1, max_ops))):
        choice = draw(st.sampled_from("aaaaffffep"))
        stream = draw(st.sampled_from([0, 0, 0, 7]))
        if choice == "a":
            ops.append(("alloc", k, draw(sizes), stream))
            slots.append(k)
        elif choice == "f" and slots:
            ops.append(("free", slots.pop(draw(st.integers(0, len(slots) - 1)))))
        elif choice == "e":
            ops.append(("empty_cache",))
        elif choice == "p":
            ops.append(("probe", k, draw(st.integers(40 * MiB, 300 * MiB)), stream))
    return ops


configs = st.builds(
    AllocatorConfig,
    max_split_size_mb=st.sampled_from([None, None, 21, 32, 64]),
    roundup_power2_divisions=st.sampled_from([None, None, 2, 4, 8]),
    per_process_memory_fraction=st.sampled_from([None, None, 0.5, 0.75, 0.9]),
    garbage_collection_threshold=st.sampled_from([None, None, 0.4, 0.8]),
    expandable_segments=st.sampled_from([False, True]),
)


def segment_sizes(a: CachingAllocator) -> list[int]:
    return [seg.size for seg in sorted(a.state().segments, key=lambda s: s.address)]


def layout(segments: list[Any]) -> list[tuple[Any, ...]]:
    return [(s["address"], s["total_size"], s["stream"], s["segment_type"],
             [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in segments]


def result_fields(r: ReplayResult) -> tuple[Any, ...]:
    return (r.peak_reserved, r.peak_allocated, r.num_segments, r.peak_segments,
            r.num_alloc_retries, r.num_ooms, r.first_oom)


@pytest.fixture(params=["c", "python"])
def replay_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and not native_core_available():
        pytest.skip("the C core is not built")
    monkeypatch.setenv(CORE_ENV, request.param)
    return str(request.param)


# -- under its own config -----------------------------------------------------------------------


@pytest.mark.parametrize("native", CORES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(ops=programs(), config=configs, data=st.data())
def test_replay_under_the_recorded_config_gives_back_the_recording(
        native: bool, replay_core: str, ops: list[Op], config: AllocatorConfig,
        data: st.DataObject) -> None:
    # A trace may start after memory was allocated, except under garbage collection, whose
    # block ages before the trace are not recorded.
    start = 0 if config.garbage_collection_threshold else data.draw(st.integers(0, len(ops)))
    out = run_program(ops, config, native=native, record_from=start)
    a = out.allocator
    st_ = a.stats
    snap = a.snapshot()
    # the start layout, found by first events, is the one data.replay rebuilds event by event
    initial = build_program(snap, None, config, CAPACITY).initial
    assert layout(initial) == layout(replay_segments(snap, 0))
    r = replay(snap)
    assert r.config == config and r.core == replay_core.replace("c", "C").replace(
        "python", "Python")
    assert r.peak_reserved == st_.reserved_bytes.all.peak
    assert r.num_segments == st_.segment.all.current
    assert r.peak_segments == st_.segment.all.peak
    assert r.peak_allocated == st_.allocated_bytes.all.peak
    assert (r.num_alloc_retries, r.num_ooms) == (st_.num_alloc_retries, st_.num_ooms)
    assert r.first_oom == (None if out.first_failed_op is None
                           else out.event_of_op[out.first_failed_op])
    assert not r.inferred_empty_cache and r.unmatched_frees == 0
    assert r.reserved[-1] == a.memory_reserved() if len(r.reserved) else True
    np.testing.assert_array_equal(r.fragmentation, r.reserved - r.allocated)


# -- under another config -----------------------------------------------------------------------


@pytest.mark.parametrize("native", CORES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(ops=programs(), a_config=configs, b_config=configs)
def test_replay_under_another_config_is_the_program_run_under_it(
        native: bool, replay_core: str, ops: list[Op], a_config: AllocatorConfig,
        b_config: AllocatorConfig) -> None:
    recorded = run_program(ops, a_config, native=native)
    direct = run_program(ops, b_config, native=native)
    # The replay cannot know what the program did with a block it never got: an allocation
    # that failed under A (other than a probe, freed at once) must fail under B too.
    normal_failed = {k for k in recorded.failed_allocs if ops[k][0] == "alloc"}
    assume(normal_failed <= direct.failed_allocs)
    r = replay(recorded.allocator.snapshot(), b_config)
    st_ = direct.allocator.stats
    assert r.peak_reserved == st_.reserved_bytes.all.peak
    assert r.num_segments == st_.segment.all.current
    assert (r.num_alloc_retries, r.num_ooms) == (st_.num_alloc_retries, st_.num_ooms)
    assert r.first_oom == (None if direct.first_failed_op is None
                           else recorded.event_of_op[direct.first_failed_op])


def test_config_forms_and_memory_fraction() -> None:
    out = run_program([("alloc", 0, 30 * MiB, 0), ("free", 0), ("alloc", 2, 50 * MiB, 0)],
                      AllocatorConfig(), native=False)
    snap = out.allocator.snapshot()
    by_text = replay(snap, "max_split_size_mb:21,per_process_memory_fraction:0.25")
    by_dict = replay(snap, {"max_split_size_mb": 21}, memory_fraction=0.25)
    assert by_text.config == by_dict.config == AllocatorConfig(21, None, None, 0.25)
    assert result_fields(by_text) == result_fields(by_dict)
    # 64 MiB cap: the 30 MiB segment must go before the 50 MiB one fits
    assert by_text.num_ooms == 0 and by_text.peak_reserved == 50 * MiB
    small = replay(snap, capacity=64 * MiB)
    assert small.capacity == 64 * MiB and small.num_alloc_retries == 1
    with pytest.raises(ValueError):
        replay(snap, "max_split_size_mb:5")
    with pytest.raises(TypeError):
        replay(snap, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        replay(snap, capacity=0)
    with pytest.raises(TypeError):
        replay(42)  # type: ignore[arg-type]


def test_replay_reads_a_file_and_is_exported_lazily(tmp_path: Any) -> None:
    out = run_program([("alloc", 0, 3 * MiB, 0), ("empty_cache",), ("free", 0),
                       ("empty_cache",)], AllocatorConfig(), native=False)
    path = gm.save_snapshot(out.allocator.snapshot(), tmp_path / "t.json.gz")
    r = gm.replay(path)
    assert isinstance(r, gm.ReplayResult)
    assert (r.peak_reserved, r.num_segments, r.empty_cache_calls) == (20 * MiB, 0, 2)
    # segment events are the recorded policy's: the replay gets its segment at the alloc
    assert r.reserved.tolist() == [0, 20 * MiB, 20 * MiB, 20 * MiB, 0, 0]


# -- the C loop and the Python loop -------------------------------------------------------------


@pytest.mark.skipif(not native_core_available(), reason="the C core is not built")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=programs(), a_config=configs, b_config=configs)
def test_the_c_loop_is_the_python_loop(ops: list[Op], a_config: AllocatorConfig,
                                       b_config: AllocatorConfig) -> None:
    snap = run_program(ops, a_config, native=True).allocator.snapshot()
    program = build_program(snap, None, a_config, CAPACITY)
    results = [run(program, b_config, CAPACITY, native=native, python_loop=loop)
               for native, loop in ((True, False), (True, True), (False, False))]
    assert [r.core for r in results] == ["C", "Python", "Python"]
    for r in results[1:]:
        assert result_fields(r) == result_fields(results[0])
        np.testing.assert_array_equal(r.reserved, results[0].reserved)
        np.testing.assert_array_equal(r.allocated, results[0].allocated)
        assert r.unmatched_frees == results[0].unmatched_frees


# -- PyTorch traces: no empty_cache list ---------------------------------------------------------


def as_pytorch(snapshot: Any) -> Any:
    """Our snapshot as PyTorch writes it: no extension field, no keys of ours on events."""
    snap = copy.deepcopy(plain_snapshot(snapshot))  # PyTorch's traces are lists of dicts
    del snap["jupyter_gpumem"], snap["schema"]
    for trace in snap["device_traces"]:
        for e in trace:
            for key in ("reason", "requested_size", "block_size", "cell"):
                e.pop(key, None)
    return snap


@pytest.mark.parametrize("native", CORES)
def test_empty_cache_is_inferred_in_a_pytorch_trace(native: bool) -> None:
    ops: list[Op] = [("alloc", 0, 30 * MiB, 0), ("alloc", 1, 3 * MiB, 0), ("free", 0),
                     ("empty_cache",), ("alloc", 2, 12 * MiB, 0), ("free", 1), ("free", 2),
                     ("empty_cache",)]
    out = run_program(ops, AllocatorConfig(), native=native)
    ours = replay(out.allocator.snapshot())
    theirs = replay(as_pytorch(out.allocator.snapshot()), capacity=CAPACITY)
    assert theirs.inferred_empty_cache and not ours.inferred_empty_cache
    assert theirs.empty_cache_calls == 2 and ours.empty_cache_calls == 2
    assert result_fields(theirs) == result_fields(ours)
    assert any("inferred" in note for note in theirs.notes)
    assert any("config" in note for note in theirs.notes)
    unlimited = replay(as_pytorch(out.allocator.snapshot()))
    assert any("capacity=" in note for note in unlimited.notes)


@pytest.mark.parametrize("native", CORES)
def test_releases_of_the_retry_ladder_are_not_taken_for_empty_cache(native: bool) -> None:
    config = AllocatorConfig(per_process_memory_fraction=0.25)  # a 64 MiB cap
    ops: list[Op] = [("alloc", 0, 30 * MiB, 0), ("free", 0), ("alloc", 1, 50 * MiB, 0),
                     ("probe", 2, 100 * MiB, 0)]
    out = run_program(ops, config, native=native)
    assert out.allocator.stats.num_alloc_retries == 2
    snap = as_pytorch(out.allocator.snapshot())
    r = replay(snap, config, capacity=CAPACITY)
    assert r.inferred_empty_cache and r.empty_cache_calls == 0
    assert (r.num_alloc_retries, r.num_ooms, r.peak_reserved) == (2, 1, 50 * MiB)
    assert any("rounded size" in note for note in r.notes)


def test_a_pytorch_oom_without_requested_size_replays_the_rounded_size() -> None:
    out = run_program([("probe", 0, 300 * MiB + 1, 0)], AllocatorConfig(), native=False)
    r = replay(as_pytorch(out.allocator.snapshot()), capacity=CAPACITY)
    assert r.first_oom == 0 and r.num_ooms == 1


# -- the start layout ---------------------------------------------------------------------------


@pytest.mark.parametrize("native", CORES)
def test_a_trace_that_starts_late_starts_from_the_recorded_layout(native: bool) -> None:
    ops: list[Op] = [("alloc", 0, 512, 0), ("alloc", 1, 700_000, 0), ("alloc", 2, 512, 0),
                     ("alloc", 3, 30 * MiB, 7), ("alloc", 4, 2 * MiB, 0),
                     ("alloc", 5, 3 * MiB, 0), ("free", 1), ("free", 4),
                     ("alloc", 6, 600_000, 0), ("alloc", 7, 2 * MiB, 0), ("free", 0),
                     ("empty_cache",), ("free", 3)]
    out = run_program(ops, AllocatorConfig(), native=native, record_from=6)
    snap = out.allocator.snapshot()
    r = replay(snap)
    assert r.start_reserved == 2 * MiB + 30 * MiB + 20 * MiB
    assert r.start_allocated == 512 * 2 + 700_416 + 30 * MiB + 2 * MiB + 3 * MiB
    assert r.num_segments == len(segment_sizes(out.allocator))
    assert r.peak_reserved == out.allocator.stats.reserved_bytes.all.peak


def test_a_layout_the_policy_cannot_make_is_refused() -> None:
    snap: Any = {"segments": [{"address": 1 << 30, "total_size": 4 * MiB, "stream": 0,
                          "segment_type": "small",
                          "blocks": [{"address": 1 << 30, "size": 4 * MiB,
                                      "state": "inactive"}]}],
            "device_traces": [[]]}
    with pytest.raises(ValueError, match="small-pool segment"):
        replay(snap, capacity=CAPACITY)
    snap["segments"][0]["segment_type"] = "large"
    with pytest.raises(ValueError, match="large-pool segment"):
        replay(snap, capacity=CAPACITY)


def test_a_dict_is_checked_when_it_cannot_be_read() -> None:
    from jupyter_gpumem.data.schema import SchemaError

    out = run_program([("alloc", 0, 3 * MiB, 0), ("free", 0)], AllocatorConfig(), native=False)
    snap = plain_snapshot(out.allocator.snapshot())  # a dict as a file gives it
    for e in snap["device_traces"][0]:
        del e["stream"]  # as older PyTorch versions write it: the check fills it in
    assert replay(snap).peak_reserved == 20 * MiB
    snap["device_traces"][0][1]["size"] = "big"
    with pytest.raises(SchemaError, match=r"device_traces\[0\]\[1\]\.size"):
        replay(snap)
