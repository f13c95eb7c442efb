"""On a GPU: JAX notebooks run by nbclient with only ``%load_ext jupyter_gpumem`` and
``%gpumem source jax`` (or ``all``), checked against JAX's own ``memory_stats()`` (skipped where
JAX, nbclient or a GPU is missing).

- ``%gpumem source jax``: one ledger row from JAX a cell that made arrays, its Δallocated the
  difference of XLA's ``bytes_in_use`` printed at the cells' ends; the footer of the cell that
  made a params pytree names it (``params``); the status line says what XLA preallocated; an
  induced ``RESOURCE_EXHAUSTED`` (160 GiB on a 140 GiB device) is explained by the panel, with
  JAX's own steps (``jax.live_arrays()``);
- ``%gpumem source all`` with CuPy, PyTorch and JAX in one notebook
  (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, so that the three fit): the status line has a row
  for each, and the cell that made 4 MiB with each library has a ledger row for each, of 4 MiB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cell_text import notebook_text as texts

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

LOAD = "%load_ext jupyter_gpumem"
#: the ledger's rows and the shell's execution count, printed by the notebook's last cell
ROWS = """\
import json
from jupyter_gpumem.notebook.extension import get_extension
print("ROWS", json.dumps([dict(r) for r in get_extension(get_ipython()).ledger.rows]))"""

JAX_CELLS = {
    "setup": "import jax, jax.numpy as jnp\nx0 = jnp.zeros((1,))\nx0.block_until_ready()",
    "load": f"{LOAD}\n%gpumem source jax\n%gpumem auto on",
    "params": """\
params = {"dense": {"w": jnp.ones((2048, 2048)), "b": jnp.zeros((2048,))},
          "head": [jnp.ones((2048, 512))]}
jax.block_until_ready(params)
print("INUSE", jax.devices()[0].memory_stats()["bytes_in_use"])""",
    "step": """\
@jax.jit
def forward(p, x):
    return jnp.tanh(x @ p["dense"]["w"] + p["dense"]["b"]) @ p["head"][0]
x = jnp.ones((4096, 2048))
y = forward(params, x)
y.block_until_ready()
print("INUSE", jax.devices()[0].memory_stats()["bytes_in_use"])""",
    "status": "%gpumem",
    "oom": "z = jnp.zeros((160 << 30,), jnp.uint8)\nz.block_until_ready()",
    "rows": ROWS,
}

ALL_CELLS = {
    "setup": """\
import os
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # before JAX starts: three libraries
import cupy as cp, torch, jax, jax.numpy as jnp
j0 = jnp.zeros((1,)); j0.block_until_ready()
t0 = torch.zeros(1, device="cuda")""",
    "load": f"{LOAD}\n%gpumem source all",
    "alloc": """\
a = cp.ones((1 << 20,), cp.float32)
t = torch.ones(1 << 20, device="cuda")
j = jnp.ones((1 << 20,))
j.block_until_ready(); torch.cuda.synchronize(); cp.cuda.Device().synchronize()""",
    "status": "%gpumem",
    "rows": ROWS,
}


def _needs_jax_gpu() -> None:
    pytest.importorskip("nbclient")
    pytest.importorskip("nbformat")
    jax = pytest.importorskip("jax")
    # asking JAX for its devices here would start (and preallocate) its backend in pytest's
    # process: the notebook's kernel is the one that uses the GPU
    del jax


def run_notebook(cells: dict[str, str]) -> dict[str, Any]:
    """Execute ``cells`` in a fresh kernel (the project's folder its working directory);
    each cell by its name, executed, errors kept in its outputs."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook()
    for name, source in cells.items():
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["name"] = name
        nb.cells.append(cell)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     allow_errors=True,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return {c.metadata["name"]: c for c in nb.cells}




def errors(cell: Any) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


def printed(cell: Any, word: str) -> int:
    return int(next(line.split()[1] for line in texts(cell).splitlines()
                    if line.startswith(f"{word} ")))


def ledger_rows(cells: dict[str, Any]) -> list[dict[str, Any]]:
    line = next(x for x in texts(cells["rows"]).splitlines() if x.startswith("ROWS "))
    rows: list[dict[str, Any]] = json.loads(line[5:])
    return rows


def rows_of(rows: list[dict[str, Any]], cell: Any) -> dict[str, dict[str, Any]]:
    """The ledger's rows of ``cell``, by source (a row without one is our allocator's)."""
    return {r.get("memory_source", "cupy"): r for r in rows
            if r["cell"] == cell.execution_count}


def test_a_jax_notebook() -> None:
    _needs_jax_gpu()
    cells = run_notebook(JAX_CELLS)
    for name, cell in cells.items():
        if name != "oom":
            assert errors(cell) == [], (name, texts(cell))
    rows = ledger_rows(cells)
    params, step = rows_of(rows, cells["params"]), rows_of(rows, cells["step"])
    assert "jax" in params and "jax" in step, rows
    in_params, in_step = printed(cells["params"], "INUSE"), printed(cells["step"], "INUSE")
    # XLA's bytes_in_use before the params cell: the 1-element array of the setup cell
    assert params["jax"]["allocated_delta"] == in_params - 256
    assert params["jax"]["allocated_delta"] >= (2048 * 2048 + 2048 + 2048 * 512) * 4
    assert step["jax"]["allocated_delta"] == in_step - in_params
    assert step["jax"]["peak_allocated"] >= in_step
    footer = texts(cells["params"])
    assert "params" in footer[footer.rfind("gpumem ["):], footer  # the pytree holds it all
    status = texts(cells["status"])
    assert "jax" in status and "XLA preallocates 75% of the device for JAX" in status, status
    oom = cells["oom"]
    assert any("RESOURCE_EXHAUSTED" in e for e in errors(oom)), texts(oom)
    panel = [o for o in oom.outputs if o.output_type == "display_data"]
    assert panel, texts(oom)
    said = panel[-1].data["text/plain"]
    assert "160 GiB" in said and "jax.live_arrays()" in said, said
    assert "text/html" in panel[-1].data


def test_cupy_torch_and_jax_in_one_notebook() -> None:
    _needs_jax_gpu()
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    cells = run_notebook(ALL_CELLS)
    for name, cell in cells.items():
        assert errors(cell) == [], (name, texts(cell))
    status = texts(cells["status"])
    for name in ("cupy", "torch", "jax"):
        assert f"{name}:" in status, status
    assert "XLA takes memory as JAX needs it" in status, status
    alloc = rows_of(ledger_rows(cells), cells["alloc"])
    assert {name: alloc[name]["allocated_delta"] for name in ("cupy", "torch", "jax")
            if name in alloc} == {"cupy": 4 * MiB, "torch": 4 * MiB, "jax": 4 * MiB}, alloc
