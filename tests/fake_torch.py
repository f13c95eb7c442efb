"""A stand-in for ``torch.cuda.memory`` (and the bits of ``torch.cuda`` we read), with no torch.

``FakeTorchMemory`` runs PyTorch's policy for real: it is our ``CachingAllocator`` on a simulated
device, served through PyTorch's function names (``memory_stats``, ``memory_allocated``,
``_snapshot``, ``_record_memory_history``, ...). Its snapshots look like PyTorch's: none of our
extension keys, and with ``stacks="all"`` each stack starts with C++ frames (``??:0`` and a
``.cpp`` file); this file's own frames are renamed into a ``torch`` package, as PyTorch's Python
frames would be. ``FakeTensor`` has the duck-typed surface the holder search reads
(``untyped_storage().data_ptr()/nbytes()``, ``grad``); ``FakeLinear``/``FakeSequential`` and
``FakeAdamW`` those of ``nn.Module`` and an optimizer.

``RecordedTorchMemory`` serves stats and a snapshot read from fixture files instead.
"""

from __future__ import annotations

import copy
import time
import types
from collections.abc import Iterator
from typing import Any

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine.oom import OutOfMemoryError as OurOom

GiB = 1 << 30
#: Where this file's frames appear to be: inside PyTorch's own Python package.
TORCH_FILE = "/opt/fake/lib/python3.11/torch/nn/modules/linear.py"
CPP_FRAMES = [
    {"filename": "??", "line": 0, "name": "??"},
    {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1130,
     "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
    {"filename": "libtorch_cuda.so", "line": 0, "name": "at::native::empty_cuda"},
]
_OURS = ("jupyter_gpumem", "schema")
_EVENT_EXTRAS = ("cell", "block_size", "reason", "requested_size")


class OutOfMemoryError(RuntimeError):
    """Like ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``)."""


OutOfMemoryError.__module__ = "torch"


def _frames(frames: list[dict[str, Any]], stacks: str) -> list[dict[str, Any]]:
    out = [dict(f, filename=TORCH_FILE) if f["filename"] == __file__ else dict(f)
           for f in frames]
    return [*copy.deepcopy(CPP_FRAMES), *out] if stacks == "all" and out else out


def torch_style(snapshot: dict[str, Any], stacks: str = "python") -> dict[str, Any]:
    """One of our snapshots as PyTorch writes it (see the module docstring)."""
    segments = []
    for seg in snapshot["segments"]:
        seg = dict(seg)
        seg["blocks"] = [dict(b, frames=_frames(b["frames"], stacks)) for b in seg["blocks"]]
        seg.setdefault("segment_pool_id", (0, 0))
        seg.setdefault("is_expandable", False)
        segments.append(seg)
    traces = []
    for trace in snapshot["device_traces"]:
        events = []
        for e in trace:
            e = {k: v for k, v in e.items() if k not in _EVENT_EXTRAS}
            e["frames"] = _frames(e["frames"], stacks)
            events.append(e)
        traces.append(events)
    out = {k: v for k, v in snapshot.items() if k not in _OURS}
    out["segments"], out["device_traces"] = segments, traces
    return out


class FakeStorage:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self._ptr, self._nbytes = ptr, nbytes

    def data_ptr(self) -> int:
        return self._ptr

    def nbytes(self) -> int:
        return self._nbytes


class FakeTensor:
    """A CUDA tensor of the fake: its storage is a block of the fake's allocator, freed when the
    last reference goes (as PyTorch's storages are)."""

    def __init__(self, memory: FakeTorchMemory, nbytes: int) -> None:
        self._memory = memory
        self._storage = FakeStorage(memory.allocator.malloc(nbytes), nbytes)
        self.grad: FakeTensor | None = None
        self.grad_fn: FakeNode | None = None  # the autograd node that made it (see ``op``)

    @property
    def data(self) -> FakeTensor:  # torch.Tensor.data is another tensor, not a buffer
        return self

    @property
    def nbytes(self) -> int:
        return self._storage.nbytes()

    def untyped_storage(self) -> FakeStorage:
        return self._storage

    def data_ptr(self) -> int:
        return self._storage.data_ptr()

    def __del__(self) -> None:
        memory, storage = getattr(self, "_memory", None), getattr(self, "_storage", None)
        if memory is not None and storage is not None and storage.data_ptr():
            memory.allocator.free(storage.data_ptr())


class FakeNode:
    """An autograd node's surface: the tensors saved for backward as ``_saved_*`` attributes of
    its type (as PyTorch's generated nodes have them) and ``next_functions``."""

    def __init__(self, saved: tuple[FakeTensor, ...], following: tuple[FakeNode | None, ...]
                 ) -> None:
        self._saved = saved
        self.next_functions = tuple((node, 0) for node in following)

    @property
    def _saved_self(self) -> FakeTensor | None:
        return self._saved[0] if self._saved else None

    @property
    def _saved_other(self) -> FakeTensor | None:
        return self._saved[1] if len(self._saved) > 1 else None


class FakeModule:
    """``nn.Module``'s duck-typed surface: ``named_parameters``, ``named_buffers``."""

    def __init__(self) -> None:
        self._params: dict[str, FakeTensor] = {}
        self._buffers: dict[str, FakeTensor] = {}
        self._children: dict[str, FakeModule] = {}

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, FakeTensor]]:
        for name, p in self._params.items():
            yield prefix + name, p
        for cname, child in self._children.items():
            yield from child.named_parameters(f"{prefix}{cname}.")

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, FakeTensor]]:
        for name, b in self._buffers.items():
            yield prefix + name, b
        for cname, child in self._children.items():
            yield from child.named_buffers(f"{prefix}{cname}.")

    def parameters(self) -> Iterator[FakeTensor]:
        return (p for _n, p in self.named_parameters())


