"""Allocation sites: the line of the user's code behind a stack, named one way everywhere.

A stack is innermost first. The site is its first frame of the user's code: frames of libraries
(CuPy, numpy, IPython, PyTorch's own Python package, those of any source's ``library_files``
registered with ``register_library_files``, installed packages, Python's frozen modules) and
native frames are passed over. PyTorch's ``stacks="all"`` puts C++ frames first:
``??:0`` when unsymbolized, else a ``.cpp``/``.h`` file or a shared library. A native frame is
one whose file is ``??`` or does not end in ``.py``; names in angle brackets (``<ipython-input-3-
...>``, ``<string>``) are Python's own names for code without a file, and count as user code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from jupyter_gpumem.data.schema import Frame, Snapshot

#: Frames in these files belong to libraries, not to the user's code.
LIBRARY_MARKERS = ("site-packages", "dist-packages", "/cupy/", "/cupyx/", "/cupy_backends/",
                   "/numpy/", "<frozen ", "\\cupy\\", "\\numpy\\", "/IPython/", "\\IPython\\",
                   "/torch/", "\\torch\\")
_registered: tuple[str, ...] = ()


def register_library_files(markers: Iterable[str]) -> None:
    """Count frames whose file name holds one of ``markers`` (``"/jax/"``) as a library's from
    now on, in every view that names a line (``sources.registry`` registers every source's
    ``library_files``). TypeError, and nothing registered, when one is not a string."""
    global _registered
    markers = tuple(markers)
    for marker in markers:
        if not isinstance(marker, str) or not marker:
            raise TypeError(f"a library file marker is a non-empty string, got {marker!r}")
    new = tuple(m for m in dict.fromkeys(markers)
                if m not in LIBRARY_MARKERS and m not in _registered)
    if new:
        _registered += new


def library_markers() -> tuple[str, ...]:
    """Every marker of a library's file: ``LIBRARY_MARKERS``, then those registered."""
    return LIBRARY_MARKERS + _registered


def reset_library_files() -> None:
    """Forget the markers registered (tests)."""
    global _registered
    _registered = ()

_IPYTHON_INPUT = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")


def is_native_file(filename: str) -> bool:
    """Whether a frame is native code (C++ in a PyTorch ``stacks="all"`` stack): ``??`` or a
    file that is not Python source, such as ``CUDACachingAllocator.cpp`` or ``libtorch.so``."""
    if filename.startswith("<") and filename.endswith(">"):
        return filename.startswith("<frozen ")
    return not filename.endswith(".py")


def is_library_file(filename: str) -> bool:
    """Whether a frame's file belongs to CuPy, numpy, IPython, PyTorch, a library whose markers
    were registered (``register_library_files``: JAX's), an installed package or Python, or is
    native code (``is_native_file``)."""
    return (any(marker in filename for marker in LIBRARY_MARKERS)
            or any(marker in filename for marker in _registered) or is_native_file(filename))


def cell_of(filename: str, cell_files: Mapping[str, int] | None = None) -> int | None:
    """The notebook cell whose source ``filename`` is (from ``cell_files``, or IPython's
    ``<ipython-input-N-…>`` names), or None."""
    cell = cell_files.get(filename) if cell_files else None
    if cell is None:
        m = _IPYTHON_INPUT.match(filename)
        cell = int(m.group(1)) if m else None
    return cell


#: Key of ``snapshot["jupyter_gpumem"]``: the notebook's cells by the file names their frames
#: carry (``{"/tmp/ipykernel_1/4024635250.py": 5}``), so a saved file names ``cell [5] line 5``.
CELL_FILES_KEY = "cell_files"


def saved_cell_files(snapshot: Snapshot, cell_files: Mapping[str, int] | None = None
                     ) -> dict[str, int]:
    """The cells a snapshot's frames were saved with (``CELL_FILES_KEY``; entries that are not
    a name and a cell number are left out), updated with ``cell_files``."""
    info = snapshot.get("jupyter_gpumem")
    saved = info.get(CELL_FILES_KEY) if isinstance(info, dict) else None
    out = {k: v for k, v in saved.items() if type(k) is str and type(v) is int
           } if isinstance(saved, dict) else {}
    out.update(cell_files or {})
    return out


def with_cell_files(snapshot: Snapshot, cell_files: Mapping[str, int] | None) -> Snapshot:
    """``snapshot`` (a shallow copy) carrying the cells of ``cell_files`` that its frames name,
    under ``CELL_FILES_KEY``; ``snapshot`` itself when none does."""
    if not cell_files:
        return snapshot
    named: set[str] = set()
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            named.update(f["filename"] for f in b["frames"])
    from jupyter_gpumem.data.columns import TraceColumns

    for trace in snapshot["device_traces"]:
        lists = (trace.stacks if isinstance(trace, TraceColumns)  # each stack once, no dicts
                 else (e.get("frames") or () for e in trace))
        for frames in lists:
            named.update(f["filename"] for f in frames)
    found = {k: v for k, v in cell_files.items() if k in named}
    if not found:
        return snapshot
    info = dict(snapshot.get("jupyter_gpumem") or {})
    info[CELL_FILES_KEY] = saved_cell_files(snapshot, found)
    out = snapshot.copy()
    out["jupyter_gpumem"] = info
    return out


def site_of(frames: Sequence[Frame], cell_files: Mapping[str, int] | None = None, *,
            full: bool = False) -> str | None:
    """The allocating line: the innermost frame outside libraries, as ``"cell [3] line 2"`` for
    a notebook cell (known from ``cell_files`` or IPython's input names) and ``"train.py:12"``
    otherwise (the whole path with ``full``); None when no such frame is known."""
    for f in frames:
        filename = f["filename"]
        cell = cell_files.get(filename) if cell_files else None
        if cell is None and is_library_file(filename):
            continue
        if cell is None:
            cell = cell_of(filename)
        if cell is not None:
            return f"cell [{cell}] line {f['line']}"
        if full:
            return f"{filename}:{f['line']}"
        base = filename.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{base}:{f['line']}"
    if frames and any(_AUTOGRAD_ENGINE in f["name"] for f in frames):
        return AUTOGRAD_SITE
    return None


#: The site of an allocation made by PyTorch's autograd engine on its own thread (gradients in
#: ``backward()``): its stack (``stacks="all"``) holds C++ frames only, no line of the user's.
AUTOGRAD_SITE = "autograd backward (no Python frame)"
_AUTOGRAD_ENGINE = "torch::autograd::Engine::"


def short_site(site: str) -> str:
    """``"/a/b/train.py:12"`` → ``"train.py:12"``, for labels; cell sites stay as they are."""
    path, _, line = site.rpartition(":")
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{base}:{line}" if path else site
