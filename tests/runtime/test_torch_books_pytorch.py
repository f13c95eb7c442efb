"""``runtime.torch_books`` under PyTorch's own Python code: the real ``torch.cuda`` memory
functions (flattening, the summary table, the history's argument handling, the pickle) called
over our books, where PyTorch is installed (a CPU build will do: only its Python layer runs, with
``torch._C``'s functions replaced as ``install_torch`` replaces them)."""

from __future__ import annotations

import os
import pickle

import pytest

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.files import load_snapshot
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.runtime.torch_books import ANSWERED, TorchBooks

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")
MiB = 1 << 20


@pytest.fixture
def books(monkeypatch):
    allocator = CachingAllocator(SimulatedDevice(1 << 30), native=True)
    books = TorchBooks(lambda i: allocator, lambda: {0: allocator}, lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "is_initialized", lambda: True, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in ANSWERED:
        monkeypatch.setattr(torch._C, name, getattr(books, name), raising=False)
    yield allocator
    for block in allocator.state().blocks:
        if block.allocated:
            allocator.free(block.address)


def test_pytorchs_functions_read_our_counters(books) -> None:
    a = books
    p = a.malloc(5 * MiB)
    q = a.malloc(1000)
    stats = torch.cuda.memory_stats(0)
    assert dict(stats) == a.memory_stats()
    assert torch.cuda.memory_allocated(0) == 5 * MiB + 1024
    assert torch.cuda.max_memory_reserved(0) == a.memory_reserved()
    table = torch.cuda.memory_summary(0)
    assert "PyTorch CUDA memory summary, device ID 0" in table and "5121 KiB" in table
    a.free(p)
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(0) == 1024
    torch.cuda.reset_accumulated_memory_stats(0)
    assert torch.cuda.memory_stats(0)["allocation.all.allocated"] == 0
    torch.cuda.empty_cache()
    assert a.memory_reserved() == 2 * MiB
    a.free(q)


def test_pytorchs_history_and_snapshot_functions(books, tmp_path) -> None:
    a = books
    torch.cuda.memory._record_memory_history(max_entries=500, stacks="python")
    assert a.history is not None and a.history.max_entries == 500
    p = a.malloc(3 * MiB)
    snap = torch.cuda.memory._snapshot()
    assert [e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"] == [p]
    assert torch.cuda.memory_snapshot()[0]["blocks"][0]["address"] == p
    path = tmp_path / "s.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        assert pickle.load(f)["segments"][0]["address"] == p
    assert load_snapshot(str(path))["segments"][0]["blocks"][0]["address"] == p
    torch.cuda.memory._record_memory_history(enabled=None)
    assert a.history is None
    torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=7,
                                             trace_alloc_record_context=True)
    assert a.history is not None and a.history.max_entries == 7
    torch.cuda.memory._record_memory_history(False)
    assert a.history is None
    a.free(p)