class FakeLinear(FakeModule):
    def __init__(self, memory: FakeTorchMemory, n_in: int, n_out: int) -> None:
        super().__init__()
        self._params["weight"] = memory.empty(4 * n_in * n_out)
        self._params["bias"] = memory.empty(4 * n_out)


class FakeBatchNorm(FakeModule):
    def __init__(self, memory: FakeTorchMemory, n: int) -> None:
        super().__init__()
        self._params["weight"] = memory.empty(4 * n)
        self._buffers["running_mean"] = memory.empty(4 * n)


class FakeSequential(FakeModule):
    def __init__(self, *layers: FakeModule | None) -> None:
        super().__init__()
        for i, layer in enumerate(layers):
            if layer is not None:  # None: a layer with no parameters (ReLU)
                self._children[str(i)] = layer


class FakeAdamW:
    """An optimizer's duck-typed surface: ``state`` (parameter → dict) and ``param_groups``."""

    def __init__(self, params: Iterator[FakeTensor]) -> None:
        self.param_groups = [{"params": list(params)}]
        self.state: dict[FakeTensor, dict[str, Any]] = {}

    def step(self) -> None:
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                m = p._memory
                self.state[p] = {"step": 0, "exp_avg": m.empty(p.nbytes),
                                 "exp_avg_sq": m.empty(p.nbytes)}
            self.state[p]["step"] += 1


class FakeTorchMemory(types.SimpleNamespace):
    """``torch.cuda.memory`` and ``torch.cuda`` in one object, on a simulated device."""

    OutOfMemoryError = OutOfMemoryError

    def __init__(self, capacity: int = 1 * GiB, *, name: str = "Fake H200") -> None:
        super().__init__()
        self.device = SimulatedDevice(capacity, clock=time.time_ns, name=name)
        self.allocator = CachingAllocator(self.device)
        self.history_calls: list[dict[str, Any]] = []
        self.peak_resets = 0
        self._stacks = "python"
        self._C = types.SimpleNamespace(_cuda_isHistoryEnabled=self._history_enabled)
        self.started = False  # torch.cuda.is_initialized(): CUDA starts at the first tensor

    def is_initialized(self) -> bool:
        return self.started

    def init(self) -> None:
        self.started = True

    # -- what tests do with it ---------------------------------------------------------------

    def empty(self, nbytes: int) -> FakeTensor:
        self.started = True
        try:
            return FakeTensor(self, nbytes)
        except OurOom as exc:
            r = exc.report
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {r.requested / 2**20:.2f} MiB. GPU 0 "
                f"has a total capacity of {r.device_total / 2**30:.2f} GiB of which "
                f"{r.device_free / 2**20:.2f} MiB is free. Of the allocated memory "
                f"{r.allocated / 2**20:.2f} MiB is allocated by PyTorch, and "
                f"{(r.reserved - r.allocated) / 2**20:.2f} MiB is reserved by PyTorch but "
                "unallocated.") from None

    def op(self, *inputs: FakeTensor, nbytes: int = 512, saves: bool = True) -> FakeTensor:
        """The result of an operation on ``inputs`` that records autograd history: its
        ``grad_fn`` saves the inputs for backward (``saves``; an addition saves none) and links
        to the inputs' own nodes."""
        out = self.empty(nbytes)
        out.grad_fn = FakeNode(inputs if saves else (), tuple(t.grad_fn for t in inputs))
        return out

    # -- torch.cuda ---------------------------------------------------------------------------

    def current_device(self) -> int:
        return 0

    def get_device_name(self, device: int | None = None) -> str:
        return self.device.name

    # -- torch.cuda.memory ---------------------------------------------------------------------

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        return dict(self.allocator.memory_stats())

    def memory_allocated(self, device: Any = None) -> int:
        return self.allocator.memory_allocated()

    def memory_reserved(self, device: Any = None) -> int:
        return self.allocator.memory_reserved()

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.allocator.memory_stats()["allocated_bytes.all.peak"]

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.peak_resets += 1
        self.allocator.reset_peak_memory_stats()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return self.device.mem_get_info()

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        self.allocator.set_memory_fraction(fraction)

    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        fraction = self.allocator.config.per_process_memory_fraction
        return 1.0 if fraction is None else fraction

    def empty_cache(self) -> None:
        self.allocator.empty_cache()

    def _history_enabled(self) -> bool:
        if not self.started:  # PyTorch 2.11 reads a device allocator not made yet: a segfault
            raise AssertionError("_cuda_isHistoryEnabled asked before CUDA started")
        h = self.allocator.history
        return h is not None and h.max_entries > 0

    def _record_memory_history(self, enabled: str | None = "all", context: str | None = "all",
                               stacks: str = "all", max_entries: int = 2**62,
                               device: Any = None, clear_history: bool = False) -> None:
        self.history_calls.append({"enabled": enabled, "context": context, "stacks": stacks,
                                   "max_entries": max_entries, "clear_history": clear_history})
        if enabled is None:
            self.allocator.record_history(False)
            return
        self._stacks = stacks
        self.allocator.record_history(True, stacks=context is not None,
                                      max_entries=max_entries if enabled == "all" else 0,
                                      clear=clear_history)

    def _snapshot(self, device: Any = None) -> dict[str, Any]:
        return torch_style(self.allocator.snapshot(), self._stacks)


