"""Replay is faithful on traces recorded on an NVIDIA H200 (``bench/record_fixtures.py``).

Each trace, replayed under the config it was recorded with, gives the peak reserved bytes,
segments, OOMs and retries that the allocator itself counted when it ran: ours from the stats
saved in the trace, PyTorch's from ``torch.cuda.memory_stats()`` saved beside its pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

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
