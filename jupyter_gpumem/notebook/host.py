"""``Host``: what the magics and their subcommands use of the loaded extension.

``Extension`` (in ``extension``) is the one host; it makes the magics and hands itself in. The
magics and subcommands see it only through this protocol, so they never import the extension
and the imports run one way: extension → magics → subcommands → host, ledger, settings, output.

The views read memory through the sources (``require_sources``, ``require_source``); only the
controls that exist for our allocator alone (config, limit, reset-peak, empty-cache, the
replay's devices) ask for it (``require_allocator``), through ``runtime.registry``.
"""

from __future__ import annotations

from typing import Any, Protocol

from IPython.core.error import UsageError

from jupyter_gpumem import sources
from jupyter_gpumem.notebook.ledger import Ledger
from jupyter_gpumem.notebook.settings import GpuMem
from jupyter_gpumem.runtime import registry
from jupyter_gpumem.sources import MemorySource
from jupyter_gpumem.sources.cupy import CupySource

__all__ = ["Host", "no_gpu_message", "require_allocator", "require_source", "require_sources",
           "unreadable_sources"]


class Host(Protocol):
    """The loaded extension of one shell, as its magics see it."""

    ledger: Ledger  # the per-cell ledger
    settings: GpuMem
    gpu_reason: str | None  # why no GPU is usable, found on load; None with a GPU
    live: Any  # the LiveSession of a bare %gpumem, if any
    last_oom: Any  # the last OomPanel shown, if any

    def stop_live(self) -> None:
        """Stop the live view and any sampler thread still running."""

    def apply_history(self, ours: CupySource) -> None:
        """Give one of our allocators (``sources.cupy.our_sources``) the history mode of the
        settings."""

    def install_binding(self) -> None:
        """On a GPU, make our allocator CuPy's, if the settings say so and it is not already."""


def no_gpu_message(host: Host) -> str:
    """Why there is no allocator to talk to, in a few words."""
    return f"no GPU here: {host.gpu_reason or 'no CUDA device is visible'}"


def _no_gpu_error(host: Host) -> UsageError:
    return UsageError(f"jupyter_gpumem: {no_gpu_message(host)}; run %gpumem device sim to use a "
                      "simulated device.")


def require_allocator(host: Host) -> Any:
    """Our current allocator (a ``CachingAllocator``, typed loosely: the notebook reads the
    engine only through the sources); a UsageError saying why and what to do when there is
    none."""
    allocator = registry.current_allocator()
    if allocator is None:
        raise _no_gpu_error(host)
    return allocator


def unreadable_sources(names: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """``(name, why)`` of the sources ``names`` (default: those picked) that cannot be read
    now: not made (its library missing, a broken entry point) or not available."""
    out = []
    for name in sources.selected() if names is None else names:
        try:
            why = sources.get_source(name).unavailable()
        except Exception as exc:  # SourceError, or a source that cannot even say
            why = str(exc)
        if why is not None:
            out.append((name, why))
    return out


def require_sources(host: Host) -> list[MemorySource]:
    """The sources picked that can be read now (``sources.current_sources``), in order; a
    UsageError saying why when none can: the machine's reason where there is no GPU (and no
    simulated device in use), else each source's."""
    found = list(sources.current_sources())
    if found:
        return found
    if host.gpu_reason is not None and registry.no_gpu():  # the machine's reason
        raise _no_gpu_error(host)
    why = "; ".join(f"{name}: {reason}" for name, reason in unreadable_sources())
    why = why or "none is picked"
    raise UsageError(f"jupyter_gpumem: no memory source can be read now ({why}).")


def require_source(host: Host, name: str) -> MemorySource:
    """The source ``name`` when it is picked and can be read now; a UsageError saying why not
    (not picked, not made, not available) otherwise. While PyTorch allocates from our cache,
    "torch" is "cupy" (Note [One cache, one source])."""
    name = sources.registry.shared_names((name,))[0]
    for found in sources.current_sources():
        if found.name == name:
            return found
    if name not in sources.selected():
        raise UsageError(f"jupyter_gpumem: the views do not read {name!r} (they read "
                         f"{', '.join(sources.selected())}); %gpumem source {name} reads it.")
    why = dict(unreadable_sources((name,))).get(name, "not readable now")
    raise UsageError(f"jupyter_gpumem: {name!r} cannot be read now: {why}.")