class RecordedTorchMemory(types.SimpleNamespace):
    """``torch.cuda.memory`` serving recorded stats and one recorded snapshot (fixtures)."""

    OutOfMemoryError = OutOfMemoryError

    def __init__(self, stats: dict[str, int], snapshot: dict[str, Any],
                 total: int = 140 * GiB, name: str = "Recorded GPU") -> None:
        super().__init__()
        self.stats = stats
        self.recorded = snapshot
        self.total = total
        self.name = name
        self._C = types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: False)

    def current_device(self) -> int:
        return 0

    def get_device_name(self, device: int | None = None) -> str:
        return self.name

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        return dict(self.stats)

    def memory_allocated(self, device: Any = None) -> int:
        return self.stats.get("allocated_bytes.all.current", 0)

    def memory_reserved(self, device: Any = None) -> int:
        return self.stats.get("reserved_bytes.all.current", 0)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return self.total - self.memory_reserved(), self.total

    def _record_memory_history(self, *args: Any, **kwargs: Any) -> None:
        pass

    def _snapshot(self, device: Any = None) -> dict[str, Any]:
        return copy.deepcopy(self.recorded)


def views_on_fake(shell: Any, run: Any, mem: FakeTorchMemory, *, footer: bool = False) -> Any:
    """Load the extension in ``shell`` (its live view off, the footer as ``footer``), point the
    views at ``mem`` as PyTorch, and name it ``mem`` in the shell; the extension."""
    from jupyter_gpumem import sources
    from jupyter_gpumem.notebook.extension import get_extension

    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    ext = get_extension(shell)
    ext.settings.live_view = False
    ext.settings.auto_footer = footer
    sources.use_torch(mem)
    shell.user_ns["mem"] = mem
    return ext


# -- a PyTorch whose allocator can be ours: ``FakeTorch`` ---------------------------------------
#
# What ``runtime.torch_share`` touches of PyTorch, with PyTorch's shape: ``torch._C`` (the
# pluggable allocator's two calls, and the memory functions a pluggable allocator cannot answer,
# which raise "does not yet support" as PyTorch's do), ``torch.cuda`` and ``torch.cuda.memory``
# (Python wrappers that call ``torch._C`` when they run, as PyTorch's do, so answers patched in
# ``torch._C`` reach them), ``torch.cuda.graphs.CUDAGraph`` and ``torch.Tensor.record_stream``.
# ``FakeTorch.empty`` allocates as PyTorch's pluggable allocator does: it calls the function
# handed to ``_cuda_customAllocator`` at its address (through ctypes, without the GIL, as
# autograd's threads do) and frees through the free function when the last reference goes.
# PyTorch would take a NULL for a tensor at address 0; with ``checks_null`` (the default) the
# fake raises what PyTorch raises through the "c10" shim: ``OutOfMemoryError`` (or RuntimeError)
# with the core's text. It never calls a shim with a request that can fail: a C++ exception
# cannot cross ctypes.


