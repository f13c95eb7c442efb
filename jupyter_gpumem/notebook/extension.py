"""``%load_ext jupyter_gpumem``: the cell hooks, and loading/unloading.

``load(shell)`` does, and ``unload(shell)`` undoes, exactly this:

1. reads the ``GpuMem`` settings (``settings``: traitlets config, so ``ipython_config.py`` can
   set them);
2. on a GPU, installs our caching allocator into CuPy (``binding.install``), and with
   ``share_torch`` makes PyTorch allocate from it too (``runtime.torch_share``; this one step
   cannot be undone, and unload says so); without a GPU, prints one line saying so (or, with
   ``simulate_without_gpu``, switches to a simulated device);
3. registers the ``pre_run_cell``/``post_run_cell`` hooks: the per-cell ledger, the footer and the
   out-of-memory explainer;
4. registers the ``%gpumem`` and ``%%gpumem_trace`` magics;
5. sets each allocator's history mode (``record_history``) when first seen, putting back the
   previous mode on unload;
6. in a kernel, opens the channel to JupyterLab's GPU memory panel and cell badges
   (``lab_channel``), closed on unload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from jupyter_gpumem import sources
from jupyter_gpumem.data.reach import Budget
from jupyter_gpumem.data.units import format_bytes, parse_bytes
from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.notebook.ledger import Ledger, source_label
from jupyter_gpumem.notebook.settings import GpuMem
from jupyter_gpumem.runtime import binding, registry, torch_share
from jupyter_gpumem.sources.cupy import CupySource, HistorySetting

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import CellRecord
    from jupyter_gpumem.notebook.advice import CellCause
    from jupyter_gpumem.notebook.lab_channel import LabChannel

__all__ = ["Extension", "GpuMem", "get_extension", "load", "unload"]


class Extension:
    """Everything one shell's ``%load_ext jupyter_gpumem`` added, so unload can take it away."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.settings = GpuMem(parent=shell)
        self.ledger = Ledger(keep_states=self.settings.keep_states,
                             keep_rows=self.settings.keep_rows,
                             namespace=lambda: shell.user_ns)  # searched for holders
        self.ledger.search_budget = Budget(max_ms=self.settings.holder_search_ms)
        self.settings.observe(self._keep_rows, names=["keep_rows"])
        self.settings.observe(self._search_ms, names=["holder_search_ms"])
        cell_files = getattr(getattr(shell, "compile", None), "_filename_map", None)
        if isinstance(cell_files, dict):
            self.ledger.cell_files = cell_files
        self.previous_sources = sources.selected()
        self.gpu_reason: str | None = None
        self.installed_binding = False
        self.switched_backend: registry.Backend | None = None  # the backend before load
        self.previous_default: AllocatorConfig | None = None
        self.previous_history: dict[int, tuple[CupySource, HistorySetting]] = {}
        self.magics: Any = None
        self.live: Any = None  # the LiveSession of a bare %gpumem, if any
        self.last_oom: Any = None  # the last OomPanel shown
        self.lab: LabChannel | None = None  # the channel to JupyterLab's panel, in a kernel
        self._unsubscribe: Any = None
        self._events: list[tuple[str, Any]] = []
        self._count_offset = _counts_before_running()
        self._help_request = False  # the running cell only asks for help (%gpumem?): no footer

    def _keep_rows(self, change: dict[str, Any]) -> None:
        """``GpuMem.keep_rows`` changed at run time: the ledger keeps that many from now on."""
        self.ledger.keep_rows = change["new"]
        self.ledger.fold()

    def _search_ms(self, change: dict[str, Any]) -> None:
        """``GpuMem.holder_search_ms`` changed at run time: the next holder search has that long."""
        self.ledger.search_budget = dataclasses.replace(self.ledger.search_budget,
                                                        max_ms=change["new"])

    # -- load / unload -------------------------------------------------------------------------

    def load(self) -> None:
        s = self.settings
        configurables = getattr(self.shell, "configurables", None)
        if isinstance(configurables, list):  # so %config GpuMem lists the settings
            configurables.append(s)
        # unload puts back the default config, whatever the settings or %gpumem config changed
        self.previous_default = registry.default_config()
        if s.alloc_conf:
            config = self.previous_default.updated(s.alloc_conf)
            registry.set_default_config(config)
            for allocator in registry.allocators().values():
                allocator.set_config(config)
        self.gpu_reason = cuda_unavailable_reason()
        if self.gpu_reason is None:
            self.install_binding()
            if s.share_torch:
                from jupyter_gpumem.notebook.torch_cmd import share_on_load

                print(share_on_load())
        else:
            self._announce_no_gpu()
        self._events = [("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)]
        for name, fn in self._events:
            self.shell.events.register(name, fn)
        from jupyter_gpumem.notebook.magics import GpuMemMagics
        from jupyter_gpumem.notebook.trace_view import show_trace
        from jupyter_gpumem.render.kernel_views import KERNEL_VIEWS

        if show_trace not in KERNEL_VIEWS:  # a long trace's view asks this kernel for detail
            KERNEL_VIEWS.append(show_trace)
        self.magics = GpuMemMagics(self.shell, self)
        self.shell.register_magics(self.magics)
        self._unsubscribe = registry.on_switch(self._on_switch)
        current = registry.current_allocator()
        if current is not None:
            self.configure(CupySource(current))
        self.open_lab_channel()

    def open_lab_channel(self) -> None:
        """In a kernel, and with ``lab_panel`` on, the channel to JupyterLab's panel and badges."""
        from jupyter_gpumem.notebook import lab_channel

        layer = lab_channel.comm_layer(self.shell) if self.settings.lab_panel else None
        if layer is None:
            return
        self.lab = lab_channel.LabChannel(self.ledger, layer)
        try:
            self.lab.open()
        except Exception as exc:  # a kernel whose comms fail: the rest works without the panel
            self.lab = None
            print(f"jupyter_gpumem: the JupyterLab panel cannot be reached ({exc})")

    def install_binding(self) -> None:
        """Make our allocator CuPy's, if the settings say so and it is not already (on load, and
        on ``%gpumem device cuda``); unload takes it out again."""
        if self.settings.install_allocator and not binding.installed():
            binding.install()
            self.installed_binding = True

    def _announce_no_gpu(self) -> None:
        s = self.settings
        if registry.backend() == "sim":
            print(f"jupyter_gpumem: no GPU here: {self.gpu_reason}; the simulated device is in "
                  "use (%gpumem device cuda switches back).")
        elif s.simulate_without_gpu:
            capacity = parse_bytes(s.sim_capacity)
            self.switched_backend = registry.backend()
            registry.use_simulated_device(capacity)
            print(f"jupyter_gpumem: no GPU here: {self.gpu_reason}; using a simulated "
                  f"{format_bytes(capacity)} device instead.")
        else:
            print(f"jupyter_gpumem: no GPU here: {self.gpu_reason}; run %gpumem device sim to "
                  "try everything on a simulated device.")

    def unload(self) -> None:
        configurables = getattr(self.shell, "configurables", None)
        if isinstance(configurables, list) and self.settings in configurables:
            configurables.remove(self.settings)
        self.stop_live()
        if self.lab is not None:
            self.lab.close()
            self.lab = None
        from jupyter_gpumem.notebook.cluster import stop_live as stop_cluster_views

        stop_cluster_views()  # %gpumem cluster's live view, if one runs
        from jupyter_gpumem.notebook.trace_view import close_trace_views, show_trace
        from jupyter_gpumem.render.kernel_views import KERNEL_VIEWS

        if show_trace in KERNEL_VIEWS:
            KERNEL_VIEWS.remove(show_trace)
        close_trace_views()  # long traces' views: their saved bundles, the detail let go
        self.ledger.end_cell()
        for name, fn in self._events:
            with contextlib.suppress(ValueError):  # already gone
                self.shell.events.unregister(name, fn)
        self._events = []
        if self.magics is not None:
            _unregister_magics(self.shell, self.magics)
            self.magics = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for ours, history in self.previous_history.values():
            ours.restore_history(history)
        self.previous_history.clear()
        if self.installed_binding:
            binding.uninstall()
            self.installed_binding = False
        if torch_share.shared():
            from jupyter_gpumem.notebook.torch_cmd import UNLOAD_TEXT

            print(UNLOAD_TEXT)
        if self.switched_backend == "cuda" and registry.backend() == "sim":
            registry.use_cuda()
        self.switched_backend = None
        if self.previous_default is not None:
            registry.set_default_config(self.previous_default)
            self.previous_default = None
        if sources.selected() != self.previous_sources:
            sources.use_sources(self.previous_sources)

    # -- allocators ----------------------------------------------------------------------------

    def configure(self, ours: CupySource) -> None:
        """Give an allocator of ours seen for the first time, with no history on, the settings'
        mode (unload puts back what it had)."""
        key = id(ours.allocator)
        known = self.previous_history.get(key)
        if known is not None and known[0].allocator is ours.allocator:
            return
        previous = ours.history_setting()
        self.previous_history[key] = (ours, previous)
        if previous is None:  # history the user switched on stays as it is
            self.apply_history(ours)

    def apply_history(self, ours: CupySource) -> None:
        s = self.settings
        ours.record_history(s.record_history, stacks=s.stacks, max_entries=s.max_entries)

    def _on_switch(self, backend: str) -> None:
        allocator = registry.current_allocator()
        if allocator is not None:
            self.configure(CupySource(allocator))

    # -- hooks ---------------------------------------------------------------------------------

    def pre_run_cell(self, info: Any = None) -> None:
        allocator = registry.current_allocator()
        if allocator is not None:
            self.configure(CupySource(allocator))
        source = getattr(info, "raw_cell", "") or ""
        self._help_request = _is_help_request(self.shell, source)
        number = self._running_cell_number(info)
        self.ledger.start_cell(number, source)
        if self.lab is not None:
            from jupyter_gpumem.notebook.lab_channel import request_ids

            self.lab.cell_started(number, *request_ids(self.shell, info))

    def _running_cell_number(self, info: Any) -> int:
        # See Note [Cell numbers]: IPython 9 counts a stored cell before pre_run_cell, 8 after.
        count = int(self.shell.execution_count)
        return count - self._count_offset if getattr(info, "store_history", True) else count

    def post_run_cell(self, result: Any = None) -> None:
        if self.lab is not None:
            self.lab.cell_stopped()  # the cell's span ends where its code did
        if self.live is not None:  # a bare %gpumem's live view: its saved fallback kept recent
            with contextlib.suppress(Exception):
                self.live.refresh()
        with contextlib.suppress(Exception):  # and %gpumem cluster's
            from jupyter_gpumem.notebook.cluster import refresh_live

            refresh_live()
        rows = self.ledger.end_cell()  # one a source read in the cell
        row = rows[0] if rows else None
        number = getattr(result, "execution_count", None)
        stored = getattr(getattr(result, "info", None), "store_history", True)
        if row is not None and stored and isinstance(number, int) and number != row["cell"]:
            self._count_offset += row["cell"] - number  # learn this IPython's way of counting
        if self.lab is not None:
            self.lab.cell_ended(rows, number if isinstance(number, int) else None)
        error = getattr(result, "error_in_exec", None)
        from jupyter_gpumem.notebook.oom_panel import is_oom_error
        from jupyter_gpumem.notebook.oom_source import unpicked_source_of

        if self.settings.oom_panel and error is not None:
            if is_oom_error(error):
                self.show_oom(error, None if row is None else row["cell"])
            elif (other := unpicked_source_of(error)) is not None:
                print(f"jupyter_gpumem: this is an out-of-memory error of {other.title}, which "
                      f"the views do not read: `%gpumem source {other.name}` (or `all`) "
                      "explains the next one.")
        from jupyter_gpumem.notebook.no_gpu import no_gpu_hint
        from jupyter_gpumem.notebook.torch_cmd import torch_error_hint

        for hint in (no_gpu_hint(error), torch_error_hint(error)):
            if hint is not None:
                print(f"jupyter_gpumem: {hint}")
        if self.settings.auto_footer and rows and not self._help_request:
            # IPython wrote a UsageError to stderr; a kernel flushes stdout first at the end of
            # the cell, so without this the footer would come before the error it follows.
            sys.stderr.flush()
            whose = [r.get("memory_source") for r in rows]
            for r in rows:  # labelled by Note [Whose row] (ledger_table)
                print(footer(r, self._reserved_now(r), self.ledger.cause_of(r),
                             source_label(r.get("memory_source"), whose)))

    def show_oom(self, error: BaseException, cell: int | None) -> Any:
        """Explain ``error``, an out-of-memory error, under the cell's output: read from the
        source whose error it is (``oom_panel.source_of_oom``); the panel is kept as
        ``last_oom``."""
        from jupyter_gpumem.notebook.oom_panel import build_panel, source_of_oom
        from jupyter_gpumem.notebook.output import display

        panel = build_panel(error, source_of_oom(error), ledger=self.ledger,
                            namespace=self.shell.user_ns, cell=cell)
        self.last_oom = panel
        display(panel)
        return panel

    def _reserved_now(self, row: CellRecord) -> int:
        """The reserved bytes now of the source that recorded ``row`` (a row of the last cell)."""
        src = self.ledger.source_of(row)
        try:
            return src.memory_reserved() if src is not None else 0
        except Exception:  # a source that cannot be read any more
            return 0

    # -- the live view -------------------------------------------------------------------------

    def stop_live(self) -> None:
        """Stop the live view of a bare ``%gpumem`` and any sampler thread still running."""
        live, self.live = self.live, None
        if live is not None:
            with contextlib.suppress(Exception):  # a closed widget: nothing left to stop
                live.stop()
        widget = sys.modules.get("jupyter_gpumem.notebook.widget")
        stop_all = getattr(widget, "stop_all_sessions", None)
        if stop_all is not None:
            stop_all()


def _is_help_request(shell: Any, source: str) -> bool:
    """Whether a cell only asks for help (``%gpumem?``, ``obj??``): IPython turns it into a call
    of its ``pinfo`` magics and nothing else."""
    if "?" not in source:
        return False
    try:
        code = shell.transform_cell(source).strip()
    except Exception:  # a cell IPython cannot transform runs and fails on its own
        return False
    calls = code.splitlines()
    return bool(calls) and all(c.startswith(("get_ipython().run_line_magic('pinfo",
                                             "get_ipython().run_line_magic('psearch"))
                               for c in calls)


def footer(row: CellRecord, reserved: int, cause: CellCause | None = None,
           label: str | None = None) -> str:
    """The footer ``%gpumem auto on`` prints after each cell (``advice.footer_text``)."""
    from jupyter_gpumem.notebook.advice import footer_text

    return footer_text(row, reserved, cause, label)


def _unregister_magics(shell: Any, magics: Any) -> None:
    manager = shell.magics_manager
    for kind in ("line", "cell"):
        table = manager.magics[kind]
        for name in [n for n, fn in table.items() if getattr(fn, "__self__", None) is magics]:
            del table[name]
    by_name = manager.registry
    for name in [n for n, m in by_name.items() if m is magics]:
        del by_name[name]
    configurables = getattr(shell, "configurables", None)  # register_magics added it there
    if isinstance(configurables, list) and magics in configurables:
        configurables.remove(magics)


def _counts_before_running() -> int:
    """1 where IPython numbers a stored cell before ``pre_run_cell`` (IPython 9), else 0."""
    import IPython

    return 1 if IPython.version_info[0] >= 9 else 0


# Note [Cell numbers]: the ledger and the history tag a cell with the number IPython shows for
# it. IPython 8 raises ``execution_count`` after a stored cell ran, IPython 9 before
# ``pre_run_cell`` fires, so the running cell is ``execution_count`` or one less. The version
# gives the first guess; every ``post_run_cell`` checks it against the result's own number and
# corrects the offset for the cells after it.

_extensions: dict[int, Extension] = {}


def get_extension(shell: Any = None) -> Extension | None:
    """The loaded extension of ``shell`` (default: the running IPython), if any."""
    if shell is None:
        if "IPython" not in sys.modules:
            return None
        from IPython.core.getipython import get_ipython

        get: Any = get_ipython
        shell = get()
    return _extensions.get(id(shell)) if shell is not None else None


def load(shell: Any) -> None:
    """Load the extension into ``shell``; a second load is a no-op."""
    if id(shell) in _extensions:
        return
    ext = Extension(shell)
    ext.load()
    _extensions[id(shell)] = ext


def unload(shell: Any) -> None:
    """Undo ``load(shell)``."""
    ext = _extensions.pop(id(shell), None)
    if ext is not None:
        ext.unload()
