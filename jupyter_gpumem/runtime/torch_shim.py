"""Which allocator shim PyTorch calls, and making it: Note [The shim reads the error] in
``engine/csrc/torch.c`` says why PyTorch must call a shim and not the C core itself.

``choose_shim`` tries, in order:

1. "c10", compiled against the running PyTorch (its headers and ``libc10``, with the C++
   standard and ``_GLIBCXX_USE_CXX11_ABI`` its own extensions use), kept in the cache folder
   under a name made of the PyTorch version, the ABI flag, the folders and the shim's source,
   so it is compiled once per PyTorch: out of memory raises ``torch.OutOfMemoryError``;
2. "std", built with the package (or compiled now into the cache folder when the package was
   built without a C++ compiler): out of memory raises a ``RuntimeError`` with the same message;
3. none: the caller refuses to share, saying ``ShimChoice.reasons``.

The cache folder is ``$JUPYTER_GPUMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/jupyter_gpumem``, else
``~/.cache/jupyter_gpumem``; one that cannot be written gives way to a temporary folder (the
shim is then compiled again in the next process).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from jupyter_gpumem.engine import _build_shim
from jupyter_gpumem.engine._build_shim import BuildResult, C10Build

__all__ = [
    "CACHE_ENV",
    "Shim",
    "ShimChoice",
    "c10_build_of",
    "cache_dir",
    "choose_shim",
    "load_shim",
]

CACHE_ENV = "JUPYTER_GPUMEM_CACHE_DIR"

ShimKind = Literal["c10", "std"]


@dataclass(frozen=True)
class Shim:
    """A shim loaded and pointed at the C core: ``alloc_address`` is what PyTorch is given."""

    kind: ShimKind
    path: str
    alloc_address: int
    origin: str  # "compiled now", "cached", "built with the package"
    compile_seconds: float | None  # when compiled in this process
    library: Any = field(repr=False, compare=False, default=None)  # the ctypes handle, kept


@dataclass
class ShimChoice:
    """What ``choose_shim`` found: the shim (None when none could be had) and, for each build
    it could not use, why."""

    shim: Shim | None
    reasons: list[str] = field(default_factory=list)


def cache_dir() -> str:
    """The folder compiled shims are kept in (see the module docstring), made if needed."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "jupyter_gpumem")
    folder = os.path.join(base, "torch_shim")
    try:
        os.makedirs(folder, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".w-", delete=True)  # noqa: SIM115
        probe.close()
    except OSError:
        folder = tempfile.mkdtemp(prefix="jupyter_gpumem_shim-")
    return folder


def c10_build_of(torch: Any) -> C10Build:
    """The folders and ABI flag a "c10" shim for this PyTorch is compiled with: from the helpers
    PyTorch's own C++ extensions use (``torch.utils.cpp_extension``), else (that module needs
    setuptools, which a Python 3.12 environment may lack) the same folders inside the torch
    package, ``include`` and ``lib``."""
    abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    try:
        from torch.utils import cpp_extension
    except ImportError:
        root = os.path.dirname(os.path.abspath(torch.__file__))
        include = os.path.join(root, "include")
        return C10Build((include, os.path.join(include, "torch", "csrc", "api", "include")),
                        (os.path.join(root, "lib"),), abi)
    return C10Build(include_dirs=tuple(cpp_extension.include_paths()),
                    library_dirs=tuple(cpp_extension.library_paths()), cxx11_abi=abi)


def _source_digest() -> str:
    with open(_build_shim.SHIM_SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def c10_shim_name(version: str, build: C10Build) -> str:
    """The cache file name of a "c10" shim: PyTorch's version, then a digest of everything the
    binary depends on (version, ABI, folders, the shim's source)."""
    key = "\n".join([version, str(build.cxx11_abi), *build.include_dirs, *build.library_dirs,
                     _source_digest()])
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in version)
    return f"torch_shim-c10-{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def first_error(log: str) -> str:
    """The line of a compiler's output that says what went wrong (its first error), else its
    last line."""
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[-1] if lines
                else "no output")


def load_shim(path: str, kind: ShimKind, origin: str, compile_seconds: float | None,
              alloc: int, error: int) -> Shim:
    """Load the shim at ``path`` and point it at the core's ``alloc`` and ``error`` functions
    (their addresses). OSError when it does not load or is not the kind expected."""
    library = ctypes.CDLL(path, mode=getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2))
    library.jupyter_gpumem_shim_kind.restype = ctypes.c_char_p
    found = library.jupyter_gpumem_shim_kind().decode()
    if found != kind:
        raise OSError(f"{path} is a {found!r} shim, not {kind!r}")
    init = library.jupyter_gpumem_shim_init
    init.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    init.restype = ctypes.c_int
    if init(alloc, error) != 0:
        raise OSError(f"{path}: jupyter_gpumem_shim_init refused the core's functions")
    address = ctypes.cast(library.jupyter_gpumem_shim_alloc, ctypes.c_void_p).value
    if not address:
        raise OSError(f"{path} has no jupyter_gpumem_shim_alloc")
    return Shim(kind, path, int(address), origin, compile_seconds, library)


Builder = Callable[..., BuildResult]


def choose_shim(torch: Any, alloc: int, error: int, *, folder: str | None = None,
                packaged: str = _build_shim.STD_SHIM, build: Builder = _build_shim.build_shim,
                c10: C10Build | None = None) -> ShimChoice:
    """The best shim that can be had here for ``torch`` (see the module docstring), pointed at
    the core's ``alloc`` and ``error`` functions; ``torch`` None tries "std" only. ``c10``
    overrides what ``c10_build_of(torch)`` finds; ``build`` and ``packaged`` are for tests."""
    choice = ShimChoice(None)
    folder = folder or cache_dir()
    if torch is not None:
        try:
            spec = c10 or c10_build_of(torch)
        except Exception as exc:  # an old or odd PyTorch without the helpers
            choice.reasons.append(f"c10 shim: cannot read PyTorch's build folders ({exc})")
        else:
            target = os.path.join(folder, c10_shim_name(str(torch.__version__), spec))
            choice.shim = _cached_or_built(choice, "c10", target, lambda: build(target, c10=spec),
                                           alloc, error)
            if choice.shim is not None:
                return choice
    if os.path.exists(packaged):
        try:
            choice.shim = load_shim(packaged, "std", "built with the package", None, alloc, error)
            return choice
        except OSError as exc:
            choice.reasons.append(f"std shim: the package's {packaged} does not load ({exc})")
    target = os.path.join(folder, f"torch_shim-std-{_source_digest()[:16]}.so")
    choice.shim = _cached_or_built(choice, "std", target, lambda: build(target), alloc, error)
    return choice


def _cached_or_built(choice: ShimChoice, kind: ShimKind, target: str,
                     make: Callable[[], BuildResult], alloc: int, error: int) -> Shim | None:
    if os.path.exists(target):
        try:
            return load_shim(target, kind, "cached", None, alloc, error)
        except OSError as exc:  # a stale or broken file: built again below
            choice.reasons.append(f"{kind} shim: the cached {target} does not load ({exc})")
    made = make()
    if made.path is None:
        choice.reasons.append(f"{kind} shim: compiling failed ({first_error(made.log)})")
        return None
    try:
        return load_shim(made.path, kind, "compiled now", made.seconds, alloc, error)
    except OSError as exc:
        choice.reasons.append(f"{kind} shim: compiled, but it does not load ({exc})")
        return None
