"""The example notebooks, executed headless by nbclient on the simulated device, and the notebook
of every output (``every_output``): each output keeps its static fallback for a reader without
our extension, and the widget state nbclient stores is whole (``notebook_checks``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest
from cell_text import notebook_text as texts
from notebook_checks import (
    OUR_MIME,
    WIDGET_STATE,
    WIDGET_VIEW,
    html_images,
    notebook_problems,
    referenced_models,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def needs_gpu(path: Path) -> bool:
    """Whether an example says it was recorded on a GPU (``"jupyter_gpumem": {"needs": "gpu"}``)."""
    meta = json.loads(path.read_text()).get("metadata", {}).get("jupyter_gpumem", {})
    return isinstance(meta, dict) and meta.get("needs") == "gpu"


def execute(name: str):
    """Run an example with nbclient (widget state stored, its default); its code cells, after
    checking that every output keeps its fallback and the widget state is whole."""
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    assert notebook_problems(json.loads(nbformat.writes(nb))) == []
    return [c for c in nb.cells if c.cell_type == "code"]


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.ipynb"))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.name for p in EXAMPLE_FILES])
def test_saved_examples_keep_their_fallbacks(path: Path) -> None:
    """The examples as saved in the repository (what GitHub shows): every output has its text,
    every picture and view its image/png, every <img> its alt text, and no widget metadata."""
    nb = json.loads(path.read_text())
    assert notebook_problems(nb) == []
    assert "widgets" not in nb["metadata"]


@pytest.mark.parametrize("name", [
    "whatif.ipynb",
    *[pytest.param(p.name, marks=pytest.mark.gpu) for p in EXAMPLE_FILES if needs_gpu(p)]])
def test_examples_run_with_their_fallbacks(name: str) -> None:
    """The examples the two tests below do not run: what-if here; those recorded on a GPU
    (their metadata says so) only where one is."""
    cells = execute(name)
    assert any("image/png" in o.get("data", {}) for c in cells for o in c.outputs)



def test_quickstart() -> None:
    cells = execute("quickstart.ipynb")
    by_source = {c.source.splitlines()[0]: c for c in cells}
    assert all(o.output_type != "error" for c in cells for o in c.outputs)
    sim = by_source["%gpumem device sim --capacity 16GiB"]
    assert "using a simulated device of 16.0 GiB" in texts(sim)
    assert "allocated 192 MiB" in texts(by_source["%gpumem"])
    assert "Allocated memory" in texts(by_source["%gpumem summary"])
    trace = by_source["%%gpumem_trace -o t"]
    shown = [o for o in trace.outputs if "data" in o and "text/plain" in o.data
             and o.data["text/plain"].startswith("gpumem cell [")]
    assert shown and "<img " in shown[0].data["text/html"]
    assert "Blocks surviving the traced code" in shown[0].data["text/plain"]
    assert "← activations[0]" in shown[0].data["text/plain"]
    assert "[6]" in texts(by_source["%gpumem cells"])
    assert any("<img " in o.get("data", {}).get("text/html", "")
               for o in by_source["%gpumem plot"].outputs)
    assert "1 new block(s) (8.0 MiB)" in texts(by_source["%gpumem diff 3 6"])


def test_oom() -> None:
    cells = execute("oom.ipynb")
    failing = next(c for c in cells if c.source.startswith("y = "))
    errors = [o for o in failing.outputs if o.output_type == "error"]
    assert errors and errors[0].ename.endswith("OutOfMemoryError")
    panel = texts(failing)
    assert "GPU out of memory in cell [3]" in panel
    # x is the int caching_allocator_alloc returned: deleting it, not `del x`, frees the block
    assert "3.0 GiB  1 block  cell [2] line 4  ← x (3.0 GiB)\n" in panel
    assert "`del x`" not in panel and "`caching_allocator_delete(x)`" in panel
    fixed = next(c for c in cells if c.source.startswith("g.caching_allocator_delete(x)"))
    assert all(o.output_type != "error" for o in fixed.outputs)


# -- the notebook of every output ------------------------------------------------------------------


def _data(nb: dict[str, Any], cell: int) -> list[dict[str, Any]]:
    """The MIME bundles of a cell's outputs that have one, in order."""
    return [o["data"] for o in nb["cells"][cell]["outputs"] if "data" in o]


