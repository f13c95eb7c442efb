"""A notebook that shows every kind of output jupyter_gpumem makes, on simulated devices, run by
nbclient: the checks of ``notebook_checks`` (tests/notebook/test_notebooks.py) and the HTML
export (tests/browser/test_nbconvert.py) read it.

Its cells: the status line, layout and live view of a bare ``%gpumem`` (left running: it is still
a widget when the notebook is saved), summary and stats, ``snapshot``, a traced cell, a traced
cell long enough to keep its live curve, a traced cell that raises, the footer (``auto on``),
``plot``, ``cells``, ``diff``, an out-of-memory error and its panel, ``replay --suggest`` and
``replay --config``, ``dump`` and ``load``, ``forget-error``, ``info``, and on a Dask cluster of
two worker processes: ``%gpumem cluster`` (its live strip stopped by the next one, which is left
running) and ``%%gpumem_trace --cluster``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = load_script(ROOT / "tests" / "browser" / "saved_views.py").WORKLOAD

#: ``(source, raises)`` of every cell, in order; a cell that raises is tagged so.
CELLS: list[tuple[str, bool]] = [
    ("%load_ext jupyter_gpumem\n%gpumem device sim --capacity 16GiB\n%gpumem history on", False),
    (WORKLOAD, False),
    ("import jupyter_gpumem as gm\na = gm.get_allocator()\n"
     "weights = [a.malloc(64 << 20) for _ in range(2)]", False),
    ("%gpumem", False),
    ("%gpumem summary\n%gpumem stats", False),
    ("%gpumem snapshot", False),
    ("%%gpumem_trace -o t\nkept = run(a)", False),
    ("%%gpumem_trace\nimport time\nheld = a.malloc(8 << 20)\ntime.sleep(2.5)", False),
    ("%%gpumem_trace\nlost = a.malloc(4 << 20)\nraise ValueError('boom')", True),
    ("%gpumem auto on\nextra = a.malloc(16 << 20)", False),
    ("%gpumem plot", False),
    ("%gpumem cells", False),
    ("%gpumem diff 3 10", False),
    ("big = a.malloc(40 << 30)", True),
    ("%gpumem replay last --suggest", False),
    ("%gpumem replay last --config defaults --config roundup_power2_divisions:4", False),
    ("%gpumem dump every-output.gpumem\n%gpumem load every-output.gpumem", False),
    ("%gpumem forget-error\n%gpumem info", False),
    ("from distributed import Client, LocalCluster\n"
     "from jupyter_gpumem.dask import GpuMemPlugin\n"
     "cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,\n"
     "                       dashboard_address=None, silence_logs=50)\n"
     "client = Client(cluster)\n"
     "client.register_plugin(GpuMemPlugin(device='sim', capacity=1 << 32))", False),
    ("%gpumem cluster --interval 0.2\ntime.sleep(1)", False),
    ("%%gpumem_trace --cluster\n"
     "def hold(n):\n    import jupyter_gpumem\n"
     "    return jupyter_gpumem.caching_allocator_alloc(n)\n"
     "held_on_workers = client.gather([client.submit(hold, (i + 1) << 20, pure=False)\n"
     "                                 for i in range(4)])", False),
    ("%gpumem cluster --interval 0.2\ntime.sleep(1)", False),
]

#: The cell of each output kind the tests look at.
STATUS, TRACE, LONG_TRACE, RAISING_TRACE, PLOT, OOM, SUGGEST, COMPARE, LOAD = (
    3, 6, 7, 8, 10, 13, 14, 15, 16)
CLUSTER_STOPPED, CLUSTER_TRACE, CLUSTER_RUNNING = 19, 20, 21


def notebook() -> Any:
    """The notebook of CELLS, not yet run."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    for i, (source, raises) in enumerate(CELLS):
        cell = nbformat.v4.new_code_cell(source, id=f"cell{i}")
        if raises:
            cell.metadata["tags"] = ["raises-exception"]
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    return nb


def execute(folder: Path, *, store_widget_state: bool = True) -> Any:
    """Run the notebook in a fresh python3 kernel (working in ``folder``, this checkout first on
    its path) with nbclient, widget state stored as nbclient does by default; the notebook run."""
    from nbclient import NotebookClient

    nb = notebook()
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(folder)}},
                       store_widget_state=store_widget_state).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb
