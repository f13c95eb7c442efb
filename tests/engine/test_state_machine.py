"""A hypothesis state machine over the allocator: random requests, frees, cache releases,
streams and config changes, with the whole state checked against its own snapshot after every
step, and the recorded history replayed against snapshots taken along the way."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from jupyter_gpumem import (
    AllocatorConfig,
    CachingAllocator,
    ManualClock,
    OutOfMemoryError,
    SimulatedDevice,
    replay_segments,
)

KiB = 1 << 10
MiB = 1 << 20

# Sizes around every boundary of the policy: 512 B, 1 MiB, 10 MiB, 20 MiB and a max_split_size.
BOUNDARIES = [1, 512, 4 * KiB, MiB, 2 * MiB, 10 * MiB, 20 * MiB, 21 * MiB, 32 * MiB, 64 * MiB]
SIZES = st.one_of(
    st.builds(lambda b, d: max(1, b + d), st.sampled_from(BOUNDARIES),
              st.sampled_from([-513, -512, -511, -1, 0, 1, 511, 512, 513])),
    st.integers(1, 80 * MiB),
)
STREAMS = st.sampled_from([0, 0, 1, 7])
CONFIGS = st.builds(
    AllocatorConfig,
    max_split_size_mb=st.sampled_from([None, 21, 32, 64]),
    roundup_power2_divisions=st.sampled_from([None, None, 2, 4]),
    garbage_collection_threshold=st.sampled_from([None, 0.5, 0.8]),
    per_process_memory_fraction=st.sampled_from([None, 0.5, 0.9, 1.0]),
)

KNOBS = st.one_of(
    st.tuples(st.just("max_split_size_mb"), st.sampled_from([None, 21, 24, 40, 64])),
    st.tuples(st.just("roundup_power2_divisions"), st.sampled_from([None, 1, 2, 8])),
    st.tuples(st.just("garbage_collection_threshold"), st.sampled_from([None, 0.3, 0.6, 0.9])),
)


def check_against_snapshot(a: CachingAllocator) -> None:
    snap = a.snapshot()
    stats = a.memory_stats()
    segments = snap["segments"]
    ms = stats["max_split_size"]
    ms = ms if ms >= 0 else 1 << 62
    expect: dict[str, int] = {}
    for pool in ("all", "large_pool", "small_pool"):
        for name in ("allocation", "segment", "inactive_split", "allocated_bytes",
                     "reserved_bytes", "inactive_split_bytes", "requested_bytes"):
            expect[f"{name}.{pool}.current"] = 0
    live: list[tuple[int, int]] = []
    oversize_blocks = oversize_segments = 0
    for seg in segments:
        pools = ("all", "large_pool" if seg["segment_type"] == "large" else "small_pool")
        blocks = seg["blocks"]
        split = len(blocks) > 1
        assert sum(b["size"] for b in blocks) == seg["total_size"]
        cursor = seg["address"]
        oversize_segments += seg["total_size"] >= ms
        for left, right in itertools.pairwise(blocks):
            assert not (left["state"] == right["state"] == "inactive"), "free neighbours unmerged"
        for b in blocks:
            assert b["address"] == cursor, "blocks of a segment do not tile it"
            cursor += b["size"]
            for p in pools:
                if b["state"] == "active_allocated":
                    expect[f"allocation.{p}.current"] += 1
                    expect[f"allocated_bytes.{p}.current"] += b["size"]
                    expect[f"requested_bytes.{p}.current"] += b["requested_size"]
                elif split:
                    expect[f"inactive_split.{p}.current"] += 1
                    expect[f"inactive_split_bytes.{p}.current"] += b["size"]
            if b["state"] == "active_allocated":
                live.append((b["address"], b["address"] + b["size"]))
                oversize_blocks += b["size"] >= ms
        assert seg["allocated_size"] == sum(
            b["size"] for b in blocks if b["state"] == "active_allocated")
        for p in pools:
            expect[f"segment.{p}.current"] += 1
            expect[f"reserved_bytes.{p}.current"] += seg["total_size"]
    live.sort()
    for (_, end), (start, _) in itertools.pairwise(live):
        assert end <= start, "live blocks overlap"
    for key in list(expect):
        if key.startswith("allocation."):
            expect[key.replace("allocation.", "active.")] = expect[key]
        if key.startswith("allocated_bytes."):
            expect[key.replace("allocated_bytes.", "active_bytes.")] = expect[key]
    expect["oversize_allocations.current"] = oversize_blocks
    expect["oversize_segments.current"] = oversize_segments
    assert {k: stats[k] for k in expect} == expect
    assert a.memory_reserved() == sum(s["total_size"] for s in segments)
    assert a.device.used == a.memory_reserved()  # type: ignore[attr-defined]
    for key, value in stats.items():
        if key.endswith(".peak"):
            assert value >= stats[key[: -len("peak")] + "current"], key


class AllocatorMachine(RuleBasedStateMachine):
    blocks = Bundle("blocks")

    def __init__(self) -> None:
        super().__init__()
        self.device = SimulatedDevice(256 * MiB, clock=ManualClock(tick_ns=1000))
        self.a = CachingAllocator(self.device, debug=True)
        self.a.record_history(stacks=True, max_entries=1_000_000)
        self.taken: list[tuple[int, list[Any]]] = []
        self.live: set[int] = set()

    @rule(target=blocks, size=SIZES, stream=STREAMS)
    def alloc(self, size: int, stream: int) -> int:
        try:
            p = self.a.malloc(size, stream)
        except OutOfMemoryError:
            return 0
        assert p not in self.live, "an address handed out twice"
        self.live.add(p)
        return p

    @rule(p=consumes(blocks))
    def free(self, p: int) -> None:
        if p:
            self.live.remove(p)
        self.a.free(p)

    @rule()
    def empty_cache(self) -> None:
        self.a.empty_cache()

    @rule(config=CONFIGS)
    def set_config(self, config: AllocatorConfig) -> None:
        self.a.set_config(config)

    @rule(change=KNOBS)
    def change_one_knob(self, change: tuple[str, object]) -> None:
        # one knob mid-program, up or down (max_split_size below a cached piece included)
        key, value = change
        self.a.set_config(self.a.config.with_values(**{key: value}))

    @rule(fraction=st.sampled_from([None, 0.2, 0.5, 0.9, 1.0]))
    def set_memory_fraction(self, fraction: float | None) -> None:
        self.a.set_memory_fraction(fraction)

    @rule()
    def reset_peaks(self) -> None:
        self.a.reset_peak_memory_stats()

    @rule()
    def take_snapshot(self) -> None:
        snap = self.a.snapshot()
        self.taken.append((len(snap["device_traces"][0]), snap["segments"]))

    @invariant()
    def consistent(self) -> None:
        self.a.check_invariants()
        check_against_snapshot(self.a)

    def teardown(self) -> None:
        final = self.a.snapshot()
        for index, segments in self.taken:
            assert replay_segments(final, index) == segments, index
        assert replay_segments(final, 0) == []
        for p in self.live:
            self.a.free(p)
        self.a.empty_cache()
        assert self.a.memory_reserved() == 0
        assert self.device.live_segments() == {}


AllocatorMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorMachine = AllocatorMachine.TestCase