def test_every_output_keeps_its_fallback(every_output_notebook: dict[str, Any]) -> None:
    """Run by nbclient, each output of every kind keeps a text line, its picture as image/png
    and in its html with alt text; only the cells meant to raise do."""
    import every_output as every

    nb = every_output_notebook
    assert notebook_problems(nb) == []
    raised = [i for i, c in enumerate(nb["cells"])
              if any(o["output_type"] == "error" for o in c["outputs"])]
    assert raised == [i for i, (_, raises) in enumerate(every.CELLS) if raises]
    pictured = {i for i, c in enumerate(nb["cells"]) for o in c["outputs"]
                if "image/png" in o.get("data", {})}
    assert pictured >= {every.STATUS, every.TRACE, every.LONG_TRACE, every.RAISING_TRACE,
                        every.PLOT, every.SUGGEST, every.COMPARE, every.LOAD,
                        every.CLUSTER_STOPPED, every.CLUSTER_TRACE, every.CLUSTER_RUNNING}
    # the panel under the out-of-memory error: text and tables, no picture to need
    (panel,) = _data(nb, every.OOM)
    assert "GPU out of memory" in "".join(panel["text/plain"]) and "image/png" not in panel
    # the cell that raised still shows its trace, picture and all
    (_line, shown) = _data(nb, every.RAISING_TRACE)
    assert "raised ValueError" in "".join(shown["text/plain"]) and OUR_MIME in shown
    # a cluster trace's html has a picture per worker; its image/png is one of them
    (shown,) = _data(nb, every.CLUSTER_TRACE)
    imgs = html_images("".join(shown["text/html"]))
    assert len(imgs) == 2 and "".join(shown["image/png"].split()) in [s for s, _ in imgs]
    # the picture of a view is stored twice at most: in its html and as image/png
    for cell in nb["cells"]:
        for out in cell["outputs"]:
            png = out.get("data", {}).get("image/png")
            if png:
                assert sum(str(v).count(png[:64]) for v in out["data"].values()) == 2


def test_nbclient_stores_whole_widget_state(every_output_notebook: dict[str, Any]) -> None:
    """nbclient stores the state of every widget it ever saw: the live views still running at
    the end (a bare %gpumem's and the last %gpumem cluster's), which their outputs show, with
    their layouts; and the closed ones (each traced cell's live view, the stopped cluster
    view), which no output shows any more: their outputs became pictures."""
    import every_output as every

    nb = every_output_notebook
    state = nb["metadata"]["widgets"][WIDGET_STATE]["state"]
    shown = referenced_models(nb)
    running = {o["data"][WIDGET_VIEW]["model_id"] for c in (every.STATUS, every.CLUSTER_RUNNING)
               for o in nb["cells"][c]["outputs"] if WIDGET_VIEW in o.get("data", {})}
    assert shown == running and len(running) == 2 and running <= set(state)
    closed = {m for m, s in state.items() if s["model_name"] == "AnyModel"} - running
    # a live view for each of the three traced cells of this process, and the stopped strip
    assert len(closed) == 4
    for cell in (every.TRACE, every.LONG_TRACE, every.RAISING_TRACE, every.CLUSTER_STOPPED):
        assert not any(WIDGET_VIEW in o.get("data", {}) for o in nb["cells"][cell]["outputs"])
    # what the saved state weighs: each widget carries its script (the ESM)
    assert all(len(state[m]["state"]["_esm"]) > 10_000 for m in running | closed)


def test_every_picture_is_drawn_once(gm, run, monkeypatch) -> None:
    """Each view's picture is drawn once, for its html and its image/png alike."""
    from matplotlib.figure import Figure

    drawn = [0]
    savefig = Figure.savefig

    def counted(self: Figure, *args: Any, **kwargs: Any) -> Any:
        drawn[0] += 1
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", counted)
    run("%gpumem history on\na = g.get_allocator()\nkeep = a.malloc(8 * MiB)")
    for line in ("%gpumem snapshot", "%%gpumem_trace\nx = a.malloc(MiB)\na.free(x)",
                 "%gpumem plot", "%gpumem replay last --config defaults"):
        drawn[0] = 0
        result, out = run(line)
        assert result.success
        (bundle,) = [o.data for o in out.outputs] or [result.result._repr_mimebundle_()]
        assert drawn[0] == 1, line
        ((png, _),) = html_images(bundle["text/html"])
        assert bundle["image/png"] == png and base64.b64decode(png)[:4] == b"\x89PNG"
    run("a.free(keep)\n%gpumem history off")


def test_a_headless_run_without_live_views_stores_no_widget(tmp_path: Path) -> None:
    """What the README advises for a notebook run headless (nbclient, papermill): with
    ``GpuMem.live_view`` off, no widget is made, so nbclient stores no widget state even though
    it stores it by default, and every output is its picture and text."""
    from script_module import load_script

    views = load_script(ROOT / "tests" / "browser" / "saved_views.py")
    nb = nbformat.from_dict(views.notebook_json(
        "%load_ext jupyter_gpumem\n%config GpuMem.live_view = False\n%gpumem device sim",
        views.WORKLOAD,
        "%%gpumem_trace\nimport jupyter_gpumem as gm\nkept = run(gm.get_allocator())",
        "%gpumem"))
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}
                            ).execute(env=views.kernel_env())
    saved = json.loads(nbformat.writes(nb))
    assert "widgets" not in saved["metadata"] and notebook_problems(saved) == []
    assert referenced_models(saved) == set()
    assert sum("image/png" in o.get("data", {}) for c in saved["cells"] for o in c["outputs"]) == 2
