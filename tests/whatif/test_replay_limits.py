"""What a trace may ask of a replay: a bounded number of distinct streams (a small file can name
a million, and the policy keeps free blocks per pool and stream), and a start layout that fits
the replayed device. Each is refused with one line naming the limit, read where the replay
reads its input, before any work. How the replay scales is timed in
``bench/bench_replay_scale.py``, not here."""

from __future__ import annotations

from typing import Any

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem.cli import main
from jupyter_gpumem.data.files import save_snapshot
from jupyter_gpumem.data.sizes import MiB
from jupyter_gpumem.devices.simulated import SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.whatif import program
from jupyter_gpumem.whatif.compare import suggest_config
from jupyter_gpumem.whatif.program import ReplayLimitError


def on_streams(n: int) -> Any:
    """A trace of one small request on each of ``n`` streams, recorded."""
    a = CachingAllocator(SimulatedDevice(4 << 30), native=False)
    a.record_history(stacks=False)
    for s in range(n):
        a.free(a.malloc(512, s))
    return a.snapshot()


def test_a_trace_on_more_streams_than_the_limit_is_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program, "MAX_STREAMS", 8)
    assert gm.replay(on_streams(8)).peak_reserved == 8 * 2 * MiB
    snap = on_streams(9)
    for attempt in (lambda: gm.replay(snap), lambda: suggest_config(snap)):
        with pytest.raises(ReplayLimitError) as info:
            attempt()
        message = str(info.value)
        assert message == ("replay: the trace names 9 distinct streams, more than the 8 a "
                           "replay takes (MAX_STREAMS in jupyter_gpumem.whatif.program)")
        assert isinstance(info.value, ValueError) and "\n" not in message


def test_the_stream_limit_counts_the_segments_streams_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a = CachingAllocator(SimulatedDevice(4 << 30), native=False)
    for s in range(6):  # cached before the trace, each on its own stream
        a.free(a.malloc(512, s))
    a.record_history(stacks=False)
    for s in range(6, 9):
        a.free(a.malloc(512, s))
    monkeypatch.setattr(program, "MAX_STREAMS", 8)
    with pytest.raises(ReplayLimitError, match="names 9 distinct streams"):
        gm.replay(a.snapshot())


def test_the_cli_says_the_limit_for_a_file(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_snapshot(on_streams(9), tmp_path / "streams.json.gz")
    monkeypatch.setattr(program, "MAX_STREAMS", 8)
    assert main(["replay", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("replay: the trace names 9 distinct streams, more than the 8 a replay "
                        "takes (MAX_STREAMS in jupyter_gpumem.whatif.program)")
    assert len(err.splitlines()) == 1


def test_a_device_smaller_than_the_start_layout_is_refused_in_one_line() -> None:
    a = CachingAllocator(SimulatedDevice(512 * MiB), native=False)
    keep = a.malloc(60 * MiB)
    a.record_history(stacks=False)
    a.free(keep)
    with pytest.raises(ValueError) as info:
        gm.replay(a.snapshot(), capacity=50 * MiB)
    assert str(info.value) == (
        "replay: the segments at the trace's start hold 60.0 MiB, more than the 50.0 MiB the "
        "replayed device leaves the allocator (a larger capacity=)")
