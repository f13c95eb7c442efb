"""``%gpumem torch [share]``: one cache for CuPy and PyTorch (``runtime.torch_share``), from a
notebook; sharing at ``%load_ext`` time (``GpuMem.share_torch``); and the one line that explains
an error of PyTorch that only sharing causes (cuDNN's benchmark mode).
"""

from __future__ import annotations

import sys
from argparse import Namespace

from IPython.core.error import UsageError

from jupyter_gpumem.notebook.host import Host
from jupyter_gpumem.notebook.output import usage_error
from jupyter_gpumem.runtime import torch_share

__all__ = ["UNLOAD_TEXT", "do_torch", "share_on_load", "torch_error_hint"]

#: What ``%unload_ext`` says while PyTorch allocates from our cache.
UNLOAD_TEXT = (
    "jupyter_gpumem: PyTorch keeps allocating from jupyter_gpumem's cache until the kernel "
    "restarts (PyTorch's allocator cannot change once chosen), and torch.cuda's memory "
    "functions keep answering from it; CuPy has its own allocator back.")

_CACHE_INFO = "does not yet support cacheInfo"


def do_torch(host: Host, args: Namespace) -> None:
    """``%gpumem torch``: whether PyTorch shares our cache; ``%gpumem torch share``: share it
    (before PyTorch's first CUDA call)."""
    if not args.values:
        print(f"gpumem: {_state_words()}")
        return
    if args.values[0].lower() != "share":
        raise usage_error(f"torch takes share (or nothing), got {args.values[0]!r}")
    try:
        state = _share()
    except (ImportError, RuntimeError, ValueError) as exc:  # TorchShareError, NoDeviceError, ...
        raise UsageError(_one_paragraph(exc)) from None
    print(f"gpumem: {state.text()}")


def _state_words() -> str:
    state = torch_share.torch_share_state()
    if state.shared:
        return state.text()
    torch = sys.modules.get("torch")
    if torch is None:
        return ("PyTorch is not imported; `%gpumem torch share` imports it and makes it allocate "
                "from jupyter_gpumem's cache (before any PyTorch call that touches the GPU)")
    try:
        started = bool(torch.cuda.is_initialized())
    except Exception:  # a PyTorch without CUDA
        started = False
    if started:
        return ("PyTorch uses its own allocator, and has started CUDA: too late to share in "
                "this process (restart the kernel and run `%gpumem torch share` first, or set "
                "c.GpuMem.share_torch = True)")
    return ("PyTorch uses its own allocator; `%gpumem torch share` makes it allocate from "
            "jupyter_gpumem's cache (now, before any PyTorch call that touches the GPU)")


def _share() -> torch_share.TorchShare:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"jupyter_gpumem: PyTorch is not installed ({exc})") from None
    return torch_share.install_torch()


def _one_paragraph(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if text.startswith("jupyter_gpumem") else f"jupyter_gpumem: {text}"


def share_on_load() -> str:
    """Share the cache with PyTorch as ``%load_ext`` does with ``GpuMem.share_torch`` on, and
    say in one line what happened (it never raises: a notebook still loads)."""
    try:
        state = _share()
    except Exception as exc:  # every reason not to share is said, and loading goes on
        return _one_paragraph(exc)
    return f"jupyter_gpumem: {state.text()}."


def torch_error_hint(exc: BaseException | None) -> str | None:
    """One line for an error of PyTorch that comes from sharing our cache: cuDNN's benchmark
    mode asks PyTorch's allocator for its largest cached block, which PyTorch's pluggable path
    cannot answer (Note [What one cache cannot do]). None for anything else."""
    if exc is None or not torch_share.shared() or _CACHE_INFO not in str(exc):
        return None
    return ("cuDNN's benchmark mode (torch.backends.cudnn.benchmark = True) asks PyTorch's "
            "allocator for its largest cached block, which PyTorch cannot ask a shared cache: "
            "set torch.backends.cudnn.benchmark = False while PyTorch shares jupyter_gpumem's "
            "cache.")
