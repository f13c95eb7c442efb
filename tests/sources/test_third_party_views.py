"""Every view on a third party's source: ``toy_source.ToySource`` (written only through the
public protocol) registered at run time, then ``%gpumem source toy`` and each view in a real
InteractiveShell, with no change to our code."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cell_text import text_of
from toy_source import MiB, ToyLib, ToySource

import jupyter_gpumem
from jupyter_gpumem import sources
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.notebook.extension import get_extension


@pytest.fixture
def toy() -> Iterator[ToySource]:
    made = ToySource(ToyLib())
    jupyter_gpumem.register_source("toy", made)
    yield made
    jupyter_gpumem.unregister_source("toy")


@pytest.fixture
def toy_gm(shell, run, sim, toy):
    """The extension loaded (footer on, live view off), the views on the toy source only."""
    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    ext = get_extension(shell)
    ext.settings.live_view = False
    ext.settings.auto_footer = True
    result, out = run("%gpumem source toy")
    assert result.success, out.stderr
    assert "the toy library's pool" in out.stdout
    shell.user_ns.update(lib=toy.lib, MiB=MiB)
    return ext


def toy_rows(ext) -> list[dict]:
    return [r for r in ext.ledger.rows if r.get("memory_source") == "toy"]


def test_the_source_magic_names_it_and_refuses_what_is_unknown(toy_gm, run) -> None:
    assert sources.selected() == ("toy",)
    result, out = run("%gpumem source tensorflow")
    assert not result.success and sources.selected() == ("toy",)
    assert "toy" in out.stderr + str(result.error_in_exec)  # the list of sources names it


def test_ledger_and_footer(toy_gm, run, toy) -> None:
    result, out = run("w = lib.empty(3 * MiB)\ntmp = lib.empty(2 * MiB)\ndel tmp")
    assert result.success
    row = toy_rows(toy_gm)[-1]
    assert (row["allocated_delta"], row["peak_allocated"]) == (3 * MiB, 5 * MiB)
    assert (row["allocs"], row["frees"], row["segments_new"]) == (2, 1, 1)
    assert row["reserved_delta"] == 8 * MiB
    footer = [ln for ln in out.stdout.splitlines() if ln.startswith("gpumem [")]
    assert len(footer) == 1 and f"peak {format_bytes(5 * MiB)}" in footer[0]
    assert "w (3.0 MiB)" in out.stdout  # the holder, found through the source's owners
    _, table = run("%gpumem cells")
    assert "w = lib.empty(3 * MiB)" in text_of(table)


def test_status_summary_stats_snapshot_and_diff(toy_gm, run, toy) -> None:
    run("a = lib.empty(1 * MiB)")
    cell_a = toy_rows(toy_gm)[-1]["cell"]
    run("b = lib.empty(2 * MiB)")
    cell_b = toy_rows(toy_gm)[-1]["cell"]
    _, out = run("%gpumem")
    status = text_of(out)
    assert "toy device 0 (Toy GPU) · allocated 3.0 MiB" in status
    assert "a toy pool of 8 MiB segments" in status  # the source's own note
    _, out = run("%gpumem summary")
    assert out.stdout.startswith("toy pool: 3145728 bytes allocated")
    _, out = run("%gpumem stats --json")
    assert '"allocated_bytes.all.current": 3145728' in out.stdout
    _, out = run("%gpumem snapshot")
    assert out.outputs  # the block layout of the toy segments
    _, out = run(f"%gpumem diff {cell_a} {cell_b}")
    assert f"cell [{cell_a}] → cell [{cell_b}]: 1 new block(s) (2.0 MiB)" in text_of(out)


def test_trace_plot_and_replay(toy_gm, run, shell) -> None:
    result, out = run("%%gpumem_trace -o t\nkeep = lib.empty(4 * MiB)\ngone = lib.empty(1 * MiB)"
                      "\ndel gone")
    assert result.success, out.stderr
    t = shell.user_ns["t"]
    assert t.peak_allocated == 5 * MiB
    assert "keep" in text_of(out)  # the survivor and its holder
    _, out = run("%gpumem plot")
    assert out.outputs  # the timeline of what the toy library recorded
    result, out = run("%gpumem replay toy -o r")  # the toy's program under our allocator
    assert result.success, out.stderr
    assert shell.user_ns["r"].rows()[0].peak_allocated == 5 * MiB


def test_the_oom_explainer(toy_gm, run) -> None:
    run("hold = [lib.empty(8 * MiB) for _ in range(7)]")
    result, out = run("lib.empty(16 * MiB)")
    assert not result.success
    panel = text_of(out)
    assert "GPU out of memory" in panel
    assert "hold" in panel  # who holds the memory
    assert "`ToyLib(capacity=...)` makes a bigger one" in panel  # the source's own step


def test_both_our_allocator_and_the_toy_source(shell, run, sim, toy) -> None:
    run("%load_ext jupyter_gpumem")
    ext = get_extension(shell)
    ext.settings.live_view = False
    ext.settings.auto_footer = True
    run("%gpumem source cupy toy")
    assert sources.selected() == ("cupy", "toy")
    shell.user_ns.update(lib=toy.lib, MiB=MiB)
    _, out = run("%gpumem")
    status = text_of(out)
    assert "cupy: gpumem · sim device 0" in status and "toy: gpumem · toy device 0" in status


def test_an_error_of_a_source_the_views_do_not_read_says_how_to_explain_it(shell, run, sim,
                                                                           toy) -> None:
    run("%load_ext jupyter_gpumem")
    get_extension(shell).settings.live_view = False
    sources.get_source("toy")  # registered and made, but the views read cupy
    shell.user_ns.update(lib=toy.lib, MiB=MiB)
    result, out = run("lib.empty(128 * MiB)")
    assert not result.success
    assert ("jupyter_gpumem: this is an out-of-memory error of the toy library's pool, which the "
            "views do not read: `%gpumem source toy` (or `all`) explains the next one.") in (
        out.stdout)
    assert not [o for o in out.outputs if "GPU out of memory" in o.data.get("text/plain", "")]
