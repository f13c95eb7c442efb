"""One cache for CuPy and PyTorch (``runtime.torch_share``), with a fake PyTorch that allocates
as PyTorch's pluggable allocator does (``fake_torch.FakeTorch``: through the function handed to
``_cuda_customAllocator``, by its address, without the GIL), on a simulated device.

The shim in the chain is the real one built with the package ("std"); where a request must fail,
the tests share with ``unchecked_oom`` and the fake stands in for the shim (a C++ exception
cannot cross ctypes: the shim's throw is tested by ``test_torch_shim``'s C++ harness).
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
from fake_torch import FakeTorch, OutOfMemoryError

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.oom import OOM_HEAD
from jupyter_gpumem.runtime import registry, torch_share
from jupyter_gpumem.runtime.torch_books import ANSWERED
from jupyter_gpumem.runtime.torch_shim import ShimChoice, choose_shim
from jupyter_gpumem.sources.cupy import CupySource

pytestmark = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")

MiB, GiB = 1 << 20, 1 << 30
HERE = Path(__file__).resolve()


def _native():
    from jupyter_gpumem.engine import _native

    return _native


def no_shim(torch, alloc, error):
    return ShimChoice(None, ["c10 shim: compiling failed (no compiler here)"])


@pytest.fixture
def shared(tmp_path):
    """A fake PyTorch sharing a 1 GiB simulated device's allocator through the package's "std"
    shim (compiled into ``tmp_path`` when the package has none)."""
    torch = FakeTorch()
    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    choice = choose_shim(None, *_entry(), folder=str(tmp_path))
    if choice.shim is None:
        pytest.skip(f"no allocator shim can be built here: {choice.reasons}")
    state = torch_share.share(torch, allocator_for=lambda i: allocator, device=0,
                              shims=lambda *_: choice)
    yield torch, allocator, state
    gc.collect()
    torch_share._reset_for_tests(torch)
    assert allocator.memory_allocated() == 0


@pytest.fixture
def unchecked():
    """As ``shared``, with no shim (``unchecked_oom``): requests that fail are safe to make."""
    torch = FakeTorch()
    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    state = torch_share.share(torch, allocator_for=lambda i: allocator, device=0,
                              unchecked_oom=True, shims=no_shim)
    yield torch, allocator, state
    gc.collect()
    torch_share._reset_for_tests(torch)


def _entry():
    n = _native()
    return n.torch_entry_points()[0], n.torch_error_entry()


def test_tensors_come_from_our_cache_and_go_back(shared) -> None:
    torch, a, state = shared
    assert state.shared and state.shim is not None and state.shim.kind == "std"
    assert state.devices == [0] and torch_share.shared()
    t = torch.empty(3 * MiB)
    assert a.owns(t.data_ptr()) and a.memory_allocated() == 3 * MiB
    assert torch.allocator.alloc_address == state.shim.alloc_address  # PyTorch calls the shim
    ptr = t.data_ptr()
    del t
    assert a.memory_allocated() == 0 and a.memory_reserved() == 20 * MiB
    # CuPy's path (the allocator's malloc) gets the very block PyTorch freed, and back
    p = a.malloc(3 * MiB, 0)
    assert p == ptr
    a.free(p)
    t = torch.empty(3 * MiB)
    assert t.data_ptr() == ptr
    del t


def test_a_tensor_on_a_side_stream_lands_in_that_streams_pool(shared) -> None:
    torch, a, _ = shared
    side = 0x7000
    t = torch.empty(MiB, stream=side)
    ptr = t.data_ptr()
    assert {s.stream for s in a.state().segments} == {side}
    del t
    other = a.malloc(MiB, 0)
    assert other != ptr  # another stream's pool: a new segment
    q = a.malloc(MiB, side)  # CuPy on the same stream reuses PyTorch's block
    assert q == ptr
    a.free(q)
    a.free(other)


def test_torch_memory_functions_answer_from_our_books(shared, tmp_path) -> None:
    torch, a, _ = shared
    mem = torch.cuda.memory
    keep = [torch.empty(5 * MiB), torch.empty(4096)]
    assert mem.memory_stats() == dict(sorted(a.memory_stats().items()))
    assert mem.memory_allocated() == a.memory_allocated() == 5 * MiB + 4096
    assert mem.memory_reserved() == a.memory_reserved()
    assert mem.max_memory_allocated() == 5 * MiB + 4096
    del keep[0]
    mem.reset_peak_memory_stats()
    assert mem.max_memory_allocated() == 4096 == a.memory_stats()["allocated_bytes.all.peak"]
    mem.reset_accumulated_memory_stats()
    assert a.memory_stats()["allocation.all.allocated"] == 0
    assert "Allocated memory 4096" in mem.memory_summary()
    snap = mem._snapshot()
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert [b["address"] for b in blocks] == [keep[0].data_ptr()]
    assert isinstance(snap["device_traces"][0], list)  # plain lists, for PyTorch's viewer
    path = tmp_path / "snap.pickle"
    mem._dump_snapshot(str(path))
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert loaded["segments"] == snap["segments"]
    a.empty_cache()
    assert a.memory_reserved() == 2 * MiB  # only the small segment holding keep[0]
    del keep
    mem.empty_cache()
    assert a.memory_reserved() == 0
    mem.set_per_process_memory_fraction(0.25)
    assert a.config.per_process_memory_fraction == 0.25
    assert mem.get_per_process_memory_fraction() == 0.25
    a.set_memory_fraction(None)


def test_record_memory_history_with_pytorchs_arguments(shared) -> None:
    torch, a, _ = shared
    mem = torch.cuda.memory
    mem._record_memory_history(max_entries=1000)
    assert a.history is not None and a.history.max_entries == 1000 and a.history.stacks
    assert torch._C._cuda_isHistoryEnabled()
    t = torch.empty(MiB)
    events = [e for e in mem._snapshot()["device_traces"][0] if e["action"] == "alloc"]
    assert events[-1]["addr"] == t.data_ptr()
    assert any(f["filename"] == str(HERE) for f in events[-1]["frames"])  # this test's line
    del t
    mem._record_memory_history(enabled="state", context=None)
    assert a.history is not None and a.history.max_entries == 0 and not a.history.stacks
    mem._record_memory_history(enabled=None)
    assert a.history is None and not torch._C._cuda_isHistoryEnabled()
    mem._record_memory_history(True, trace_alloc_max_entries=50, trace_alloc_record_context=True)
    assert a.history is not None and a.history.max_entries == 50
    mem._record_memory_history(False)
    assert a.history is None
    with pytest.raises(ValueError, match="enabled must be"):
        mem._record_memory_history(enabled="yes")
    with pytest.raises(ValueError, match="stacks must be"):
        mem._record_memory_history(stacks="cpp")
    assert a.history is None  # a refused call changes nothing


def test_every_answered_function_is_in_place_and_comes_back_for_tests(shared) -> None:
    torch, _, _ = shared
    for name in ANSWERED:
        assert getattr(torch._C, name).__self__ is torch_share._books
    torch_share._reset_for_tests(torch)
    with pytest.raises(RuntimeError, match="does not yet support getDeviceStats"):
        torch._C._cuda_memoryStats(0)


def test_too_late_once_pytorch_started_cuda() -> None:
    torch = FakeTorch()
    torch.cuda.current_device()  # as torch.cuda.get_device_name would: CUDA starts
    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    with pytest.raises(torch_share.TorchTooLate) as caught:
        torch_share.share(torch, allocator_for=lambda i: allocator, device=0, shims=no_shim,
                          unchecked_oom=True)
    text = str(caught.value)
    assert "too late" in text and "torch.cuda.is_initialized() is True" in text
    assert "c.GpuMem.share_torch = True" in text and "%gpumem torch share" in text
    assert not torch_share.shared() and torch.allocator is None
    assert _native().torch_bound(0) is None


def test_too_late_when_pytorch_refuses_the_swap() -> None:
    torch = FakeTorch()
    torch.allocator = object()  # another pluggable allocator is in place already
    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    with pytest.raises(torch_share.TorchTooLate, match="Can't swap an already initialized"):
        torch_share.share(torch, allocator_for=lambda i: allocator, device=0, shims=no_shim,
                          unchecked_oom=True)
    assert not torch_share.shared() and _native().torch_bound(0) is None


def test_no_shim_refuses_to_share_unless_told() -> None:
    torch = FakeTorch()
    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    with pytest.raises(torch_share.TorchShareError) as caught:
        torch_share.share(torch, allocator_for=lambda i: allocator, device=0, shims=no_shim)
    text = str(caught.value)
    assert "no compiler here" in text and "unchecked_oom=True" in text and "g++" in text
    assert not torch_share.shared() and torch.allocator is None


def test_unchecked_sharing_says_so(unchecked) -> None:
    _, _, state = unchecked
    assert state.shim is None and "NOT raised" in state.text()


def test_pytorchs_out_of_memory_error_carries_our_report(unchecked) -> None:
    torch, a, _ = unchecked
    keep = torch.empty(100 * MiB)
    with pytest.raises(OutOfMemoryError) as caught:
        torch.empty(2 * GiB)
    exc = caught.value
    assert str(exc).startswith(OOM_HEAD)
    source = CupySource(a)
    assert source.is_oom(exc)
    report = source.oom_report(exc)
    assert report is not None and report.requested == 2 * GiB and report.allocated == 100 * MiB
    assert source.oom_report(exc) is report  # asked again (the panel does): the same report
    t = torch.empty(MiB)  # the process goes on
    assert a.owns(t.data_ptr())
    del t, keep
    assert not source.is_oom(RuntimeError("CUDA error: an illegal memory access"))


def test_graph_capture_is_refused_and_record_stream_warns_once(shared) -> None:
    torch, _, _ = shared
    with pytest.raises(RuntimeError, match="CUDA graph capture is not supported"):
        torch.cuda.graphs.CUDAGraph().capture_begin()
    with pytest.raises(RuntimeError, match="CUDA graph capture is not supported"), \
            torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass
    t = torch.empty(MiB)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t.record_stream("side")
        t.record_stream("side")
    assert [str(w.message) for w in seen] == [torch_share.RECORD_STREAM_TEXT]
    assert t._torch_recorded == "side"  # PyTorch's own method still ran
    del t
    torch_share._reset_for_tests(torch)
    graph = torch.cuda.graphs.CUDAGraph()
    with torch.cuda.graph(graph):
        pass
    assert graph.captured


def test_a_second_install_changes_nothing(shared) -> None:
    torch, a, state = shared
    again = torch_share.share(torch, allocator_for=lambda i: a, device=0)
    assert again is state


def test_tensors_from_many_threads_and_cupys_path_at_once(shared) -> None:
    torch, a, _ = shared
    errors: list[BaseException] = []

    def pytorch(seed: int) -> None:
        try:
            for i in range(300):
                t = torch.empty((seed * 7919 + i * 104729) % (3 * MiB) + 1,
                                stream=0x100 * (i % 3))
                del t
        except BaseException as exc:
            errors.append(exc)

    def cupy() -> None:
        try:
            for i in range(300):
                a.free(a.malloc((i * 4099) % (5 * MiB) + 1, 0x100 * (i % 3)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pytorch, args=(s,)) for s in range(3)]
    threads.append(threading.Thread(target=cupy))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    a.check_invariants()
    assert a.memory_allocated() == 0


def test_pytorch_and_cupy_get_one_allocator_whatever_comes_first(monkeypatch) -> None:
    made = []

    def make(index):
        made.append(index)
        return CachingAllocator(SimulatedDevice(GiB), native=True)

    monkeypatch.setattr(registry, "_make_cuda_allocator", make)
    monkeypatch.setattr(registry, "_cuda", {})
    first = registry.cuda_allocator(0)  # CuPy's binding made it first
    torch = FakeTorch()
    try:
        torch_share.share(torch, allocator_for=registry.cuda_allocator, device=0, shims=no_shim,
                          unchecked_oom=True)
        assert _native().torch_bound(0) is first.native_core
        t = torch.empty(MiB, stream=0)
        # device 1's first tensor: PyTorch's first call makes its allocator, through the
        # registry, so CuPy's binding finds the same one later
        alloc = torch._alloc_type(torch.allocator.alloc_address)
        ptr = alloc(MiB, 1, None)
        assert registry.cuda_allocator(1).owns(ptr)
        assert made == [0, 1] and torch_share.torch_share_state().devices == [0, 1]
        torch._free_type(torch.allocator.free_address)(ptr, MiB, 1, None)
        del t
    finally:
        torch_share._reset_for_tests(torch)


def test_the_views_read_one_source_while_shared(sim, unchecked) -> None:
    from jupyter_gpumem import sources

    sources.use_sources(("both",))
    try:
        assert sources.selected() == ("cupy",)
        assert [s.name for s in sources.current_sources()] == ["cupy"]
        assert sources.get_source("cupy").title == "our allocator (CuPy and PyTorch, one cache)"
        sources.use_sources(("torch",))
        assert sources.selected() == ("cupy",)
    finally:
        sources.use_sources(("cupy",))


def test_interpreter_exit_with_tensors_alive(tmp_path) -> None:
    """Tensors still alive at exit are freed by the teardown, or dropped after it: no crash."""
    script = tmp_path / "exit.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE.parents[1])!r})\n"
        "from fake_torch import FakeTorch\n"
        "from jupyter_gpumem import CachingAllocator, SimulatedDevice\n"
        "from jupyter_gpumem.runtime import torch_share\n"
        "from jupyter_gpumem.runtime.torch_shim import choose_shim\n"
        "from jupyter_gpumem.engine import _native\n"
        "torch = FakeTorch()\n"
        "a = CachingAllocator(SimulatedDevice(1 << 30), native=True)\n"
        f"folder = {str(tmp_path)!r}\n"
        "choice = choose_shim(None, _native.torch_entry_points()[0], _native.torch_error_entry(),"
        " folder=folder)\n"
        "torch_share.share(torch, allocator_for=lambda i: a, device=0, shims=lambda *_: choice,"
        " unchecked_oom=choice.shim is None)\n"
        "kept = [torch.empty(n << 20) for n in (1, 3, 40)]\n"
        "class Late:\n"
        "    def __del__(self):\n"
        "        kept.clear()\n"
        "late = Late()\n"
        "print('alive', a.memory_allocated())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(HERE.parents[2])},
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"alive {44 * MiB}"
    assert "Fatal" not in done.stderr and "Segmentation" not in done.stderr


def test_install_torch_says_why_it_cannot_share(monkeypatch) -> None:
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(torch_share.TorchShareError, match="needs CuPy on a GPU, and here"):
        torch_share.install_torch()  # no GPU on this machine
    torch.initialized = True
    with pytest.raises(torch_share.TorchTooLate):
        torch_share.install_torch()
    torch.cuda.is_available = lambda: False
    with pytest.raises(torch_share.TorchShareError, match="PyTorch sees no CUDA device"):
        torch_share.install_torch()
    del torch._C._cuda_customAllocator
    with pytest.raises(torch_share.TorchShareError, match=r"built without CUDA"):
        torch_share.install_torch()
    monkeypatch.setenv("JUPYTER_GPUMEM_CORE", "python")
    with pytest.raises(torch_share.TorchShareError, match="needs the C core"):
        torch_share.install_torch()
    with pytest.raises(ValueError, match="device must be None or a CUDA device index"):
        torch_share.install_torch(device=-1)
    assert not torch_share.shared()


def test_the_readme_lists_every_function_answered_by_us() -> None:
    readme = (HERE.parents[2] / "README.md").read_text()
    for name, serves in ANSWERED.items():
        assert f"| `{name}` | {serves} |" in readme
