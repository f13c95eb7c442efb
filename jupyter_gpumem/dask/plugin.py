"""``GpuMemPlugin``: our allocator, stats and task labels on every worker of a Dask cluster.

``client.register_plugin(GpuMemPlugin())`` runs ``setup`` on every worker now and on every
worker that joins later. Workers of one process (``LocalCluster(processes=False)``) share the
process's allocators: the first ``setup`` there installs, the last ``teardown`` restores.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from distributed.diagnostics.plugin import WorkerPlugin

from jupyter_gpumem.dask import transfers
from jupyter_gpumem.dask.labels import TaskLabels
from jupyter_gpumem.data.sizes import MAX_DEVICE_SIZE, GiB
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.runtime import binding, registry

#: The name the plugin registers under: registering another one replaces it.
PLUGIN_NAME = "jupyter_gpumem"
#: History entries kept with ``history=True``, as ``record_history``'s default.
DEFAULT_MAX_ENTRIES = 100_000
#: The most history entries an allocator core keeps (its ring's length is a C ``ssize_t``).
MAX_ENTRIES = sys.maxsize


def check_max_entries(name: str, value: object) -> int:
    """``value`` as a history length in [1, ``MAX_ENTRIES``]; ValueError naming ``name``
    otherwise, on the client, before any worker is asked."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ENTRIES:
        raise ValueError(f"{name} must be an int in [1, {MAX_ENTRIES}], got {value!r}")
    return value


@dataclass
class _Process:
    """What the plugin did to this process, to be undone by the last teardown."""

    users: int = 0
    device: str = "cuda"
    backend: registry.Backend = "cuda"  # the registry's backend before setup
    config: AllocatorConfig | None = None  # the default config before setup
    installed_before: bool = False  # our allocator was CuPy's already (a notebook's)
    # the configs of simulated allocators that existed before setup (a notebook's), to put back
    sim_configs: list[tuple[Any, AllocatorConfig]] = field(default_factory=list)
    # puts back distributed's deserializer of received CuPy chunks (Note [Transferred chunks])
    undo_transfers: Callable[[], None] | None = None
    labels: TaskLabels = field(default_factory=lambda: TaskLabels(_allocators))
    worker: str = ""  # the address of the (first) worker set up in this process


class WorkerOom:
    """An allocator's ``oom_error`` on a worker: the error the allocator would raise, naming the
    worker and the tasks running (``worker``, ``tasks`` and a last line of its message). Our
    OutOfMemoryError pickles with them, so the notebook that gets it from ``future.result()``
    can say where it happened (the OOM panel)."""

    def __init__(self, inner: Any, state: _Process) -> None:
        self.inner = inner
        self.state = state

    def __call__(self, report: Any) -> BaseException:
        exc: BaseException = self.inner(report)
        tasks = self.state.labels.running()
        setattr(exc, "worker", self.state.worker)  # noqa: B010 (an attribute of any exception)
        setattr(exc, "tasks", tasks)  # noqa: B010
        where = f"On Dask worker {self.state.worker}" + (
            f", in task {', '.join(repr(k) for k in tasks)}" if tasks else "") + "."
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]}\n{where}", *exc.args[1:])
        return exc


def _name_worker_in_ooms(state: _Process) -> None:
    """Every allocator of the process raises ``WorkerOom``'s errors (new ones too: this runs
    as each task starts)."""
    for allocator in _allocators():
        if not isinstance(allocator.oom_error, WorkerOom):
            allocator.oom_error = WorkerOom(allocator.oom_error, state)


def _restore_ooms() -> None:
    for allocator in _allocators():
        if isinstance(allocator.oom_error, WorkerOom):
            allocator.oom_error = allocator.oom_error.inner


_lock = threading.Lock()
_process: _Process | None = None


def _allocators() -> list[Any]:
    return list(registry.allocators().values())


def process_state() -> _Process | None:
    """This process's plugin state, None when no plugin is set up here."""
    return _process


