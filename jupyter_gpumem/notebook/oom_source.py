"""Which memory source an out-of-memory error is of, and the explainer's steps in its words.

``source_of_oom`` finds the source: the first of the current sources whose ``is_oom`` holds,
else ours (our ``OutOfMemoryError`` and CuPy's are explained whichever sources are picked). The
next steps (``oom_panel.advice``, ``engine.oom.advice``) are written for our allocator;
``said_for`` says them for another source, from what it gives: its arrays' noun (its first
``owners`` entry) and how its allocator config is set (``replay_setting``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from jupyter_gpumem.runtime import registry
from jupyter_gpumem.sources.cupy import CupySource
from jupyter_gpumem.sources.protocol import MemorySource
from jupyter_gpumem.sources.registry import (
    BUILT_IN,
    current_sources,
    get_source,
    selected,
    source_names,
)

__all__ = ["is_oom_error", "said_for", "source_of_oom", "unpicked_source_of"]


def is_oom_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an out-of-memory error of a current source (``is_oom``), or ours or
    CuPy's (by class: CuPy is not imported) whichever sources are picked."""
    return source_of_oom(exc) is not None or _ours(exc)


def source_of_oom(exc: BaseException | None) -> MemorySource | None:
    """The source whose out-of-memory error ``exc`` is: the first of the current sources whose
    ``is_oom`` holds, else ours for our error or CuPy's; None for any other error.

    Ours is read at the allocator of the device the error's report names, when that is not
    the current one (an error raised on another device)."""
    if exc is None:
        return None
    for source in current_sources():
        try:
            if source.is_oom(exc):
                return _at_device(source, exc)
        except Exception:  # a source's check that fails says nothing of this error
            continue
    return _at_device(get_source("cupy"), exc) if _ours(exc) else None


def unpicked_source_of(exc: BaseException | None) -> MemorySource | None:
    """A source the views do not read whose out-of-memory error ``exc`` is (PyTorch's error
    while the views read CuPy): so the cell can say how to have it explained. Only sources
    already made, or built in with their library imported already, are asked: nothing is
    imported for it."""
    if exc is None:
        return None
    picked = selected()
    for name in source_names():
        if name in picked or (name in BUILT_IN and name != "cupy" and name not in sys.modules):
            continue
        try:
            found = get_source(name)
            if found.is_oom(exc):
                return found
        except Exception:  # a source that cannot be made or asked says nothing of it
            continue
    return None


def _ours(exc: BaseException | None) -> bool:
    """Our ``OutOfMemoryError`` or CuPy's (by class), picked or not."""
    return exc is not None and get_source("cupy").is_oom(exc)


def _at_device(source: MemorySource, exc: BaseException) -> MemorySource | None:
    """``source``, or for our allocator the one of the device ``exc``'s report names (None
    when that device has none here: the error's report alone is shown)."""
    if not isinstance(source, CupySource):
        return source
    device = getattr(source.oom_report(exc), "device", None)
    if not isinstance(device, int):
        return source
    allocator = registry.allocators().get(device)
    if allocator is None:
        return None
    if source.unavailable() is None and source.allocator is allocator:
        return source
    return CupySource(allocator)


#: The config line of ``engine.oom.advice``'s steps: our allocator's.
_OUR_CONF = re.compile(r"`JUPYTER_GPUMEM_ALLOC_CONF=([^`]+)` \(or `%gpumem config [^`]+`\)")
#: A ``replay_setting`` that names an environment variable: "`NAME` and what to know".
_SETTING = re.compile(r"^`([A-Za-z_][A-Za-z0-9_]*)`(.*)$")
_FREE = "free memory you no longer need"


def said_for(source: MemorySource | None, steps: Iterable[str]) -> list[str]:
    """``steps`` (``advice``'s, written for our allocator) in the words of ``source``: its
    arrays' noun ("tensors", from its first owner's name) in the step that frees memory, and
    its way of setting an allocator config (its ``replay_setting``: "`PYTORCH_CUDA_ALLOC_CONF`
    (before PyTorch first allocates)") in a step that sets one; a step that sets a config is
    left out for a source that has no way to (None). Our allocator's steps stay as they are."""
    setting = source.replay_setting() if source is not None else None
    if source is None or (setting is not None and "JUPYTER_GPUMEM_ALLOC_CONF" in setting):
        return list(steps)
    owners = source.owners
    word = owners[0].name.split()[-1].lower() if owners else "array"
    noun = word if word.endswith("s") else word + "s"
    out = []
    for step in steps:
        if step.startswith(_FREE):
            out.append(f"{_FREE}: `del` the {noun} holding it.")
        elif _OUR_CONF.search(step) is None:
            out.append(step)
        elif setting is not None:
            out.append(_OUR_CONF.sub(lambda m: _config_line(setting, m.group(1)), step))
    return out


def _config_line(setting: str, conf: str) -> str:
    """``conf`` (``max_split_size_mb:64``) set the way ``setting`` says."""
    named = _SETTING.match(setting)
    if named is not None:
        return f"`{named.group(1)}={conf}`{named.group(2)}"
    return f"`{conf}` (set with {setting})"
