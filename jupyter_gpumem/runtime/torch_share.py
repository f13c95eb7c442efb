"""One cache for CuPy and PyTorch: PyTorch's tensors allocated by the allocator each device shares
with CuPy's arrays (``install_torch``).

What ``install_torch`` does, once a process:

1. checks it is not too late: PyTorch's allocator can change only before PyTorch starts CUDA
   (``torch.cuda.is_initialized()``), which its first call that touches the GPU does;
2. picks the allocator shim PyTorch will call (``runtime.torch_shim``: Note [The shim reads the
   error] in ``engine/csrc/torch.c``), and refuses to share without one unless told
   ``unchecked_oom=True``;
3. binds the C core of each device's allocator (``runtime.registry``: the very instance CuPy's
   binding uses, whichever comes first) to PyTorch's entry points (``csrc/torch.c``), now for
   ``device`` and on first use for the others, and makes them PyTorch's allocator
   (``torch._C._cuda_customAllocator`` + ``_cuda_changeCurrentAllocator``);
4. answers PyTorch's memory functions from our books (``runtime.torch_books``), refuses CUDA
   graph capture with a clear error (Note [What one cache cannot do]), and warns once where
   ``Tensor.record_stream`` is called.

Nothing of it can be undone in the process: PyTorch's allocator, once chosen, stays (PyTorch
itself refuses to swap an allocator that is in place). ``%unload_ext`` leaves it so, and says
so; the cores stay bound and alive for good, so every tensor's block goes back where it came
from, and at interpreter exit frees are dropped (Note [Calls without the GIL]).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.runtime import registry
from jupyter_gpumem.runtime.torch_books import TorchBooks
from jupyter_gpumem.runtime.torch_shim import Shim, ShimChoice, choose_shim

if TYPE_CHECKING:
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.engine.oom import OomReport

__all__ = ["GRAPH_TEXT", "RECORD_STREAM_TEXT", "TorchShare", "TorchShareError", "TorchTooLate",
           "install_torch", "is_our_oom", "report_for", "shared", "torch_share_state"]


class TorchShareError(RuntimeError):
    """PyTorch cannot share our cache here; the message says why and what to do."""


class TorchTooLate(TorchShareError):
    """PyTorch has started CUDA already: its allocator cannot change in this process."""


TOO_LATE_TEXT = (
    "jupyter_gpumem: too late to share the cache with PyTorch in this process: PyTorch has "
    "started CUDA already ({why}), and its allocator cannot change after that. The first "
    "PyTorch call that touches the GPU fixes it: a tensor made on 'cuda', .cuda() or "
    ".to('cuda'), torch.cuda.get_device_name(), torch.cuda.mem_get_info(), "
    "torch.cuda.synchronize() ... Restart the kernel and share before that call: "
    "`%load_ext jupyter_gpumem` with `c.GpuMem.share_torch = True` in ipython_config.py, or "
    "`%gpumem torch share` (jupyter_gpumem.install_torch()) in the first cell.")

NO_SHIM_TEXT = (
    "jupyter_gpumem: not sharing the cache with PyTorch: no allocator shim could be had "
    "({reasons}). PyTorch does not check what its allocator returns, so without a shim an "
    "out-of-memory error would reach the GPU as a write to address 0 and break CUDA for the "
    "whole process. Install a C++ compiler (g++ or clang++; PyTorch's headers come with "
    "torch) and try again, or pass unchecked_oom=True to share anyway, knowing that.")

#: Note [What one cache cannot do]: CUDA graphs.
GRAPH_TEXT = (
    "jupyter_gpumem: CUDA graph capture is not supported while PyTorch allocates from "
    "jupyter_gpumem's cache: PyTorch's pluggable-allocator path keeps no private memory pool "
    "for a graph, so memory the captured graph uses would be handed to other tensors and "
    "arrays after capture (and a new segment asked for during capture breaks it). Capture "
    "graphs in a process that does not share (without install_torch / "
    "c.GpuMem.share_torch).")

#: Note [What one cache cannot do]: record_stream.
RECORD_STREAM_TEXT = (
    "jupyter_gpumem: Tensor.record_stream does nothing while PyTorch allocates from "
    "jupyter_gpumem's cache (PyTorch's pluggable-allocator path passes it no stream): a tensor "
    "freed while another stream still uses it goes back to the cache at once. Before freeing "
    "it, make the allocating stream wait for that stream "
    "(torch.cuda.current_stream().wait_stream(side)), or keep the tensor until the side "
    "stream is done (side.synchronize()).")


@dataclass
class TorchShare:
    """Whether PyTorch allocates from our cache in this process, and how."""

    shared: bool = False
    torch_version: str | None = None
    shim: Shim | None = None  # None while shared: unchecked_oom=True
    devices: list[int] = field(default_factory=list)  # bound so far
    reasons: list[str] = field(default_factory=list)  # shim builds that could not be used

    def text(self) -> str:
        """What ``%gpumem torch`` says of it."""
        if not self.shared:
            return "PyTorch uses its own allocator (not shared with CuPy)"
        if self.shim is None:
            oom = ("no shim: an out-of-memory error is NOT raised by PyTorch "
                   "(unchecked_oom=True)")
        else:
            raised = ("torch.OutOfMemoryError" if self.shim.kind == "c10"
                      else "RuntimeError (no PyTorch headers were usable)")
            how = self.shim.origin + (f" in {self.shim.compile_seconds:.1f} s"
                                      if self.shim.compile_seconds is not None else "")
            oom = f"out of memory raises {raised} (shim {self.shim.kind}, {how})"
        devices = ", ".join(str(d) for d in self.devices) or "none yet"
        return (f"PyTorch {self.torch_version} allocates from jupyter_gpumem's cache, one with "
                f"CuPy's arrays (devices bound: {devices}); {oom}; torch.cuda's memory "
                "functions answer from it")


_lock = threading.RLock()
_state = TorchShare()
_books: TorchBooks | None = None
_raw: Any = None  # PyTorch's allocator object: kept alive here as well as by PyTorch
_kept_error: BaseException | None = None
_patched: dict[str, tuple[Any, str, Any]] = {}  # what was replaced on PyTorch's classes


def shared() -> bool:
    """Whether PyTorch allocates from our cache in this process."""
    return _state.shared


def torch_share_state() -> TorchShare:
    """Whether and how PyTorch shares our cache (``%gpumem torch``)."""
    return _state


def install_torch(device: int | None = None, *, unchecked_oom: bool = False) -> TorchShare:
    """Make PyTorch allocate from the caching allocator CuPy's arrays use: one cache, and one
    set of books, per device (see the module docstring). Call it before PyTorch's first CUDA
    call; later, ``TorchTooLate`` says so. A second call binds ``device`` and changes nothing
    else.

    ``device``: the CUDA device whose allocator is made and bound now (default: the current
    one); the others are bound when PyTorch first allocates on them. ``unchecked_oom``: share
    even where no allocator shim can be had (an out-of-memory error then corrupts CUDA for the
    process: see ``NO_SHIM_TEXT``). Needs CuPy (our segments come from the device through it)
    and the C core."""
    import torch

    if device is not None and (isinstance(device, bool) or not isinstance(device, int)
                               or device < 0):
        raise ValueError(f"device must be None or a CUDA device index, got {device!r}")
    with _lock:
        if _state.shared:
            if device is not None:
                _bind(device, registry.cuda_allocator(device))
            return _state
        _check_can_share(torch)
        index = _current_cupy_device() if device is None else device
        return share(torch, allocator_for=_cuda_allocator_checked, device=index,
                     unchecked_oom=unchecked_oom,
                     current_device=lambda: int(torch.cuda.current_device()))


def _check_can_share(torch: Any) -> None:
    from jupyter_gpumem.engine.allocator import CORE_ENV, native_core_available

    if not native_core_available():
        raise TorchShareError("jupyter_gpumem: sharing the cache with PyTorch needs the C core, "
                              "which is not built here (pip install again with a C compiler, "
                              "or python -m jupyter_gpumem.engine._build_native)")
    import os

    if os.environ.get(CORE_ENV, "auto").lower() == "python":
        raise TorchShareError(f"jupyter_gpumem: sharing the cache with PyTorch needs the C core; "
                              f"{CORE_ENV}=python asks for the Python one")
    if not hasattr(torch._C, "_cuda_customAllocator"):
        raise TorchShareError(f"jupyter_gpumem: this PyTorch ({torch.__version__}) is built "
                              "without CUDA: there is no GPU allocator to share")
    if not torch.cuda.is_available():
        raise TorchShareError("jupyter_gpumem: PyTorch sees no CUDA device: nothing to share")
    if torch.cuda.is_initialized():
        raise TorchTooLate(TOO_LATE_TEXT.format(why="torch.cuda.is_initialized() is True"))


def _current_cupy_device() -> int:
    from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason, current_device_index

    reason = cuda_unavailable_reason()
    if reason is not None:  # our segments come from the device through CuPy
        raise TorchShareError(f"jupyter_gpumem: sharing the cache with PyTorch needs CuPy on a "
                              f"GPU, and here {reason}")
    return current_device_index()


def _cuda_allocator_checked(index: int) -> CachingAllocator:
    allocator = registry.cuda_allocator(index)
    if not allocator.native:
        raise TorchShareError(f"jupyter_gpumem: device {index}'s allocator runs the Python core; "
                              "PyTorch can share only the C core's cache")
    return allocator


def share(torch: Any, *, allocator_for: Callable[[int], CachingAllocator], device: int,
          unchecked_oom: bool = False,
          allocators: Callable[[], dict[int, CachingAllocator]] | None = None,
          current_device: Callable[[], int] | None = None,
          shims: Callable[[Any, int, int], ShimChoice] | None = None) -> TorchShare:
    """Steps 1 to 4 of the module docstring, with the outside world passed in (``install_torch``
    passes CUDA's; the tests a simulated device and a fake ``torch``): ``allocator_for(index)``
    gives each device's allocator, ``allocators()`` those made so far (default: the devices
    bound), ``shims(torch, alloc, error)`` the shim (default: ``choose_shim``)."""
    global _state, _books, _raw
    from jupyter_gpumem.engine import _native

    with _lock:
        if _state.shared:
            return _state
        if torch.cuda.is_initialized():
            raise TorchTooLate(TOO_LATE_TEXT.format(why="torch.cuda.is_initialized() is True"))
        alloc, free = _native.torch_entry_points()
        choice = (shims or choose_shim)(torch, alloc, _native.torch_error_entry())
        if choice.shim is None and not unchecked_oom:
            raise TorchShareError(NO_SHIM_TEXT.format(reasons="; ".join(choice.reasons)))
        state = TorchShare(True, str(torch.__version__), choice.shim, [], list(choice.reasons))
        books = TorchBooks(allocator_for, allocators or _bound_allocators(allocator_for, state),
                           current_device)

        def missing(index: int) -> Any:  # the C core asks, with the GIL, on a device's first use
            with _lock:
                allocator = allocator_for(index)
                _adopt(books, state, index, allocator)
                return allocator.native_core

        first = allocator_for(device)
        _native.torch_set_missing(missing)
        try:
            _native.torch_bind(device, first.native_core)
            raw = torch._C._cuda_customAllocator(
                choice.shim.alloc_address if choice.shim is not None else alloc, free)
            torch._C._cuda_changeCurrentAllocator(raw)
        except Exception as exc:
            _native.torch_bind(device, None)
            _native.torch_set_missing(None)
            if "initialized" in str(exc):  # "Can't swap an already initialized allocator"
                raise TorchTooLate(TOO_LATE_TEXT.format(
                    why=f"PyTorch says: {str(exc).splitlines()[0]}")) from None
            raise
        _raw = raw
        _adopt(books, state, device, first)
        books.install(torch._C)
        _patch_classes(torch)
        _books, _state = books, state
        return state


def _bound_allocators(allocator_for: Callable[[int], CachingAllocator], state: TorchShare
                      ) -> Callable[[], dict[int, CachingAllocator]]:
    return lambda: {index: allocator_for(index) for index in state.devices}


def _adopt(books: TorchBooks, state: TorchShare, index: int,
           allocator: CachingAllocator) -> None:
    if index not in state.devices:
        state.devices.append(index)
        state.devices.sort()
        books.adopt(allocator)


def _bind(index: int, allocator: CachingAllocator) -> None:
    from jupyter_gpumem.engine import _native

    if _native.torch_bound(index) is None:
        _native.torch_bind(index, allocator.native_core)
    if _books is not None:
        _adopt(_books, _state, index, allocator)


# -- what one cache cannot do: Note [What one cache cannot do] ----------------------------------

def _patch_classes(torch: Any) -> None:
    graphs = getattr(torch.cuda, "graphs", None)

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(GRAPH_TEXT)

    # torch.cuda.graph(...) before it switches streams (a failed __enter__ is never exited),
    # and CUDAGraph.capture_begin for those who call it themselves
    for owner in (getattr(graphs, "graph", None), getattr(graphs, "CUDAGraph", None)):
        name = "__enter__" if owner is getattr(graphs, "graph", None) else "capture_begin"
        if owner is not None and f"{owner.__name__}.{name}" not in _patched:
            _patched[f"{owner.__name__}.{name}"] = (owner, name, owner.__dict__.get(name))
            setattr(owner, name, refuse)
    tensor = getattr(torch, "Tensor", None)
    original = getattr(tensor, "record_stream", None)
    if tensor is not None and original is not None and "record_stream" not in _patched:
        warned: list[bool] = []

        def record_stream(self: Any, stream: Any) -> Any:
            if not warned:
                warned.append(True)
                warnings.warn(RECORD_STREAM_TEXT, UserWarning, stacklevel=2)
            return original(self, stream)

        _patched["record_stream"] = (tensor, "record_stream", tensor.__dict__.get("record_stream"))
        tensor.record_stream = record_stream


# Note [What one cache cannot do]: PyTorch's pluggable-allocator path, given alloc and free
# only, has no hook for three things its own allocator does. (1) CUDA graphs: a capture asks
# the allocator for a private pool (beginAllocateToPool); without one, blocks the graph uses go
# back to the shared cache after capture and are handed to others while the graph still writes
# to them on replay, and a cudaMalloc during capture breaks the capture ("operation failed due
# to a previous error during capture", seen on an H200). So ``torch.cuda.graph``'s __enter__
# (before it switches to its capture stream: a failed __enter__ is never exited) and
# ``CUDAGraph.capture_begin`` raise GRAPH_TEXT (make_graphed_callables and torch.compile's
# cudagraphs go through them). (2) ``Tensor.record_stream``: no stream reaches us; a block goes
# back to the cache at its free, as with CuPy (Note [No pending frees] in engine/allocator.py):
# the first call warns (RECORD_STREAM_TEXT). (3) cacheInfo, which cuDNN's benchmark mode
# (``torch.backends.cudnn.benchmark = True``) asks from C++ inside a convolution: it raises
# "CUDAPluggableAllocator does not yet support cacheInfo", which no Python patch reaches; keep
# benchmark mode off (PyTorch's default) while sharing (the notebook explains the error).
# PyTorch's own ``expandable_segments`` does not apply either (its allocator is not used); ours
# does, for tensors and arrays alike: ``expandable_segments:True`` in our config.


# -- PyTorch's out-of-memory error, explained by our report -------------------------------------

def is_our_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error our cache raised through PyTorch: PyTorch's
    ``OutOfMemoryError`` (the "c10" shim) or a ``RuntimeError`` (the "std" shim) whose message
    is our report's."""
    from jupyter_gpumem.engine.oom import OOM_HEAD

    return isinstance(exc, RuntimeError) and str(exc).startswith(OOM_HEAD)


