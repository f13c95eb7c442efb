"""compare and suggest_config: the table's numbers are replay's, the search finds the config that
fits a fragmentation OOM, and bad input is refused."""

from __future__ import annotations

import copy
import itertools

import pytest
from bundle_checks import check_bundle
from fragmentation_workload import CAPACITY, MiB, run_workload

import jupyter_gpumem as gm
from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice
from jupyter_gpumem.whatif.compare import (
    ReplayComparison,
    Suggestion,
    compare,
    suggest_config,
    suggestion_grid,
)
from jupyter_gpumem.whatif.replay import prepare


@pytest.fixture
def fragmented():
    """The snapshot of the fragmentation workload: it ran out of memory under the defaults."""
    a = CachingAllocator(SimulatedDevice(CAPACITY))
    a.record_history(True, stacks=False, max_entries=1 << 16)
    y = run_workload(a)
    snap = a.snapshot()
    a.free(y)
    return snap


FIELDS = ("peak_reserved", "peak_allocated", "num_segments", "peak_segments",
          "num_alloc_retries", "num_ooms", "first_oom", "config", "capacity", "events")


def test_the_table_numbers_are_replays(fragmented) -> None:
    configs = ["max_split_size_mb:64", None, {"roundup_power2_divisions": 4},
               AllocatorConfig(max_split_size_mb=512)]
    before = copy.deepcopy(fragmented)
    cmp = gm.compare(fragmented, configs)
    assert isinstance(cmp, ReplayComparison)
    assert fragmented == before  # the trace is read, not changed
    assert len(cmp.results) == 4
    for config, result in zip(configs, cmp.results, strict=True):
        direct = gm.replay(fragmented, config)
        for name in FIELDS:
            assert getattr(result, name) == getattr(direct, name), name
        assert (result.reserved == direct.reserved).all()
        assert (result.allocated == direct.allocated).all()
    defaults, split64 = cmp.results[1], cmp.results[0]
    assert not defaults.fits and defaults.first_oom is not None
    assert split64.fits and split64.peak_reserved == 700 * MiB
    rows = cmp.table().rows
    assert rows[0] == ("max_split_size_mb:64", "700 MiB", "700 MiB", "2", "2", "0", "0", "-",
                       "yes")
    assert rows[1] == ("defaults (recorded)", "600 MiB", "600 MiB", "1", "1", "1", "1",
                       f"#{defaults.first_oom}", "no")


def test_no_configs_compares_the_recorded_one_with_the_default_grid(fragmented) -> None:
    cmp = compare(fragmented)
    labels = [row.label for row in cmp.rows()]
    assert labels == ["defaults (recorded)", "max_split_size_mb:64", "max_split_size_mb:128",
                      "max_split_size_mb:256", "max_split_size_mb:512",
                      "roundup_power2_divisions:4", "roundup_power2_divisions:8",
                      "roundup_power2_divisions:16", "expandable_segments:True"]


def test_bundle_is_a_table_and_one_picture_with_words(fragmented) -> None:
    cmp = compare(fragmented, ["max_split_size_mb:128", None])
    bundle = cmp._repr_mimebundle_()
    check_bundle(bundle)
    text = bundle["text/plain"]
    assert text.splitlines()[0] == (
        f"gpumem replay: {cmp.events} events under 2 configs, on a device of 1.0 GiB")
    assert "<table" in bundle["text/html"]
    assert "max_split_size_mb:128 peaks at 700 MiB reserved (fits)" in cmp.alt()
    assert "defaults (recorded) peaks at 600 MiB reserved (1 out-of-memory error" in cmp.alt()
    assert repr(cmp) == text
    check_bundle(suggest_config(fragmented)._repr_mimebundle_())


