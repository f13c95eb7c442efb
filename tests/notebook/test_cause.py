"""The footer, ``%gpumem cells`` and the status line say *why*: who holds what a cell left behind,
cached memory worth giving back, and what the history records. A real InteractiveShell on a
simulated device."""

from __future__ import annotations

import pytest

from jupyter_gpumem.notebook.extension import get_extension

MiB = 1 << 20
GiB = 1 << 30

LEAK = """import math
losses = []
for step in range(20):
    scratch = [g.caching_allocator_alloc(16 * MiB) for _ in range(3)]
    losses.append(g.caching_allocator_alloc(64 * MiB))
    for p in scratch:
        g.caching_allocator_delete(p)
"""


@pytest.fixture
def big(shell, run):
    """The extension loaded on a fresh simulated 8 GiB device, live view off, footer on."""
    from jupyter_gpumem.runtime import registry

    allocator = registry.use_simulated_device(8 * GiB, fresh=True)[0]
    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    get_extension(shell).settings.live_view = False
    run("import jupyter_gpumem as g\nMiB = 1 << 20\nGiB = 1 << 30")  # cell 2
    run("%gpumem auto on")  # cell 3
    yield allocator
    for a in registry.allocators().values():  # whatever a failing test left
        a.empty_cache()
    registry.use_cuda()


def cells_text(run) -> str:
    _, out = run("%gpumem cells")
    return out.outputs[0].data["text/plain"]


def row_of(table: str, cell: int) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"[{cell}]"))


def free_list(run, name: str) -> None:
    result, _ = run(f"for p in {name}:\n    g.caching_allocator_delete(p)\ndel {name}")
    assert result.success


def test_leak_in_a_loop_is_named_in_the_footer_and_the_ledger(big, run) -> None:
    _, out = run(LEAK)  # cell 4
    assert out.stdout == (
        "gpumem [4]: Δallocated +1.2 GiB · peak 1.3 GiB · reserved 1.3 GiB (Δ +1.3 GiB)\n"
        "  left 1.2 GiB in 20 new blocks, held by losses (list of 20 × 64 MiB); allocated at "
        "cell [4] line 5\n")
    row = row_of(cells_text(run), 4)
    assert row.split()[:9] == ["[4]", "+1.2", "GiB", "+1.3", "GiB", "1.3", "GiB", "80", "60"]
    # held by, then the line that allocated it (not the cell's "import math")
    assert row.endswith("  losses (list of 20 × 64 MiB)  "
                        "losses.append(g.caching_allocator_alloc(64 * MiB))")
    free_list(run, "losses")


def test_without_history_the_holder_alone(big, run) -> None:
    run("%gpumem history off")  # cell 4
    _, out = run(LEAK)  # cell 5
    assert out.stdout.splitlines()[1] == (
        "  left 1.2 GiB in 20 new blocks, held by losses (list of 20 × 64 MiB)")
    # no stacks: the source column is the cell's first line that is not an import
    assert row_of(cells_text(run), 5).endswith("  losses = []")
    free_list(run, "losses")


def test_arrays_with_a_data_pointer_and_a_helper_elsewhere(big, run, shell) -> None:
    shell.user_ns["Array"] = FakeArray
    _, out = run("weights = {'w': Array(8 * MiB), 'b': Array(MiB)}\nlone = Array(2 * MiB)")
    lines = out.stdout.splitlines()
    assert lines[1].startswith("  left 11.0 MiB in 3 new blocks, held by weights (dict of 2, "
                               "9.0 MiB), lone (2.0 MiB); allocated at cell [4] line 1 (in "
                               "test_cause.py:")
    _, out = run("del weights, lone")
    assert out.stdout.count("\n") == 1  # nothing left behind: the numbers alone