def report_for(exc: BaseException) -> OomReport | None:
    """Our ``OomReport`` behind ``exc``, an out-of-memory error PyTorch raised with our message
    (the core keeps the failed call's exception: ``torch_take_error``); None when the one kept
    is not this error's."""
    global _kept_error
    from jupyter_gpumem.engine.allocator import native_core_available
    from jupyter_gpumem.engine.oom import OomReport

    if native_core_available():
        from jupyter_gpumem.engine import _native

        taken = _native.torch_take_error()
        if taken is not None:
            _kept_error = taken
    kept = _kept_error
    report = getattr(kept, "report", None)
    if kept is None or not isinstance(report, OomReport):
        return None
    head = (str(kept).splitlines() or [""])[0]
    return report if head and head in str(exc) else None


def _reset_for_tests(torch: Any = None) -> None:
    """Undo ``share`` as far as a test needs (a real PyTorch cannot be undone): unbind every
    device, forget the state, put PyTorch's functions and methods back."""
    global _state, _books, _raw, _kept_error
    from jupyter_gpumem.engine import _native

    with _lock:
        for index in _state.devices:
            _native.torch_bind(index, None)
        _native.torch_set_missing(None)
        if torch is not None and _books is not None:
            _books.remove(torch._C)
        for owner, name, original in _patched.values():
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        _patched.clear()
        _state, _books, _raw, _kept_error = TorchShare(), None, None, None