class _SharedStorage(FakeStorage):
    def __init__(self, torch: FakeTorch, ptr: int, nbytes: int, stream: int) -> None:
        super().__init__(ptr, nbytes)
        self._torch, self._stream = torch, stream

    def __del__(self) -> None:
        torch = getattr(self, "_torch", None)
        if torch is not None and self._ptr:
            torch._free_block(self._ptr, self._nbytes, self._stream)


class SharedTensor:
    """A CUDA tensor of ``FakeTorch``: its storage's block came from the current allocator."""

    def __init__(self, storage: _SharedStorage) -> None:
        self._storage = storage
        self.grad = None

    @property
    def nbytes(self) -> int:
        return self._storage.nbytes()

    def untyped_storage(self) -> FakeStorage:
        return self._storage

    def data_ptr(self) -> int:
        return self._storage.data_ptr()

    def record_stream(self, stream: Any) -> None:  # PyTorch's: nothing under a pluggable one
        self._torch_recorded = stream


def _unsupported(what: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"CUDAPluggableAllocator does not yet support {what}. If you need "
                           "it, please file an issue describing your use case.")
    return call


class _RawAllocator:
    def __init__(self, alloc: int, free: int) -> None:
        self.alloc_address, self.free_address = alloc, free


class FakeCUDAGraph:
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self.captured = True


class FakeGraphContext:
    """``torch.cuda.graph``: capture on entry."""

    def __init__(self, cuda_graph: FakeCUDAGraph) -> None:
        self.cuda_graph = cuda_graph

    def __enter__(self) -> None:
        self.cuda_graph.capture_begin()

    def __exit__(self, *args: Any) -> None:
        pass


