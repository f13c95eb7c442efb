"""Replay is faithful on traces recorded on an NVIDIA H200 (``bench/record_fixtures.py``).

Each trace, replayed under the config it was recorded with, gives the peak reserved bytes,
segments, OOMs and retries that the allocator itself counted when it ran: ours from the stats
saved in the trace, PyTorch's from ``torch.cuda.memory_stats()`` saved beside its pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem.data.files import load_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"


def _counted(stats: dict[str, int]) -> dict[str, int]:
    return {"peak_reserved": stats["reserved_bytes.all.peak"],
            "num_segments": stats["segment.all.current"],
            "peak_segments": stats["segment.all.peak"],
            "num_ooms": stats["num_ooms"], "num_alloc_retries": stats["num_alloc_retries"]}


def _replayed(result: gm.ReplayResult) -> dict[str, int]:
    return {k: getattr(result, k) for k in ("peak_reserved", "num_segments", "peak_segments",
                                            "num_ooms", "num_alloc_retries")}


def test_our_cupy_trace_replays_to_what_our_allocator_counted() -> None:
    snapshot = load_snapshot(FIXTURES / "cupy_trace.json.gz")
    result = gm.replay(snapshot)
    assert _replayed(result) == _counted(snapshot["jupyter_gpumem"]["stats"])
    assert not result.inferred_empty_cache  # ours records every call
    assert result.empty_cache_calls == len(snapshot["jupyter_gpumem"]["empty_cache"])


def test_a_pytorch_pickle_replays_to_what_pytorch_counted() -> None:
    side = json.loads((FIXTURES / "torch_snapshot.json").read_text())
    snapshot = load_snapshot(FIXTURES / "torch_snapshot.pickle")
    result = gm.replay(snapshot, capacity=side["device_total"],
                       memory_fraction=side["per_process_memory_fraction"])
    assert _replayed(result) == _counted(side["memory_stats"])
    assert result.inferred_empty_cache
    assert any("inferred" in note for note in result.notes)


def test_another_config_changes_the_replay_of_a_recorded_trace() -> None:
    snapshot = load_snapshot(FIXTURES / "cupy_trace.json.gz")
    recorded = gm.replay(snapshot)
    other = gm.replay(snapshot, "max_split_size_mb:1024")
    assert other.config != recorded.config
    assert other.peak_reserved != recorded.peak_reserved or other.num_ooms != recorded.num_ooms


# -- the same program recorded under other configs ---------------------------------------------
# ``bench/record_fixtures.py`` runs one program under each config and names the files of every
# config but the first (``max_split_size_mb:64``, the files above) by the config: "default"
# (no setting) and "rp4" (``roundup_power2_divisions:4``). The first config's trace, replayed
# under another config, gives what the allocator counted when the program ran under that one.

OTHER_CONFIGS = ("default", "rp4")


def _recorded(*names: str) -> None:
    missing = [n for n in names if not (FIXTURES / n).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not recorded yet (bench/record_fixtures.py on a GPU "
                    "writes them)")


@pytest.mark.parametrize("name", OTHER_CONFIGS)
def test_our_trace_replays_under_another_config_to_that_run(name: str) -> None:
    _recorded(f"cupy_trace_{name}.json.gz")
    other = load_snapshot(FIXTURES / f"cupy_trace_{name}.json.gz")
    trace = load_snapshot(FIXTURES / "cupy_trace.json.gz")
    config = other["jupyter_gpumem"]["config"]  # with the memory fraction
    assert config != trace["jupyter_gpumem"]["config"]
    result = gm.replay(trace, config)
    assert _replayed(result) == _counted(other["jupyter_gpumem"]["stats"])
    assert _replayed(gm.replay(other)) == _counted(other["jupyter_gpumem"]["stats"])


@pytest.mark.parametrize("name", OTHER_CONFIGS)
def test_a_pytorch_pickle_replays_under_another_config_to_that_run(name: str) -> None:
    _recorded(f"torch_snapshot_{name}.pickle", f"torch_snapshot_{name}.json")
    side = json.loads((FIXTURES / "torch_snapshot.json").read_text())
    other_side = json.loads((FIXTURES / f"torch_snapshot_{name}.json").read_text())
    assert other_side["PYTORCH_CUDA_ALLOC_CONF"] != side["PYTORCH_CUDA_ALLOC_CONF"]
    trace = load_snapshot(FIXTURES / "torch_snapshot.pickle")
    result = gm.replay(trace, other_side["PYTORCH_CUDA_ALLOC_CONF"],
                       capacity=side["device_total"],
                       memory_fraction=side["per_process_memory_fraction"])
    assert _replayed(result) == _counted(other_side["memory_stats"])
    # and that run's own pickle under the config it says (allocator_settings)
    other = load_snapshot(FIXTURES / f"torch_snapshot_{name}.pickle")
    own = gm.replay(other, capacity=other_side["device_total"],
                    memory_fraction=other_side["per_process_memory_fraction"])
    assert _replayed(own) == _counted(other_side["memory_stats"])


def test_pytorch_2_11_settings_give_the_recorded_divisions() -> None:
    # PyTorch 2.11 writes roundup_power2_divisions as {"1": d, "2": d, ...} (by interval)
    snapshot = load_snapshot(FIXTURES / "torch_snapshot.pickle")
    side = json.loads((FIXTURES / "torch_snapshot.json").read_text())
    settings = snapshot["allocator_settings"]
    assert isinstance(settings["roundup_power2_divisions"], dict)
    settings["roundup_power2_divisions"] = dict.fromkeys(settings["roundup_power2_divisions"], 4)
    result = gm.replay(snapshot, capacity=side["device_total"],
                       memory_fraction=side["per_process_memory_fraction"])
    assert result.config.roundup_power2_divisions == 4
    assert result.config.max_split_size_mb == 64


def test_the_recording_script_in_its_dry_run(tmp_path, monkeypatch, capsys) -> None:
    """``bench/record_fixtures.py --dry-run`` (our allocator and the fake PyTorch stand in for
    the GPU) writes every config's files, small and with no absolute path, and the tests above
    pass on them."""
    import sys

    from script_module import load_script

    module = load_script(Path(__file__).resolve().parents[2] / "bench" / "record_fixtures.py")
    root = str(module.ROOT)
    assert module.portable(root + "/bench/record_fixtures.py") == "bench/record_fixtures.py"
    assert (module.portable("/x/venv/lib/python3.12/site-packages/torch/cuda/memory.py")
            == "site-packages/torch/cuda/memory.py")
    assert module.portable("/usr/lib/python3.12/runpy.py") == "lib/python3.12/runpy.py"
    assert module.portable("<frozen runpy>") == "<frozen runpy>"
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert module.main([str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "0 failed" in out
    monkeypatch.setattr(sys.modules[__name__], "FIXTURES", tmp_path)
    for name in OTHER_CONFIGS:
        test_our_trace_replays_under_another_config_to_that_run(name)
        test_a_pytorch_pickle_replays_under_another_config_to_that_run(name)
    test_our_cupy_trace_replays_to_what_our_allocator_counted()
    test_a_pytorch_pickle_replays_to_what_pytorch_counted()
