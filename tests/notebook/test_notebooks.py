"""The example notebooks, executed headless by nbclient on the simulated device."""

from __future__ import annotations

from pathlib import Path

import nbclient
import nbformat
from cell_text import notebook_text as texts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def execute(name: str):
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return [c for c in nb.cells if c.cell_type == "code"]




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