class FakeTorch(types.SimpleNamespace):
    """``torch`` with CUDA, as far as sharing our cache goes (see above); ``capacity`` is what
    ``mem_get_info`` reports."""

    OutOfMemoryError = OutOfMemoryError

    def __init__(self, *, capacity: int = 1 * GiB, version: str = "2.99.0+fake",
                 checks_null: bool = True) -> None:
        super().__init__()
        import ctypes

        self.__version__ = version
        self.checks_null = checks_null
        self.capacity = capacity
        self.allocator: _RawAllocator | None = None  # the pluggable one, once changed to it
        self.initialized = False
        self.calls: list[tuple[str, Any]] = []
        self.Tensor = SharedTensor
        self._alloc_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p)
        self._free_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_void_p)
        self._C = types.SimpleNamespace(
            _GLIBCXX_USE_CXX11_ABI=True,
            _cuda_customAllocator=lambda alloc, free: _RawAllocator(alloc, free),
            _cuda_changeCurrentAllocator=self._change,
            _cuda_memoryStats=_unsupported("getDeviceStats"),
            _cuda_resetPeakMemoryStats=_unsupported("resetPeakStats"),
            _cuda_resetAccumulatedMemoryStats=_unsupported("resetAccumulatedStats"),
            _cuda_memorySnapshot=_unsupported("snapshot"),
            _cuda_record_memory_history=_unsupported("recordHistory"),
            _cuda_record_memory_history_legacy=_unsupported("recordHistory"),
            _cuda_getMemoryFraction=_unsupported("getMemoryFraction"),
            _cuda_isHistoryEnabled=lambda: False,
            _cuda_emptyCache=lambda: None,  # a pluggable allocator without reset_fn: nothing
            _cuda_setMemoryFraction=lambda fraction, device: None,
        )
        graphs = types.SimpleNamespace(CUDAGraph=type("CUDAGraph", (FakeCUDAGraph,), {}),
                                       graph=type("graph", (FakeGraphContext,), {}))
        memory = types.SimpleNamespace(**{name: getattr(self, name) for name in (
            "memory_stats", "memory_allocated", "memory_reserved", "max_memory_allocated",
            "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
            "memory_summary", "_snapshot", "_dump_snapshot", "_record_memory_history",
            "empty_cache", "set_per_process_memory_fraction",
            "get_per_process_memory_fraction", "mem_get_info")})
        memory._C = self._C
        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, is_initialized=lambda: self.initialized,
            current_device=self.current_device, get_device_name=lambda d=None: "Fake H200",
            OutOfMemoryError=OutOfMemoryError, graphs=graphs, CUDAGraph=graphs.CUDAGraph,
            graph=graphs.graph,
            memory=memory, **vars(memory))

    # -- the allocator ------------------------------------------------------------------------

    def _change(self, raw: _RawAllocator) -> None:
        if self.initialized or self.allocator is not None:
            raise RuntimeError("Can't swap an already initialized allocator")
        self.allocator = raw

    def current_device(self) -> int:
        self.initialized = True  # as torch.cuda.current_device's _lazy_init
        return 0

    def empty(self, nbytes: int, stream: int = 0) -> SharedTensor:
        """A tensor of ``nbytes`` on ``stream``: PyTorch's allocate() through the pluggable
        allocator (this starts CUDA, as a first tensor does)."""
        self.initialized = True
        if self.allocator is None:
            raise RuntimeError("the fake has no native allocator: share first")
        alloc = self._alloc_type(self.allocator.alloc_address)
        ptr = alloc(nbytes, 0, stream or None) or 0
        self.calls.append(("alloc", ptr))
        if not ptr and nbytes and self.checks_null:
            from jupyter_gpumem.engine import _native

            text, is_oom = _native.torch_error_text()
            raise (OutOfMemoryError if is_oom else RuntimeError)(text)
        return SharedTensor(_SharedStorage(self, ptr, nbytes, stream))

    def _free_block(self, ptr: int, nbytes: int, stream: int) -> None:
        assert self.allocator is not None
        self._free_type(self.allocator.free_address)(ptr, nbytes, 0, stream or None)
        self.calls.append(("free", ptr))

    # -- torch.cuda.memory: PyTorch's Python wrappers, calling torch._C when they run ----------

    def memory_stats(self, device: Any = None) -> dict[str, Any]:
        if not self.initialized:
            return {}
        nested = self._C._cuda_memoryStats(self._index(device))
        flat: dict[str, Any] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                flat[prefix] = obj

        walk("", nested)
        return dict(sorted(flat.items()))

    def memory_allocated(self, device: Any = None) -> int:
        return self.memory_stats(device).get("allocated_bytes.all.current", 0)

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.memory_stats(device).get("allocated_bytes.all.peak", 0)

    def memory_reserved(self, device: Any = None) -> int:
        return self.memory_stats(device).get("reserved_bytes.all.current", 0)

    def max_memory_reserved(self, device: Any = None) -> int:
        return self.memory_stats(device).get("reserved_bytes.all.peak", 0)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self._C._cuda_resetPeakMemoryStats(self._index(device))

    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        self._C._cuda_resetAccumulatedMemoryStats(self._index(device))

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        st = self.memory_stats(device)
        return (f"PyTorch CUDA memory summary, device ID {self._index(device)}\n"
                f"Allocated memory {st['allocated_bytes.all.current']} "
                f"(peak {st['allocated_bytes.all.peak']})\n"
                f"GPU reserved memory {st['reserved_bytes.all.current']}")

    def _snapshot(self, device: Any = None) -> dict[str, Any]:
        return self._C._cuda_memorySnapshot(None)

    def _dump_snapshot(self, filename: str = "dump_snapshot.pickle") -> None:
        import pickle

        with open(filename, "wb") as f:
            pickle.dump(self._snapshot(), f)

    def _record_memory_history(self, enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        if isinstance(enabled, bool):
            self._legacy_history(enabled, *args, **kwargs)
        else:
            self._history(enabled, *args, **kwargs)

    def _legacy_history(self, enabled: bool, record_context: bool = True,
                        trace_alloc_max_entries: int = 1,
                        trace_alloc_record_context: bool = False, device: Any = None,
                        record_context_cpp: bool = False, clear_history: bool = False) -> None:
        self._C._cuda_record_memory_history_legacy(
            enabled, record_context, trace_alloc_max_entries, trace_alloc_record_context,
            record_context_cpp, clear_history, False, False, [])

    def _history(self, enabled: Any = "all", context: Any = "all", stacks: str = "all",
                 max_entries: int = 2**63 - 1, device: Any = None, clear_history: bool = False,
                 compile_context: bool = False, global_record_annotations: bool = False,
                 skip_actions: Any = None) -> None:
        self._C._cuda_record_memory_history(enabled, context, stacks, max_entries,
                                            clear_history, compile_context,
                                            global_record_annotations, skip_actions or [])

    def empty_cache(self) -> None:
        if self.initialized:
            self._C._cuda_emptyCache()

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        self.initialized = True
        self._C._cuda_setMemoryFraction(fraction, self._index(device))

    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        self.initialized = True
        return float(self._C._cuda_getMemoryFraction(self._index(device)))

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return self.capacity // 2, self.capacity

    def _index(self, device: Any) -> int:
        return 0 if device is None else int(device)