class GpuMemPlugin(WorkerPlugin):
    """Install jupyter_gpumem's allocator on every worker, and label allocations with tasks.

    ``device="cuda"`` installs our caching allocator into the worker's CuPy (as ``install()``);
    ``device="sim"`` points the worker's API at a simulated device of ``capacity`` bytes, for
    workers without a GPU (tests, demos). ``config`` is an ``AllocatorConfig`` or PyTorch's
    ``"key:value,..."`` text; ``history`` records allocation history from setup on: ``True``
    for ``DEFAULT_MAX_ENTRIES`` events, an int for that many, ``False`` for stats only;
    ``stacks`` records a Python stack per event. While a task runs, its key labels the events
    (Note [Task labels] in ``jupyter_gpumem.dask.labels``).
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, device: Literal["cuda", "sim"] = "cuda", *,
                 config: AllocatorConfig | str | None = None, history: bool | int = False,
                 stacks: bool = True, capacity: int = 80 * GiB) -> None:
        if device not in ("cuda", "sim"):
            raise ValueError(f"device must be 'cuda' or 'sim', got {device!r}")
        if isinstance(config, str):
            config = AllocatorConfig.parse(config)
        elif config is not None and not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig or a str, got "
                            f"{type(config).__name__}")
        if isinstance(history, bool):
            max_entries = DEFAULT_MAX_ENTRIES if history else 0
        elif isinstance(history, int) and 1 <= history <= MAX_ENTRIES:
            max_entries = history
        else:
            raise ValueError(f"history must be a bool or an int in [1, {MAX_ENTRIES}], got "
                             f"{history!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                not 0 < capacity <= MAX_DEVICE_SIZE:
            raise ValueError(f"capacity must be an int of bytes in [1, {MAX_DEVICE_SIZE}] (the "
                             f"largest device the allocator takes), got {capacity!r}")
        self.device = device
        self.config = config
        self.max_entries = max_entries
        self.stacks = bool(stacks)
        self.capacity = capacity

    def __repr__(self) -> str:
        return (f"GpuMemPlugin(device={self.device!r}, history={self.max_entries or False}, "
                f"config={self.config.as_text() if self.config else None!r})")

    # -- the worker's life ---------------------------------------------------------------------

    def setup(self, worker: Any) -> None:
        global _process
        with _lock:
            if _process is not None:
                _process.users += 1
                return
            state = _Process(users=1, device=self.device, backend=registry.backend(),
                             config=registry.default_config(),
                             installed_before=binding.installed(),
                             worker=str(getattr(worker, "address", "")))
            if self.device == "sim":
                if self.config is not None:
                    registry.set_default_config(self.config)
                allocators = registry.use_simulated_device(self.capacity, config=self.config)
                if self.config is not None:
                    # simulated devices made earlier in this process are reused: give them the
                    # plugin's config too, and remember theirs
                    for allocator in allocators:
                        if allocator.config != self.config:
                            state.sim_configs.append((allocator, allocator.config))
                            allocator.set_config(self.config)
            else:
                binding.install(self.config)
                state.undo_transfers = transfers.route_cupy_transfers()
            if self.max_entries:
                for allocator in _allocators():
                    allocator.record_history(True, stacks=self.stacks,
                                             max_entries=self.max_entries)
            _name_worker_in_ooms(state)
            _process = state

    def teardown(self, worker: Any) -> None:
        global _process
        with _lock:
            state = _process
            if state is None:
                return
            state.users -= 1
            if state.users > 0:
                return
            _process = None
            _restore_ooms()
            if self.max_entries:
                for allocator in _allocators():
                    allocator.record_history(False)
            if state.device == "sim":
                for allocator, config in state.sim_configs:
                    allocator.set_config(config)
                if state.backend == "cuda":
                    registry.use_cuda()
            if state.undo_transfers is not None:
                state.undo_transfers()
            if state.device != "sim" and not state.installed_before:
                binding.uninstall()
            if state.config is not None:
                registry.set_default_config(state.config)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        state = _process
        if state is not None:
            state.labels.transition(key, start, finish)
            if finish == "executing":
                _name_worker_in_ooms(state)