def test_closures_and_an_underscore_cache(big, run, shell) -> None:
    shell.user_ns["Array"] = FakeArray
    run("def make_hook(n):\n    buf = Array(16 * MiB)\n    return lambda: buf")  # cell 4
    _, out = run("hooks = []\nfor n in range(8):\n    hooks.append(make_hook(n))")  # cell 5
    assert out.stdout.splitlines()[1].startswith(
        "  left 128 MiB in 8 new blocks, held by hooks (list of 8 closures, 128 MiB); "
        "allocated at cell [5] line 3 (in test_cause.py:")  # FakeArray's own line
    _, out = run("_plans = {}\n_plans[(1024, 1024, 16)] = Array(64 * MiB)")  # cell 6
    assert "held by _plans[(1024, 1024, 16)] (64.0 MiB);" in out.stdout
    assert "hooks (list of 8 closures, 128 MiB)" in cells_text(run)
    run("del hooks, _plans")


def test_the_last_traceback_holds_and_forget_error_frees_it(big, run, shell) -> None:
    shell.user_ns["Array"] = FakeArray
    run("def prepare():\n    tmp = Array(2 * GiB)\n    raise ValueError('bad shape')")  # 4
    result, out = run("prepare()")  # cell 5
    assert not result.success
    lines = out.stdout.split("gpumem [5]: ")[1].splitlines()
    assert lines[1].startswith(
        "  left 2.0 GiB in 1 new block, held by the traceback of the error in cell [5]: "
        "prepare's local tmp (2.0 GiB); allocated at cell [5] line 1 (in ")
    assert lines[2] == (
        "  the last error keeps 2.0 GiB alive in its traceback's frames: %gpumem forget-error "
        "frees it (in plain Python: import sys, traceback; [(f.clear(), f.f_locals) for f, _ "
        "in traceback.walk_tb(sys.last_traceback)]; "
        "sys.last_type = sys.last_value = sys.last_traceback = None)")
    _, out = run("%gpumem forget-error")  # cell 6
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "gpumem: forgot the error ValueError: bad shape: cleared the locals of prepare; "
        "2.0 GiB freed (allocated: cupy 2.0 GiB → 0 B); %debug and %tb have nothing to show now")
    assert lines[1].startswith("gpumem [6]: Δallocated -2.0 GiB · ")
    _, out = run("%gpumem forget-error")
    assert out.stdout.splitlines()[0] == (
        "gpumem: no error to forget (sys.last_traceback is not set)")


def test_the_plain_python_lines_free_it_too(big, run, shell) -> None:
    from jupyter_gpumem.data.holders import FORGET_ERROR_CODE

    shell.user_ns["Array"] = FakeArray
    run("def prepare():\n    tmp = Array(GiB)\n    raise ValueError('bad shape')")
    run("prepare()")
    _, out = run(FORGET_ERROR_CODE)
    assert out.stdout.splitlines()[0].startswith("gpumem [6]: Δallocated -1.0 GiB · ")


def test_an_attribute_holds_and_a_copy_of_an_address_does_not(big, run) -> None:
    run("class Box:\n    pass\nbox = Box()")  # cell 4
    _, out = run("box.p = g.caching_allocator_alloc(4 * MiB)")  # cell 5
    assert out.stdout.splitlines()[1] == (
        "  left 4.0 MiB in 1 new block, held by box.p (4.0 MiB); allocated at cell [5] line 1")
    run("g.caching_allocator_delete(box.p)")
    # a copy of an address keeps nothing alive, nor does a freed one that a new block reuses
    _, out = run("q = int(str(g.caching_allocator_alloc(4 * MiB)))")
    assert out.stdout.splitlines()[1] == (
        "  left 4.0 MiB in 1 new block, held by no variable found; allocated at cell [7] line 1")
    run("old = [q]\ng.caching_allocator_delete(q)")
    _, out = run("new = g.caching_allocator_alloc(4 * MiB)\nassert new == old[0]")
    assert "held by new (4.0 MiB);" in out.stdout
    run("g.caching_allocator_delete(new)")


def test_empty_cache_hint_once_per_occurrence(big, run) -> None:
    run("x = g.caching_allocator_alloc(3 * GiB)")  # cell 4
    hint = ("3.0 GiB of the 3.0 GiB reserved is cached but unused; %gpumem empty-cache or "
            "gm.empty_cache() gives it back to the device")
    _, out = run("g.caching_allocator_delete(x)")  # cell 5
    assert out.stdout.splitlines()[1:] == ["  " + hint]
    _, out = run("y = 1")  # still cached, already said: not again
    assert out.stdout.count("\n") == 1
    _, out = run("%gpumem")  # the status line says it whenever asked
    assert out.outputs[0].data["text/plain"].endswith(" cells recorded · " + hint)
    run("%gpumem empty-cache")  # the occurrence ends ...
    run("x = g.caching_allocator_alloc(3 * GiB)")
    _, out = run("g.caching_allocator_delete(x)")  # ... and a new one is told again
    assert out.stdout.splitlines()[1:] == ["  " + hint]
    run("%gpumem empty-cache")


