"""``GpuMemPlugin``: our allocator, stats and task labels on every worker of a Dask cluster.

``client.register_plugin(GpuMemPlugin())`` runs ``setup`` on every worker now and on every
worker that joins later. Workers of one process (``LocalCluster(processes=False)``) share the
process's allocators: the first ``setup`` there installs, the last ``teardown`` restores, and a
plugin of other settings registered in its place replaces it whole. An allocator that already
records history (a notebook's, under in-process workers) keeps its own recording, before and
after. A ``setup`` that fails puts back what it changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from distributed.diagnostics.plugin import WorkerPlugin

from jupyter_gpumem.dask import transfers
from jupyter_gpumem.dask.labels import TaskLabels
from jupyter_gpumem.data.sizes import MAX_DEVICE_SIZE, MAX_HISTORY_ENTRIES, GiB
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.runtime import binding, registry

#: The name the plugin registers under: registering another one replaces it.
PLUGIN_NAME = "jupyter_gpumem"
#: History entries kept with ``history=True``, as ``record_history``'s default.
DEFAULT_MAX_ENTRIES = 100_000
MAX_ENTRIES = MAX_HISTORY_ENTRIES


def check_flag(name: str, value: object) -> bool:
    """``value`` if it is a bool; ValueError naming ``name`` otherwise (``stacks="no"`` read as
    true)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_max_entries(name: str, value: object) -> int:
    """``value`` as a history length in [1, ``MAX_ENTRIES``]; ValueError naming ``name``
    otherwise, on the client, before any worker is asked."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ENTRIES:
        raise ValueError(f"{name} must be an int in [1, {MAX_ENTRIES}], got {value!r}")
    return value


@dataclass
class _Process:
    """What the plugin did to this process, to be undone by the last teardown."""

    # the workers of this process set up (ids of their Worker objects): teardown undoes it all
    # when the last leaves, and a worker whose setup failed, or never ran, counts for nothing
    workers: set[int] = field(default_factory=set)
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
    settings: tuple[Any, ...] = ()  # the settings of the plugin that set the process up
    installed: bool = False  # setup installed our allocator into CuPy
    # the allocators whose recording setup started (one that recorded already is left alone)
    recorded: list[Any] = field(default_factory=list)
    trace: str = ""  # the cluster trace started last on this process ("" for none)

    @property
    def users(self) -> int:
        """How many workers of this process are set up."""
        return len(self.workers)


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


def _undo(state: _Process) -> None:
    """Put back what ``GpuMemPlugin._apply`` changed in this process (as far as it got)."""
    _restore_ooms()
    for allocator in state.recorded:
        allocator.record_history(False)
    if state.device == "sim":
        for allocator, config in state.sim_configs:
            allocator.set_config(config)
        if state.backend == "cuda":
            registry.use_cuda()
    if state.undo_transfers is not None:
        state.undo_transfers()
    if state.installed and not state.installed_before:
        binding.uninstall()
    if state.config is not None:
        registry.set_default_config(state.config)


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
        self.stacks = check_flag("stacks", stacks)
        self.capacity = capacity

    def __repr__(self) -> str:
        return (f"GpuMemPlugin(device={self.device!r}, history={self.max_entries or False}, "
                f"config={self.config.as_text() if self.config else None!r})")

    # -- the worker's life ---------------------------------------------------------------------

    def _settings(self) -> tuple[Any, ...]:
        return (self.device, self.config, self.max_entries, self.stacks, self.capacity)

    def setup(self, worker: Any) -> None:
        global _process
        with _lock:
            others: set[int] = set()
            if _process is not None:
                if _process.settings == self._settings():
                    _process.workers.add(id(worker))
                    return
                # a plugin of other settings replaces ours: Dask tears the old one down and sets
                # the new one up worker by worker, so in-process workers find the old one still
                # set up here. Undo it and apply the new one for them all.
                others = _process.workers
                _undo(_process)
                _process = None
            state = _Process(workers={*others, id(worker)}, device=self.device,
                             backend=registry.backend(),
                             config=registry.default_config(),
                             installed_before=binding.installed(),
                             worker=str(getattr(worker, "address", "")),
                             settings=self._settings())
            try:
                self._apply(state)
            except BaseException:
                _undo(state)  # a setup that fails leaves the process as it found it
                raise
            _process = state

    def _apply(self, state: _Process) -> None:
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
            state.installed = True
            state.undo_transfers = transfers.route_cupy_transfers()
        if self.max_entries:
            for allocator in _allocators():
                if allocator.recording:  # a notebook's (in-process workers): left as it is
                    continue
                allocator.record_history(True, stacks=self.stacks,
                                         max_entries=self.max_entries)
                state.recorded.append(allocator)
        _name_worker_in_ooms(state)

    def teardown(self, worker: Any) -> None:
        global _process
        with _lock:
            state = _process
            if state is None:
                return
            if id(worker) not in state.workers:
                return  # its setup failed, or it was never set up
            state.workers.discard(id(worker))
            if state.workers:
                return
            _process = None
            _undo(state)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        state = _process
        if state is not None:
            state.labels.transition(key, start, finish)
            if finish == "executing":
                _name_worker_in_ooms(state)
