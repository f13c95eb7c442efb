"""What a new user met in the first hour (issue 21), in a real InteractiveShell on a simulated
device: each test is one thing that read wrong, now read as the user sees it."""

from __future__ import annotations

import io
import re

import pytest
from IPython.core.error import UsageError

from jupyter_gpumem.notebook.extension import get_extension

MiB = 1 << 20




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


def _kernel_file_names(shell, monkeypatch) -> None:
    """Cells compiled under file names as ipykernel makes them (a temporary ``.py``), not
    IPython's ``<ipython-input-N-...>`` that a site could be named from alone."""
    names = iter(range(4024635250, 4024636250))
    monkeypatch.setattr(shell.compile, "get_code_name",
                        lambda raw, code, number: f"/tmp/ipykernel_1/{next(names)}.py")


@pytest.mark.parametrize("saved", ["snap.json", "snap.pickle", "trace.json.gz"])
def test_cli_summary_of_a_notebooks_file_names_cells(gm, run, shell, monkeypatch, tmp_path,
                                                       capsys, saved) -> None:
    """A snapshot or trace saved from a notebook names its cells, and the CLI reads them."""
    from jupyter_gpumem.cli import main

    _kernel_file_names(shell, monkeypatch)
    run("%gpumem history on")  # cell 3
    run("x = g.caching_allocator_alloc(8 * MiB)")  # cell 4
    path = tmp_path / saved
    if saved.startswith("trace"):
        run(f"%%gpumem_trace --no-plot --save {path}\n\ny = g.caching_allocator_alloc(4 * MiB)")
    else:
        run("y = g.caching_allocator_alloc(4 * MiB)")
        run(f"%gpumem dump {path}")
    capsys.readouterr()
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    line = 3 if saved.startswith("trace") else 1  # the traced cell: its magic, a blank, y = ...
    assert out.endswith("  top sites at the peak:\n"
                        "       8.0 MiB       1×  cell [4] line 1\n"
                        f"       4.0 MiB       1×  cell [5] line {line}\n")
    assert ".py:" not in out
    run("g.caching_allocator_delete(x); g.caching_allocator_delete(y)")


def test_config_names_an_unknown_key_before_its_value(gm, run, sim) -> None:
    before = sim.config
    result, _ = run("%gpumem config foo:bar")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == (
        "config: unknown allocator option 'foo'; known options: expandable_segments, "
        "garbage_collection_threshold, max_split_size_mb, per_process_memory_fraction, "
        "roundup_power2_divisions (see %gpumem? for usage)")
    result, _ = run("%gpumem config max_split_size_mb:64,foo:bar")
    assert "unknown allocator option 'foo'" in str(result.error_in_exec)
    assert sim.config == before  # nothing changed


def test_help_has_no_footer_and_names_the_cell_magic(gm, run, shell) -> None:
    run("%gpumem auto on")
    result, out = run("%gpumem?")
    assert result.success
    assert "Δallocated" not in out.stdout  # the help alone: no footer above it
    doc = shell.find_line_magic("gpumem").__doc__
    assert ("To trace one cell (its timeline, layout, top lines, what survives), start it\n"
            "with %%gpumem_trace (see %%gpumem_trace?).") in doc
    _, out = run("x = 1")
    assert out.stdout.startswith("gpumem [")  # an ordinary cell still has its footer


def test_trace_save_says_where(gm, run, tmp_path) -> None:
    path = tmp_path / "t.html"
    result, out = run(f"%%gpumem_trace --no-plot --save {path}\nq = g.caching_allocator_alloc(MiB)")
    assert result.success and path.exists()
    assert out.stdout == f"gpumem: trace saved to {path}\n"
    run("g.caching_allocator_delete(q)")


def test_empty_cache_says_why_memory_stays(gm, run) -> None:
    run("ps = [g.caching_allocator_alloc(n * MiB) for n in (3, 5, 90)]\n"
        "g.caching_allocator_delete(ps[1])")
    _, out = run("%gpumem empty-cache")
    assert out.stdout == (
        "gpumem: released 0 B of cached segments to the device; 17.0 MiB stays cached in 1 "
        "segment that still holds live blocks (a segment goes back only when all its blocks "
        "are free)\n")
    run("g.caching_allocator_delete(ps[0]); g.caching_allocator_delete(ps[2])")
    _, out = run("%gpumem empty-cache")
    assert out.stdout == "gpumem: released 110 MiB of cached segments to the device\n"