@pytest.mark.parametrize("keep, drop", [
    (0, 900 * MiB),  # cached but not more than 1 GiB
    (2 * GiB, 1536 * MiB),  # 1.5 GiB cached: not more than half of the 3.5 GiB reserved
])
def test_no_cache_hint_below_the_thresholds(big, run, keep, drop) -> None:
    if keep:
        run(f"kept = g.caching_allocator_alloc({keep})")
    run(f"x = g.caching_allocator_alloc({drop})")
    _, out = run("g.caching_allocator_delete(x)")
    assert "cached but unused" not in out.stdout
    _, out = run("%gpumem")
    assert "cached but unused" not in out.outputs[0].data["text/plain"]
    if keep:
        run("g.caching_allocator_delete(kept)")
    run("%gpumem empty-cache")


def test_cache_hint_counts_only_what_empty_cache_releases(big, run) -> None:
    run("a = g.caching_allocator_alloc(1536 * MiB)")
    _, out = run("g.caching_allocator_delete(a)")
    assert "1.5 GiB of the 1.5 GiB reserved is cached but unused" in out.stdout
    # 1.2 GiB stays free, but in the segment that now holds b: empty_cache would release none.
    run("b = g.caching_allocator_alloc(300 * MiB)")
    assert big.memory_reserved() - big.memory_allocated() == 1236 * MiB
    _, out = run("%gpumem")
    assert "cached but unused" not in out.outputs[0].data["text/plain"]
    run("g.caching_allocator_delete(b)")
    run("%gpumem empty-cache")


@pytest.mark.parametrize("command, words", [
    ("history state", "history: lines of live blocks only"),
    ("history state --no-stacks", "history: live blocks only, no lines"),
    ("history on", "history on"),
    ("history on --no-stacks", "history on, no lines"),
    ("history off", "history off"),
])
def test_status_line_says_what_the_history_records(big, run, command, words) -> None:
    run(f"%gpumem {command}")
    _, out = run("%gpumem")
    assert f" · {words} · " in out.outputs[0].data["text/plain"]


class _Memory:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeArray:
    """What a CuPy array looks like to the holder search: ``.data.ptr`` and ``.nbytes``; freed
    when collected, as CuPy's arrays are."""

    def __init__(self, nbytes: int) -> None:
        import jupyter_gpumem as g

        self.nbytes = nbytes
        self._memory = _Memory(g.caching_allocator_alloc(nbytes))

    @property
    def data(self) -> _Memory:
        return self._memory

    def __del__(self) -> None:
        import jupyter_gpumem as g

        g.caching_allocator_delete(self._memory.ptr)


def test_the_holder_search_stops_where_the_setting_says_and_says_so(big, run, shell) -> None:
    settings = get_extension(shell).settings
    settings.holder_search_ms = 0.001
    run("notes = [[str(i)] for i in range(1000)]")  # cell 4: a thousand lists to look into
    _, out = run("q = int(str(g.caching_allocator_alloc(4 * MiB)))")  # cell 5
    assert out.stdout.splitlines()[1] == (
        "  left 4.0 MiB in 1 new block, held by no variable found (search stopped at 0.001 ms);"
        " allocated at cell [5] line 1")
    from traitlets import TraitError

    for bad in (0, -5, float("nan")):
        with pytest.raises(TraitError, match="holder_search_ms"):
            settings.holder_search_ms = bad
        assert settings.holder_search_ms == 0.001
    settings.holder_search_ms = 60_000
    run("g.caching_allocator_delete(q)")
    _, out = run("r = int(str(g.caching_allocator_alloc(4 * MiB)))")
    assert "held by no variable found; allocated at cell [7] line 1" in out.stdout
    run("g.caching_allocator_delete(r)")