def test_suggest_finds_the_config_that_fits(fragmented) -> None:
    found = gm.suggest_config(fragmented)
    assert isinstance(found, Suggestion)
    assert found.complete and len(found.tried) == found.grid_size == 24
    assert not found.baseline.fits
    assert found.best is not None and found.best.fits and found.improves
    # the lowest peak among the fitting ones; ties to the fewest changed keys, then the first
    fitting = [r for r in found.tried if r.fits]
    assert found.best.peak_reserved == min(r.peak_reserved for r in fitting) == 700 * MiB
    assert found.changes == {"max_split_size_mb": 64}
    assert found.config_line == "%gpumem config max_split_size_mb:64"
    assert found.env_values() == [("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
                                  ("JUPYTER_GPUMEM_ALLOC_CONF", "max_split_size_mb:64")]
    # what the recorded config needs, replayed where nothing is refused
    assert found.baseline_need == gm.replay(fragmented, capacity=1 << 40).peak_reserved
    assert found.lines()[0] == (
        "gpumem replay --suggest: max_split_size_mb:64 would have fit: peak reserved 700 MiB "
        f"instead of the 1.2 GiB it needs (the recorded config fails at event "
        f"{found.baseline.first_oom}); 24 of 24 configs tried, 20 fit.")
    # and it does fit when run again under it
    a = CachingAllocator(SimulatedDevice(CAPACITY), found.best.config)
    a.free(a.malloc(600 * MiB))
    y = a.malloc(100 * MiB)
    z = a.malloc(600 * MiB)
    assert a.stats.reserved_bytes.all.peak == 700 * MiB
    a.free(y)
    a.free(z)


def test_when_nothing_fits_nothing_is_proposed(fragmented) -> None:
    found = suggest_config(fragmented, capacity=650 * MiB)
    assert found.best is None and not found.improves and found.config_line == ""
    assert found.lines()[0].startswith("gpumem replay --suggest: no config tried avoids the "
                                       "out-of-memory error (24 of 24 configs tried)")


def test_the_time_budget_stops_the_search(fragmented) -> None:
    ticks = itertools.count()

    def clock() -> float:  # each read half a second later
        return next(ticks) * 0.5

    found = suggest_config(fragmented, budget_s=2.0, clock=clock)
    # 0 s: the recorded config (always), read at 0.5 s; 1.0 s + 0.5 s fits in 2 s: one more;
    # 2.0 s + 0.5 s does not
    assert len(found.tried) == 2 and not found.complete
    assert "2 of 24 configs tried (stopped by the time budget)" in found.lines()[0]
    ticks = itertools.count()
    assert len(suggest_config(fragmented, budget_s=0.0, clock=clock).tried) == 1


def test_the_grid() -> None:
    grid = suggestion_grid(AllocatorConfig())
    assert grid[0] == AllocatorConfig() and len(grid) == 24 and len(set(grid)) == 24
    assert grid[1:5] == [AllocatorConfig(max_split_size_mb=m) for m in (64, 128, 256, 512)]
    # expandable segments alone after the other single changes, then with each rounding
    on = AllocatorConfig(expandable_segments=True)
    assert grid[8] == on
    assert [c for c in grid if c.expandable_segments] == [on] + [
        on.with_values(roundup_power2_divisions=d) for d in (4, 8, 16)]
    # recorded with it on: the grid tries it off
    off = suggestion_grid(on)
    assert off[0] == on and AllocatorConfig() in off and len(off) == 24
    # garbage collection only with a memory fraction
    assert all(c.garbage_collection_threshold is None for c in grid)
    capped = suggestion_grid(AllocatorConfig(per_process_memory_fraction=0.5))
    assert len(capped) == 64
    assert {c.garbage_collection_threshold for c in capped} == {None, 0.6, 0.8}
    assert all(c.per_process_memory_fraction == 0.5 for c in capped)


def test_a_prepared_trace_is_read_once(fragmented) -> None:
    prepared = prepare(fragmented)
    assert compare(prepared, ["max_split_size_mb:64"]).results[0].peak_reserved == 700 * MiB


@pytest.mark.parametrize(("configs", "error"), [
    ("max_split_size_mb:64", TypeError), ([42], TypeError), (["max_split_size_mb:10"], ValueError),
    (["bogus:1"], ValueError), ([{"nope": 1}], ValueError),
])
def test_bad_configs(fragmented, configs, error) -> None:
    with pytest.raises(error):
        compare(fragmented, configs)


def test_bad_budget_and_capacity(fragmented) -> None:
    with pytest.raises(ValueError):
        suggest_config(fragmented, budget_s=-1)
    with pytest.raises(ValueError):
        compare(fragmented, capacity=0)