@pytest.mark.parametrize("line, said", [
    ("history on", "gpumem: history on (stacks on, up to 100000 events)\n"),
    ("history state",
     "gpumem: history state: the lines of live blocks only, no events (no timeline, no replay)\n"),
    ("history state --no-stacks", "gpumem: history state: live blocks, without their lines "
                                  "only, no events (no timeline, no replay)\n"),
    ("history off", "gpumem: history off\n"),
])
def test_history_says_what_it_records_in_the_words_typed(gm, run, line, said) -> None:
    _, out = run(f"%gpumem {line}")
    assert out.stdout == said


def test_a_traced_cell_is_small_in_the_saved_file(gm, run) -> None:
    """What a traced cell stores: the view payload once, one small PNG (a palette of its 64 most
    used colours) in the html and again as image/png (Note [Static fallbacks]), and the text;
    101 KB for the browser tests' workload (77 KB with the picture once at 256 colours, 159 KB
    at full colour)."""
    import base64
    import json
    from pathlib import Path

    from bundle_checks import images
    from PIL import Image
    from script_module import load_script

    from jupyter_gpumem.render.display import PALETTE_COLOURS

    views = Path(__file__).resolve().parents[1] / "browser" / "saved_views.py"
    run(load_script(views).WORKLOAD)  # the workload the browser tests save
    result, out = run("%%gpumem_trace\nkept = run(g.get_allocator())")
    assert result.success
    (bundle,) = [o.data for o in out.outputs]
    ((png, _alt),) = images(bundle["text/html"])
    assert base64.b64decode(bundle["image/png"]) == png  # the same picture, drawn once
    picture = Image.open(io.BytesIO(png))
    assert picture.mode == "P" and len(picture.getcolors()) <= PALETTE_COLOURS == 64
    saved = len(json.dumps(bundle))
    assert saved < 110_000, f"a traced cell stores {saved} bytes"
    run("weights, scratch = kept\na = g.get_allocator()\nfor p in weights:\n    a.free(p)\n"
        "for small in scratch:\n    for i, p in enumerate(small):\n        if i % 3:\n"
        "            a.free(p)")


def _readme_notebook_cell() -> str:
    """The first code block of the README's "In a notebook" section."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## In a notebook\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_readme_opens_with_a_cell_that_runs_as_is_with_no_gpu(shell, run) -> None:
    """The README's first notebook cell runs, as written, on a machine with no GPU: on the
    simulated device, with its status line, and says how to allocate there."""
    from jupyter_gpumem.runtime import registry

    cell = _readme_notebook_cell()
    assert cell.startswith("%load_ext jupyter_gpumem\n%gpumem device sim")
    try:
        run("%load_ext jupyter_gpumem")
        get_extension(shell).settings.live_view = False  # no frontend to show it here
        result, out = run(cell)  # loading again is a no-op: the cell as written
        assert result.success, result.error_in_exec
        # (the size is 80 GiB in a fresh kernel; here the tests' simulated device is reused)
        assert re.search(r"\ngpumem: using a simulated device of [0-9.]+ [GM]iB; no memory is "
                         r"behind it, so allocate with jupyter_gpumem\.caching_allocator_alloc\("
                         r"nbytes\) \(CuPy arrays need a GPU\)\n", out.stdout), out.stdout
        status = out.outputs[0].data["text/plain"]
        assert status.startswith("gpumem · sim device 0 (Simulated GPU 0) · allocated 192 MiB")
        run("for p in weights:\n    gm.caching_allocator_delete(p)")
    finally:
        registry.use_cuda()


def test_a_comment_after_a_magic_is_a_comment(gm, run, sim, tmp_path) -> None:
    """``%gpumem history on  # note``, as the README writes it, is ``history on``; a ``#``
    inside a word or in quotes is part of the argument."""
    result, out = run("%gpumem history on   # record every event (--max-entries 5)")
    assert result.success and out.stdout.startswith("gpumem: history on (stacks on, up to ")
    assert sim.history is not None and sim.history.max_entries == 100_000
    for name in ("a#b.json", "#c.json"):
        path = tmp_path / name
        result, out = run(f"%gpumem dump '{path}'" if name.startswith("#") else
                          f"%gpumem dump {path}  # keep it")
        assert result.success and path.exists(), out.stdout
