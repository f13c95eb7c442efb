"""``Host``: what the magics and their subcommands use of the loaded extension.

``Extension`` (in ``extension``) is the one host; it makes the magics and hands itself in. The
magics and subcommands see it only through this protocol, so they never import the extension
and the imports run one way: extension → magics → subcommands → host, ledger, settings, output.
"""

from __future__ import annotations

from typing import Any, Protocol

from IPython.core.error import UsageError

from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.notebook.ledger import Ledger
from jupyter_gpumem.notebook.settings import GpuMem
from jupyter_gpumem.runtime import registry

__all__ = ["Host", "no_gpu_message", "require_allocator"]


class Host(Protocol):
    """The loaded extension of one shell, as its magics see it."""

    ledger: Ledger  # the per-cell ledger
    settings: GpuMem
    gpu_reason: str | None  # why no GPU is usable, found on load; None with a GPU
    live: Any  # the LiveSession of a bare %gpumem, if any
    last_oom: Any  # the last OomPanel shown, if any

    def stop_live(self) -> None:
        """Stop the live view and any sampler thread still running."""

    def apply_history(self, allocator: CachingAllocator) -> None:
        """Give ``allocator`` the history mode of the settings."""

    def install_binding(self) -> None:
        """On a GPU, make our allocator CuPy's, if the settings say so and it is not already."""


def no_gpu_message(host: Host) -> str:
    """Why there is no allocator to talk to, in a few words."""
    return f"no GPU here: {host.gpu_reason or 'no CUDA device is visible'}"


def require_allocator(host: Host) -> CachingAllocator:
    """The current allocator; a UsageError saying why and what to do when there is none."""
    allocator = registry.current_allocator()
    if allocator is None:
        raise UsageError(f"jupyter_gpumem: {no_gpu_message(host)}; run %gpumem device sim to "
                         "use a simulated device.")
    return allocator
