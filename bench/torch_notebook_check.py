"""On a GPU: a PyTorch notebook with only ``%load_ext jupyter_gpumem`` and ``%gpumem source
torch``, run by nbclient, checked against ``torch.cuda.memory_allocated()``.

    python bench/torch_notebook_check.py [OUT.ipynb]

The notebook trains a small MLP (``nn.Sequential``, AdamW) over a few cells, each printing
``torch.cuda.memory_allocated()`` at its end, then traces one first step of a fresh model with
``%%gpumem_trace``. The checks, printed as a pass/fail report (exit status 1 on any failure):

- one ledger row per cell from PyTorch's allocator, whose Δallocated equals the difference of
  the printed ``memory_allocated()`` of the cell and of the cell before it;
- each row's peak is at most ``max_memory_allocated()``, and exact rows at least the cell's end;
- the footer is printed under each training cell;
- the trace's survivors are held by a parameter (``model.0.weight``), a gradient
  (``....grad``), optimizer state (``opt.state[...]``) and an activation (``out``).
"""

from __future__ import annotations

import json
import sys

SETUP = """\
import torch
from torch import nn
dev = torch.device("cuda")
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def step(batch=512):
    x = torch.randn(batch, 512, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss
print("ALLOC", torch.cuda.memory_allocated())"""
TRAIN = """\
loss = step()
torch.cuda.synchronize()
print("ALLOC", torch.cuda.memory_allocated())"""
TRACE = """\
%%gpumem_trace -o t --no-plot
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(512, 512, device=dev)
out = model(x)
out.square().mean().backward()
opt.step()"""
REPORT = """\
import json
from jupyter_gpumem.notebook.extension import get_extension
ext = get_extension()
rows = [dict(r) for r in ext.ledger.rows if r.get("memory_source") == "torch"]
print("ROWS", json.dumps(rows))
print("HOLDERS", json.dumps(sorted({n for b in t.surviving for n in b.holders})))
print("MAX", torch.cuda.max_memory_allocated())"""


def build() -> object:
    import nbformat

    cells = ["%load_ext jupyter_gpumem", "%gpumem source torch\n%gpumem auto on", SETUP,
             TRAIN, TRAIN, TRAIN, TRACE, REPORT]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def stdout_of(cell: dict) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def main(out_path: str | None) -> int:
    import nbformat
    from nbclient import NotebookClient

    nb = build()
    NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    if out_path:
        nbformat.write(nb, out_path)
    texts = [stdout_of(c) for c in nb.cells]
    allocs = {i: int(line.split()[1]) for i, text in enumerate(texts)
              for line in text.splitlines() if line.startswith("ALLOC ")}
    report = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
              for line in texts[-1].splitlines()
              if line.split(" ", 1)[0] in ("ROWS", "HOLDERS", "MAX")}
    rows = report["ROWS"]
    by_count = {r["cell"]: r for r in rows}
    results: list[tuple[bool, str]] = []
    for i in (3, 4, 5):  # the training cells, against the cell before
        count = nb.cells[i].get("execution_count")
        row = by_count.get(count)
        if row is None:
            results.append((False, f"cell {i} (In [{count}]): no ledger row"))
            continue
        want = allocs[i] - allocs[i - 1]
        results.append((row["allocated_delta"] == want,
                        f"cell {i}: ledger Δallocated {row['allocated_delta']} == "
                        f"memory_allocated() difference {want}"))
        results.append((row["peak_allocated"] <= report["MAX"]
                        and (not row.get("peak_exact", True) or row["peak_allocated"] >= allocs[i]),
                        f"cell {i}: peak {row['peak_allocated']} "
                        f"(exact={row.get('peak_exact', True)}) within [{allocs[i]}, "
                        f"{report['MAX']}]"))
        results.append((f"gpumem [{count}] torch: Δallocated" in texts[i],
                        f"cell {i}: footer printed"))
    holders = report["HOLDERS"]
    for what, test in (("parameter", lambda n: n == "model.0.weight"),
                       ("gradient", lambda n: n.endswith(".grad")),
                       ("optimizer state", lambda n: n.startswith("opt.state[")),
                       ("activation", lambda n: n == "out")):
        results.append((any(test(n) for n in holders), f"trace holders name a {what}"))
    for ok, text in results:
        print(("PASS " if ok else "FAIL ") + text)
    print(f"holders: {holders}")
    failed = sum(not ok for ok, _ in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
