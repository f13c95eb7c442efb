"""The settings of the extension: ``GpuMem``, a traitlets ``Configurable``.

Set them as ``c.GpuMem.<name>`` in ``ipython_config.py``, with ``%config GpuMem.<name> = ...``,
or at run time on ``get_extension(ip).settings``.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, CaselessStrEnum, Float, Int, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from jupyter_gpumem.data.reach import DEFAULT_BUDGET, Budget
from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES
from jupyter_gpumem.data.units import parse_bytes
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.notebook.folded_cells import KEEP_ROWS

__all__ = ["GpuMem"]


class GpuMem(Configurable):
    """Settings of the jupyter_gpumem extension; set them as ``c.GpuMem.<name>`` in
    ``ipython_config.py``, or change them at run time on ``get_extension(ip).settings``."""

    auto_footer = Bool(
        False, help="Print a footer after each cell: Δallocated, peak, reserved, and who "
                    "holds the memory the cell left behind."
    ).tag(config=True)
    record_history = CaselessStrEnum(
        ["off", "state", "all"], default_value="state",
        help="History kept by each allocator: 'off'; 'state' (the stacks of live blocks only, "
             "so the OOM explainer and %gpumem diff can name lines); 'all' (every event too).",
    ).tag(config=True)
    stacks = Bool(True, help="Record Python stacks with history events.").tag(config=True)
    max_entries = Int(100_000, help="Events kept when record_history is 'all'.").tag(config=True)
    alloc_conf = Unicode(
        "", help="Allocator options in PyTorch's key:value,key:value form, applied on load.",
    ).tag(config=True)
    simulate_without_gpu = Bool(
        False, help="With no GPU visible, switch to a simulated device on load.",
    ).tag(config=True)
    sim_capacity = Unicode("80GiB", help="Capacity of the simulated device.").tag(config=True)
    keep_states = Int(200, help="Cells whose end state is kept for %gpumem diff.").tag(config=True)
    keep_rows = Int(KEEP_ROWS, help="Cells whose ledger rows (%gpumem cells) are kept in full; "
                                     "older ones are folded into one summary row.").tag(config=True)
    live_view = Bool(True, help="Show the live widget while %%gpumem_trace runs (needs "
                                "anywidget).").tag(config=True)
    oom_panel = Bool(True, help="Explain out-of-memory errors under the traceback."
                     ).tag(config=True)
    holder_search_ms = Float(
        help="Milliseconds the footer and the OOM explainer may spend looking for who holds a "
             "block; past them, they say the search stopped (default: the holder search's own "
             "budget, 50 ms).",
    ).tag(config=True)
    lab_panel = Bool(
        True, help="In a kernel, talk to JupyterLab's GPU memory panel and cell badges: a comm "
                   "opened on load, each cell's record when it ends, and a few samples a second "
                   "while it runs (only while a frontend listens).",
    ).tag(config=True)
    install_allocator = Bool(True, help="On a GPU, make our allocator CuPy's allocator."
                             ).tag(config=True)
    share_torch = Bool(
        False, help="On load, make PyTorch allocate from the same cache as CuPy (one cache, "
                    "one set of books; %gpumem torch share does it later). It must come before "
                    "PyTorch's first CUDA call, and lasts until the kernel restarts.",
    ).tag(config=True)

    @validate("max_entries")
    def _check_max_entries(self, proposal: Any) -> int:
        return _count_in("max_entries", proposal["value"], 1, MAX_HISTORY_ENTRIES)

    @validate("keep_states")
    def _check_keep_states(self, proposal: Any) -> int:
        return _count_in("keep_states", proposal["value"], 0)

    @validate("keep_rows")
    def _check_keep_rows(self, proposal: Any) -> int:
        return _count_in("keep_rows", proposal["value"], 1)

    @default("holder_search_ms")
    def _default_holder_search_ms(self) -> float:
        return DEFAULT_BUDGET.max_ms  # read when asked: one default for the search and the setting

    @validate("holder_search_ms")
    def _check_holder_search_ms(self, proposal: Any) -> float:
        try:
            return Budget(max_ms=proposal["value"]).max_ms
        except ValueError as exc:
            raise TraitError(f"holder_search_ms: {exc}") from None

    @validate("alloc_conf")
    def _check_alloc_conf(self, proposal: Any) -> str:
        text = str(proposal["value"])
        try:
            AllocatorConfig.parse(text)
        except (ValueError, TypeError) as exc:
            raise TraitError(f"alloc_conf: {exc}") from None
        return text

    @validate("sim_capacity")
    def _check_sim_capacity(self, proposal: Any) -> str:
        text = str(proposal["value"])
        try:
            if parse_bytes(text) <= 0:
                raise ValueError(f"sim_capacity must be positive, got {text!r}")
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return text


def _count_in(name: str, value: Any, least: int, most: int | None = None) -> int:
    """``value`` as an int in [least, most]; TraitError naming the setting otherwise."""
    n = int(value)
    if n < least or (most is not None and n > most):
        bound = f">= {least}" if most is None else f"in [{least}, {most}]"
        raise TraitError(f"{name} must be {bound}, got {n}")
    return n
