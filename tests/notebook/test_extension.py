"""Loading, unloading and reloading the extension; its settings; its hooks."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason
from jupyter_gpumem.notebook import extension
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.runtime import registry

NO_GPU = cuda_unavailable_reason()


def hooks(shell, name: str) -> list:
    return [cb for cb in shell.events.callbacks[name]
            if type(getattr(cb, "__self__", None)).__module__ == extension.__name__]


def test_import_is_light() -> None:
    import subprocess

    code = ("import sys, jupyter_gpumem; bad = [m for m in ('IPython', 'cupy', 'matplotlib', "
            "'ipywidgets', 'anywidget', 'traitlets') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_registers_and_unload_removes_exactly(shell, run, sim) -> None:
    line_before = set(shell.magics_manager.magics["line"])
    cell_before = set(shell.magics_manager.magics["cell"])
    listeners = list(registry._listeners)
    result, out = run("%load_ext jupyter_gpumem")
    assert result.success
    ext = get_extension(shell)
    assert ext.settings in shell.configurables and ext.magics in shell.configurables
    if NO_GPU:
        assert out.stdout.count("\n") == 1 and "no GPU here" in out.stdout
    assert len(hooks(shell, "pre_run_cell")) == len(hooks(shell, "post_run_cell")) == 1
    assert "gpumem" in shell.magics_manager.magics["line"]
    assert "gpumem_trace" in shell.magics_manager.magics["cell"]
    result, config_out = run("%config GpuMem")
    assert result.success and "GpuMem.auto_footer" in config_out.stdout
    assert len(registry._listeners) == len(listeners) + 1
    assert sim.recording  # "state" history switched on for the allocator in use
    run("%unload_ext jupyter_gpumem")
    assert hooks(shell, "pre_run_cell") == hooks(shell, "post_run_cell") == []
    assert set(shell.magics_manager.magics["line"]) == line_before
    assert set(shell.magics_manager.magics["cell"]) == cell_before
    assert registry._listeners == listeners
    assert ext.settings not in shell.configurables and ext.magics not in shell.configurables
    assert not sim.recording  # put back as it was
    assert get_extension(shell) is None


def test_reload_ext(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    first = get_extension(shell)
    result, _ = run("%reload_ext jupyter_gpumem")
    assert result.success
    second = get_extension(shell)
    assert second is not None and second is not first
    assert len(hooks(shell, "pre_run_cell")) == 1
    result, _ = run("%gpumem info")
    assert result.success


def test_load_twice_is_a_noop(shell, sim) -> None:
    from jupyter_gpumem import load_ipython_extension

    load_ipython_extension(shell)
    load_ipython_extension(shell)
    assert len(hooks(shell, "post_run_cell")) == 1


def test_traitlets_config(shell, run, sim) -> None:
    shell.config.GpuMem.auto_footer = True
    shell.config.GpuMem.record_history = "all"
    shell.config.GpuMem.max_entries = 77
    try:
        run("%load_ext jupyter_gpumem")
        ext = get_extension(shell)
        assert ext.settings.auto_footer and ext.settings.max_entries == 77
        assert sim.history.max_entries == 77
        _, out = run("x = 1")
        assert out.stdout.startswith("gpumem [2]: Δallocated 0 B")
    finally:
        del shell.config.GpuMem


def test_bad_setting_rejected(shell, sim) -> None:
    from traitlets import TraitError

    from jupyter_gpumem.notebook.extension import GpuMem

    for name, value in (("max_entries", 0), ("alloc_conf", "bogus:1"), ("sim_capacity", "x"),
                        ("record_history", "sometimes"), ("keep_states", -1),
                        ("keep_rows", 0)):
        with pytest.raises(TraitError):
            GpuMem(**{name: value})


@pytest.mark.skipif(NO_GPU is None, reason="needs a machine without a GPU")
def test_simulate_without_gpu_switches_and_unload_switches_back(shell, run) -> None:
    shell.config.GpuMem.simulate_without_gpu = True
    shell.config.GpuMem.sim_capacity = "2GiB"
    try:
        _, out = run("%load_ext jupyter_gpumem")
        assert out.stdout == (f"jupyter_gpumem: no GPU here: {NO_GPU}; using a simulated "
                              "2.0 GiB device instead.\n")
        assert registry.backend() == "sim"
        run("%unload_ext jupyter_gpumem")
        assert registry.backend() == "cuda"
    finally:
        del shell.config.GpuMem
        registry.use_simulated_device(fresh=True)  # drop the 2 GiB device for later tests
        registry.use_cuda()


@pytest.mark.skipif(NO_GPU is None, reason="needs a machine without a GPU")
def test_no_gpu_cells_record_nothing_and_magics_say_why(shell, run) -> None:
    run("%load_ext jupyter_gpumem")
    run("x = 1")
    assert get_extension(shell).ledger.rows == []
    _, out = run("%gpumem")
    assert out.outputs[0].data["text/plain"].startswith("gpumem: no GPU here")
    result, _ = run("%gpumem summary")
    assert "device sim" in str(result.error_in_exec)


def test_hooks_fire_from_a_real_event_manager(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    ext = get_extension(shell)
    unstored = SimpleNamespace(raw_cell="x = 1", store_history=False)  # numbered as it stands
    shell.events.trigger("pre_run_cell", unstored)
    assert ext.ledger.running == shell.execution_count
    assert sim.current_cell == shell.execution_count
    shell.events.trigger("post_run_cell", None)
    assert ext.ledger.running is None and sim.current_cell == -1


def test_ledger_through_cells(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    run("import jupyter_gpumem as g")
    run("p = g.caching_allocator_alloc(3 << 20)")
    run("g.caching_allocator_delete(p)")
    rows = get_extension(shell).ledger.rows
    assert [(r["cell"], r["allocated_delta"], r["allocs"], r["frees"]) for r in rows] == [
        (2, 0, 0, 0), (3, 3 << 20, 1, 0), (4, -(3 << 20), 0, 1)]


def test_cell_numbers_follow_ipython_even_when_the_first_guess_is_wrong(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    ext = get_extension(shell)
    ext._count_offset += 1  # pretend this IPython counted the other way
    run("a = 1")  # misnumbered, and the offset is corrected from the result's own number
    result, _ = run("b = 2")
    assert ext.ledger.rows[-1]["cell"] == result.execution_count
    result, _ = run("c = 3")
    assert ext.ledger.rows[-1]["cell"] == result.execution_count


# -- how the modules import each other -----------------------------------------------------------

PACKAGE = Path(extension.__file__).parents[1]


def is_module(name: str) -> bool:
    """Whether ``name`` (``jupyter_gpumem.x.y``) is a module or package, not a name in one."""
    where = PACKAGE.parent.joinpath(*name.split("."))
    return (where / "__init__.py").exists() or any(where.parent.glob(where.name + ".*"))


def package_imports(path: Path) -> tuple[dict[str, str], list[str]]:
    """The package's modules that ``path`` imports anywhere in it (under TYPE_CHECKING and in
    functions too): ``({name bound to a module: module}, [every module imported])``."""
    bound: dict[str, str] = {}
    imported: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jupyter_gpumem"):
            imported.append(str(node.module))
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if is_module(full):
                    bound[alias.asname or alias.name] = full
                    imported.append(full)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("jupyter_gpumem"):
                    imported.append(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
    return bound, imported


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_private_name_of_another_module_is_used() -> None:
    """``registry._sim``, ``api._no_gpu`` and the like: a module reads another module's
    underscored names only through that module's public functions."""
    used = []
    for path in sorted(PACKAGE.rglob("*.py")):
        bound, _ = package_imports(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                used.append(f"{module_name(path)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert used == []


def test_the_notebook_modules_import_one_way() -> None:
    """No circle among the notebook's modules, counting imports made only for the type checker
    or inside functions: extension → magics → subcommands → readouts/controls → host, ..."""
    notebook = PACKAGE / "notebook"
    edges = {module_name(p): {m for m in package_imports(p)[1]
                              if m.startswith("jupyter_gpumem.notebook.")}
             for p in notebook.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path[path.index(module):], module))
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            visit(target, (*path, module))
        done.add(module)

    for module in sorted(edges):
        visit(module, ())
