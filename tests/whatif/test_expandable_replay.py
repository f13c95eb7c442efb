"""What-if replay and expandable segments: traces recorded under either setting replay under
either, on the C core's loop and the Python reference loop alike."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from expandable_workload import EXPANDABLE, growing_program, make, random_expandable

import jupyter_gpumem as gm
from jupyter_gpumem.data.sizes import MiB
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.engine.oom import OutOfMemoryError
from jupyter_gpumem.whatif.compare import suggest_config
from jupyter_gpumem.whatif.replay import ReplayResult, prepare, replay, run

CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not native_core_available(), reason="the C core is not built"))]
CAPACITY = 420 * MiB  # the growing program: OOM under the default policy, fits expandable


def recorded(config: AllocatorConfig, native: bool | None = None) -> tuple[dict, int]:
    """The growing program's trace under ``config``, and its recorded peak reserved."""
    a = make(native, CAPACITY, config)
    a.record_history()
    with contextlib.suppress(OutOfMemoryError):
        growing_program(a)
    return a.snapshot(), a.memory_stats()["reserved_bytes.all.peak"]


def both_loops(snap: dict, config: str | None) -> ReplayResult:
    """The replay on the C loop (when built), checked equal to the Python loop's."""
    prepared = prepare(snap)
    chosen = prepared.recorded if config is None else AllocatorConfig.parse(config)
    python = run(prepared.program, chosen, prepared.capacity, python_loop=True)
    if native_core_available():
        c = run(prepared.program, chosen, prepared.capacity, native=True)
        assert c.core == "C"
        assert np.array_equal(c.reserved, python.reserved)
        assert np.array_equal(c.allocated, python.allocated)
        assert (c.peak_reserved, c.num_ooms, c.first_oom, c.num_segments) == (
            python.peak_reserved, python.num_ooms, python.first_oom, python.num_segments)
        return c
    return python


@pytest.mark.parametrize("native", CORES)
def test_a_trace_recorded_expandable_replays_its_own_peak_exactly(native: bool) -> None:
    snap, peak = recorded(EXPANDABLE, native)
    assert any(e["action"] == "segment_map" for e in snap["device_traces"][0])
    result = both_loops(snap, None)
    assert result.config == EXPANDABLE and result.fits
    assert result.peak_reserved == peak
    # an expandable segment is not a segment of the counts (as PyTorch's segment.* stats)
    assert result.num_segments == result.peak_segments == 0
    assert replay(snap).peak_reserved == peak


def test_default_and_expandable_replay_into_each_other() -> None:
    classic_snap, classic_peak = recorded(AllocatorConfig())
    expandable_snap, _ = recorded(EXPANDABLE)
    # recorded under the default policy, it ran out of memory; expandable fits
    classic = both_loops(classic_snap, None)
    assert not classic.fits and classic.peak_reserved == classic_peak
    grown = both_loops(classic_snap, "expandable_segments:True")
    assert grown.fits and grown.peak_reserved < 0.8 * classic.peak_reserved
    assert gm.replay(classic_snap, "expandable_segments:True").peak_reserved == grown.peak_reserved
    assert grown.num_segments == 0 and classic.num_segments > 0
    # recorded expandable, replayed under the default policy: the default's own OOM comes back
    back = both_loops(expandable_snap, "expandable_segments:False")
    assert not back.fits and back.peak_reserved == classic_peak
    assert back.first_oom is not None


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_a_trace_starting_with_expandable_segments_rebuilds_them(seed: int) -> None:
    snap = random_expandable(seed, tail=100)
    prepared = prepare(snap)
    assert any(s["is_expandable"] for s in prepared.program.initial)
    for config in (None, "expandable_segments:False", "roundup_power2_divisions:4"):
        result = both_loops(snap, config)
        assert result.start_reserved == sum(s["total_size"] for s in prepared.program.initial)


def test_suggest_proposes_expandable_segments_when_it_fits_lowest() -> None:
    snap, _ = recorded(AllocatorConfig())
    found = suggest_config(snap)
    assert found.improves and found.changes == {"expandable_segments": True}
    assert found.best is not None
    assert found.best.peak_reserved == min(r.peak_reserved for r in found.tried if r.fits)
    assert found.config_line == "%gpumem config expandable_segments:True"
    assert ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True") in found.env_values()
