"""The built-in sources: our allocator and PyTorch's (a fake ``torch.cuda.memory``) read one way;
the cell peak rule from counters (Note [Cell peak from counters])."""

from __future__ import annotations

import sys

import pytest
from fake_torch import FakeTorchMemory

from jupyter_gpumem import sources
from jupyter_gpumem.sources.cupy import CupySource
from jupyter_gpumem.sources.torch import TorchSource

MiB = 1 << 20


@pytest.fixture
def fake() -> FakeTorchMemory:
    return FakeTorchMemory()


def test_torch_source_reads_the_module(fake) -> None:
    src = TorchSource(fake)
    x = fake.empty(3 * MiB)
    assert src.name == "torch"
    assert (src.device_index, src.device_name) == (0, "Fake H200")
    assert src.memory_stats() == fake.memory_stats()
    assert src.memory_allocated() == fake.memory_allocated() == 3 * MiB
    assert src.memory_reserved() == fake.memory_reserved() == 20 * MiB
    assert src.mem_get_info() == fake.mem_get_info()
    assert [s["total_size"] for s in src.snapshot()["segments"]] == [20 * MiB]
    assert src.oom_errors == (fake.OutOfMemoryError,)
    assert src.memory_summary().startswith("|====")
    assert "Allocated memory" in src.memory_summary()
    del x


def test_allocator_source_is_the_allocator(allocator) -> None:
    src = CupySource(allocator)
    p = allocator.malloc(5 * MiB)
    assert src.memory_stats() == allocator.memory_stats()
    assert (src.memory_allocated(), src.memory_reserved()) == (5 * MiB, 20 * MiB)
    mark = src.start_cell(4)
    assert allocator.current_cell == 4  # history events carry the running cell
    q = allocator.malloc(7 * MiB)
    allocator.free(q)
    end = src.end_cell(mark)
    assert (end.peak.bytes, end.peak.how) == (12 * MiB, "watermark")
    assert allocator.current_cell != 4
    allocator.free(p)


def test_cell_peak_from_the_counter_when_the_cell_passes_the_peak(fake) -> None:
    src = TorchSource(fake)
    a = fake.empty(4 * MiB)
    del a  # the peak is 4 MiB before the cell
    mark = src.start_cell(1)
    b = fake.empty(6 * MiB)
    del b
    peak = src.cell_peak(mark)
    assert (peak.bytes, peak.exact, peak.how) == (6 * MiB, True, "counter")
    assert fake.peak_resets == 0  # the user's peak is theirs
    assert fake.max_memory_allocated() == 6 * MiB


def test_cell_peak_below_the_old_peak_is_a_bound_without_history(fake) -> None:
    src = TorchSource(fake)
    a = fake.empty(8 * MiB)
    del a
    mark = src.start_cell(1)
    b = fake.empty(2 * MiB)
    del b
    peak = src.cell_peak(mark)
    assert (peak.bytes, peak.exact, peak.how) == (8 * MiB, False, "bound")
    assert peak.text(lambda n: f"{n // MiB} MiB") == "≤ 8 MiB"


def test_cell_peak_below_the_old_peak_from_history(fake) -> None:
    src = TorchSource(fake)
    fake._record_memory_history("all", stacks="python")
    a = fake.empty(8 * MiB)
    del a
    mark = src.start_cell(1)
    b = fake.empty(2 * MiB)
    c = fake.empty(1 * MiB)
    del b, c
    peak = src.cell_peak(mark)
    assert (peak.bytes, peak.exact, peak.how) == (3 * MiB, True, "history")
    fake._record_memory_history(None)


def test_cell_peak_when_nothing_moves_is_exact(fake) -> None:
    src = TorchSource(fake)
    a = fake.empty(8 * MiB)
    mark = src.start_cell(1)
    peak = src.cell_peak(mark)
    assert (peak.bytes, peak.exact) == (8 * MiB, True)
    del a


def test_history_on_and_off_through_the_module(fake) -> None:
    src = TorchSource(fake)
    assert not src.history_on()  # before CUDA starts, without asking PyTorch's probe
    assert not fake.started
    src.record_history("all", max_entries=1000)
    assert fake.started  # recording starts CUDA: PyTorch records in its device allocators
    assert src.history_on() and src.recording_ours
    assert fake.history_calls[-1] == {"enabled": "all", "context": "all", "stacks": "python",
                                      "max_entries": 1000, "clear_history": True}
    src.record_history("off")
    assert not src.history_on()
    assert fake.history_calls[-1]["enabled"] is None


def test_selection_and_no_torch_import(fake) -> None:
    assert sources.selected() == ("cupy",)
    with pytest.raises(sources.SourceError, match="no source 'tf': the sources are cupy, torch"):
        sources.use_sources(("tf",))
    try:
        sources.use_torch(fake, also_cupy=True)
        assert sources.selected() == ("cupy", "torch")
        torch = sources.source("torch")
        assert torch is not None and torch.memory is fake
        sources.use_sources(("torch",))  # the same torch source stays
        assert sources.source("torch") is torch
        assert sources.source("cupy") is None
    finally:
        sources.use_sources(("cupy",))
    assert sources.source("torch") is None
    assert "torch" not in sys.modules
