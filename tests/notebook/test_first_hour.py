"""What a new user met in the first hour (issue 21), in a real InteractiveShell on a simulated
device: each test is one thing that read wrong, now read as the user sees it."""

from __future__ import annotations

import re

import pytest

from jupyter_gpumem.notebook.extension import get_extension

MiB = 1 << 20


@pytest.fixture
def gm(shell, run, sim):
    """The extension loaded, on a fresh simulated 1 GiB device, with the live view off."""
    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    get_extension(shell).settings.live_view = False
    run("import jupyter_gpumem as g\nMiB = 1 << 20")
    return get_extension(shell)


TRACED = """%%gpumem_trace --no-plot
acts = []
acts.append(g.caching_allocator_alloc(8 * MiB))
acts.append(g.caching_allocator_alloc(4 * MiB))
"""


def test_traced_cell_lines_are_the_editors(gm, run, shell) -> None:
    """Line 1 of a traced cell is the ``%%gpumem_trace`` line: sites, the footer and the
    ledger's source column name the line that allocated, as the editor numbers it."""
    run("%gpumem auto on")
    result, out = run(TRACED)  # cell 4
    assert result.success
    shown = out.outputs[0].data["text/plain"]
    assert "  8.0 MiB  1×  cell [4] line 3\n  4.0 MiB  1×  cell [4] line 4\n" in shown
    footer = out.stdout.splitlines()[-1]  # the holder's words are the holder search's
    assert footer.startswith("  left 12.0 MiB in 2 new blocks, held by acts ")
    assert footer.endswith("; allocated at cell [4] line 3")
    row = gm.ledger.rows[-1]
    assert row["source"] == "acts.append(g.caching_allocator_alloc(8 * MiB))"
    run("for p in acts:\n    g.caching_allocator_delete(p)")


def test_traced_cell_traceback_names_the_editors_line(gm, run, shell) -> None:
    result, _ = run("%%gpumem_trace --no-plot\nx = 1\nraise ValueError('boom')")
    assert isinstance(result.error_in_exec, ValueError)
    tb = shell.InteractiveTB.structured_traceback(
        type(result.error_in_exec), result.error_in_exec, result.error_in_exec.__traceback__)
    text = "\n".join(tb)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "line 3" in plain and "----> 3 raise ValueError('boom')" in plain
    assert "1 %%gpumem_trace --no-plot" in plain
