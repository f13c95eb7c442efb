"""Shared fixtures: a simulated device with a manual clock, and a guard on global state."""

from __future__ import annotations

import pytest

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ns=1_000_000, tick_ns=1_000)


@pytest.fixture
def device(clock: ManualClock) -> SimulatedDevice:
    return SimulatedDevice(8 * GiB, clock=clock)


@pytest.fixture
def allocator(device: SimulatedDevice) -> CachingAllocator:
    a = CachingAllocator(device, debug=True)
    yield a
    a.check_invariants()


@pytest.fixture(autouse=True, scope="session")
def _holder_searches_have_time():
    """A holder search called without a budget gets a minute, not the 50 ms a user's footer gets:
    a busy test machine must not cut a search whose whole answer a test checks. The setting
    ``GpuMem.holder_search_ms`` defaults to it, so shell tests' footers and OOM panels get the
    minute too. (Tests of the cut pass their own budget and clock.)"""
    from jupyter_gpumem.data.reach import DEFAULT_BUDGET

    usual = DEFAULT_BUDGET.max_ms
    object.__setattr__(DEFAULT_BUDGET, "max_ms", 60_000.0)  # a frozen dataclass, shared by all
    yield
    object.__setattr__(DEFAULT_BUDGET, "max_ms", usual)


# -- GPU tests, and the guard on global state (the IPython extension's tests rely on both) -------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests, with the reason, where CuPy sees no CUDA device."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _guard_global_state():
    """Fail a test that leaves the runtime on another backend or another default config, leaks
    blocks of the runtime's allocators, or leaves our allocator installed in CuPy; then put things
    right."""
    from jupyter_gpumem.runtime import binding, registry

    backend = registry.backend()
    installed = binding.installed()
    config = registry.default_config()
    yield
    problems = []
    if registry.default_config() != config:
        problems.append(f"the default allocator config was left at {registry.default_config()}")
        registry.set_default_config(config)
    for name, table in (("simulated", registry._sim), ("CUDA", registry._cuda)):
        for index, a in list(table.items()):
            leaked = a.memory_allocated()
            if leaked:
                problems.append(f"{name} device {index} still holds {leaked} B of live blocks")
                for block in a.state().blocks:
                    if block.allocated:
                        a.free(block.address)
    if registry.backend() != backend:
        problems.append(f"the runtime was left on the {registry.backend()!r} backend")
        if backend == "cuda":
            registry.use_cuda()
        else:
            registry.use_simulated_device()
    if binding.installed() != installed:
        problems.append("the CuPy allocator install was changed and not undone")
        if installed:
            binding.install()
        else:
            binding.uninstall()
    from jupyter_gpumem import sources

    if sources.selected() != ("cupy",):
        problems.append(f"the views were left on the sources {sources.selected()}")
        sources.use_sources(("cupy",))
    if problems:
        pytest.fail("; ".join(problems))


# -- a real IPython shell on a simulated device, for the extension's tests ------------------------


@pytest.fixture
def sim():
    """A fresh simulated 1 GiB device as the runtime's backend; back to CUDA afterwards."""
    from jupyter_gpumem.runtime import registry

    allocators = registry.use_simulated_device(1 * GiB, fresh=True)
    yield allocators[0]
    registry.use_cuda()  # blocks left live are reported by _guard_global_state


@pytest.fixture
def shell():
    """The process's InteractiveShell, cleared; the extension unloaded afterwards."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.reset(new_session=True)  # a new history session
    ip.execution_count = 1  # IPython 9's reset leaves it one further on than IPython 8's
    yield ip
    from jupyter_gpumem.notebook import extension as _extension

    if "jupyter_gpumem" in ip.extension_manager.loaded:
        ip.extension_manager.unload_extension("jupyter_gpumem")
    _extension.unload(ip)
    ip.reset(new_session=True)


@pytest.fixture
def run(shell):
    """``run(source)`` runs a cell in ``shell`` (history stored), capturing its outputs; returns
    ``(result, captured)`` where captured has ``.stdout``, ``.stderr`` and ``.outputs``."""
    from IPython.utils.capture import capture_output

    def run_cell(source: str):
        with capture_output() as captured:
            result = shell.run_cell(source, store_history=True)
        return result, captured

    return run_cell


@pytest.fixture
def gm(shell, run, sim):
    """The extension loaded on a fresh simulated 1 GiB device, the live view off, with
    ``g`` (jupyter_gpumem) and ``MiB`` in the shell."""
    from jupyter_gpumem.notebook.extension import get_extension

    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    ext = get_extension(shell)
    ext.settings.live_view = False
    run("import jupyter_gpumem as g\nMiB = 1 << 20")
    return ext


# -- the notebook of every output, run once by nbclient -------------------------------------------


@pytest.fixture(scope="session")
def every_output_notebook(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The notebook of ``every_output.CELLS`` run by nbclient (its widget state stored, as nbclient
    does by default) and saved: its JSON."""
    import json

    import nbformat
    from every_output import execute

    folder = tmp_path_factory.mktemp("every-output")
    path = folder / "every-output.ipynb"
    nbformat.write(execute(folder), str(path))
    saved: dict = json.loads(path.read_text())
    return saved
