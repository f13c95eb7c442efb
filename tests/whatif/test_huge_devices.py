"""What-if replay on devices near 2**63 B: the "unlimited" device of a trace that names no size,
expandable segments of many (stream, pool) pairs on it, and device sizes no core models
(Note [Sizes near 2**63] in ``engine/stats``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem import cli
from jupyter_gpumem.data.sizes import INT64_MAX, MiB
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.whatif.program import UNLIMITED
from jupyter_gpumem.whatif.replay import prepare, run

CORES = [False, pytest.param(True, marks=pytest.mark.skipif(
    not native_core_available(), reason="the C core is not built"))]


def ev(addr: int, size: int, stream: int, action: str = "alloc", **more: Any) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0,
            "frames": [], **more}


def three_pairs(streams: int = 2) -> dict[str, Any]:
    """Small and large requests on stream 0, small ones on the others: a (stream, pool) pair
    each, so an expandable replay reserves a virtual range per pair."""
    trace = [ev(1 << 21, 512, 0), ev(1 << 30, 30 << 20, 0)]
    trace += [ev((1 << 31) + (s << 21), 512, s) for s in range(1, streams)]
    return {"segments": [], "device_traces": [trace]}


@pytest.mark.parametrize("native", CORES)
def test_suggest_config_on_the_unlimited_device_with_three_stream_pool_pairs(
        native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GPUMEM_CORE", "c" if native else "python")
    snap = three_pairs()
    suggestion = gm.suggest_config(snap)
    assert suggestion.baseline.fits and suggestion.baseline.capacity == UNLIMITED
    assert all(r.fits for r in suggestion.tried)
    expandable = gm.replay(snap, "expandable_segments:True")
    # a 2 MiB page per small pair, two 20 MiB pages for 30 MiB
    assert (expandable.fits, expandable.peak_reserved) == (True, 44 * MiB)


def test_expandable_replays_of_many_pairs_agree_on_both_loops() -> None:
    prepared = prepare(three_pairs(streams=64))
    config = AllocatorConfig(expandable_segments=True)
    results = [run(prepared.program, config, prepared.capacity, native=False)]
    if native_core_available():
        results.append(run(prepared.program, config, prepared.capacity, native=True))
    for r in results:
        assert r.fits and r.peak_reserved == (64 * 2 + 40) * MiB
        assert r.reserved.tolist() == results[0].reserved.tolist()


@pytest.mark.parametrize("total", [INT64_MAX, 8_000_000 << 40])
def test_a_device_total_the_cores_model_replays(total: int) -> None:
    snap = dict(three_pairs(), jupyter_gpumem={"device_total": total})
    for config in (None, "expandable_segments:True", "per_process_memory_fraction:0.99"):
        result = gm.replay(snap, config)
        assert result.fits and result.capacity == total


def test_a_device_total_beyond_2_63_is_a_one_line_error_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = dict(three_pairs(), jupyter_gpumem={"device_total": 1 << 80})
    for call in (lambda: gm.replay(snap), lambda: gm.suggest_config(snap),
                 lambda: gm.replay(dict(snap, jupyter_gpumem={"devices": {"0": {
                     "device_total": 1 << 80}}}))):
        with pytest.raises(ValueError, match=r"^jupyter_gpumem\.(devices\['0'\]\.)?device_total"
                                             r": expected a non-negative integer below 2\*\*63, "
                                             r"got 1208925819614629174706176$"):
            call()
    path = tmp_path / "big.json"
    path.write_text(json.dumps(snap))
    for argv in (["render", str(path), "-o", str(tmp_path / "x.html")],
                 ["replay", str(path), "--suggest"], ["summary", str(path)]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert ("device_total: expected a non-negative integer below 2**63, got "
                "1208925819614629174706176") in err, err
    assert not (tmp_path / "x.html").exists()


def test_free_memory_recorded_near_2_63_replays_on_the_largest_device() -> None:
    # reserved bytes plus the device_free of an oom event pass 2**63 - 1: the largest device
    seg = {"device": 0, "address": 1 << 21, "total_size": 2 * MiB, "allocated_size": 512,
           "active_size": 512, "requested_size": 512, "stream": 0, "segment_type": "small",
           "blocks": [{"address": 1 << 21, "size": 512, "requested_size": 512,
                       "state": "active_allocated", "frames": []},
                      {"address": (1 << 21) + 512, "size": 2 * MiB - 512, "requested_size": 0,
                       "state": "inactive", "frames": []}]}
    snap = {"segments": [seg], "device_traces": [[ev(0, 30 << 20, 0, "oom",
                                                    device_free=INT64_MAX)]]}
    result = gm.replay(snap)
    assert result.capacity == INT64_MAX and result.fits
