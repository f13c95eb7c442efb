"""On a GPU: a PyTorch notebook with only ``%load_ext jupyter_gpumem`` and ``%gpumem source
torch``, run by nbclient, checked against ``torch.cuda.memory_stats()``.

    python bench/torch_notebook_check.py OUT.ipynb [--dry-run]

Writes the executed notebook to ``OUT.ipynb`` and the report (what it prints) beside it, to
``OUT.report.txt``. ``--dry-run`` runs the same notebook with no GPU: a ``torch`` made of
``tests/fake_torch.py`` (our allocator on a simulated device, served under PyTorch's names),
the extension on a simulated device, and the model cells on fake modules; it checks the checks.

The notebook trains a small MLP (``nn.Sequential``, AdamW) over a few cells, each printing
``torch.cuda.memory_allocated()`` at its end, traces the first two steps of a fresh model with
``%%gpumem_trace``, asks PyTorch for twice the device, then turns on ``%gpumem source both`` and
allocates a CuPy array and a tensor in one cell. The checks, each printed PASS or FAIL with its
numbers (an exception in one check is a FAIL of that check; exit status 1 on any failure):

- ledger: one row per training cell from PyTorch's allocator, whose Δallocated equals the
  difference of the printed ``memory_allocated()`` of the cell and of the cell before it; its
  peak is at most ``max_memory_allocated()``, and an exact peak at least the cell's end; the
  footer is printed under it;
- trace: the survivors are held by a parameter (``model.0.weight``), a gradient (``....grad``),
  optimizer state (``opt.state[...]``) and an activation (``out``); the traced cell's view
  payload (``MIME_TYPE``, kind trace) has bands by holder, among them "parameters & buffers",
  "gradients", "optimizer state" and "freed during the trace ..." (the activations), each with
  bytes at the peak, and its bands sum to allocated at every point;
- live widget: the traced cell's output is the live view's static fallback (``live_view`` is on
  by default), whose sampled allocated bytes lie in [0, ``max_memory_allocated()``] and whose
  last sample is ``memory_allocated()`` after the cell;
- OOM panel: ``torch.empty(2 * total)`` raises ``torch.OutOfMemoryError`` and the panel is shown
  (text/plain and text/html); its allocated and reserved bytes (the panel's report) and the
  figures it prints equal ``torch.cuda.memory_stats()`` read in the next cell;
- both sources: the cell's footer has a "cupy" and a "torch" row whose Δallocated (in the
  ledger, exact, and as printed) equal ``jupyter_gpumem.memory_allocated()``'s and
  ``torch.cuda.memory_allocated()``'s differences; the status line (bare ``%gpumem``) has a
  "cupy:" and a "torch:" row;
- no cell but the OOM cell raised.
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIME_TYPE = "application/vnd.jupyter-gpumem.trace+json"

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
for _ in range(2):  # the second step's peak has the first's gradients and optimizer state
    out = model(x)
    out.square().mean().backward()
    opt.step()
torch.cuda.synchronize()
import time
time.sleep(2.5)  # samples enough for the live view to keep its curve (MIN_PLOTTED)"""
REPORT = """\
import importlib.util, json
from jupyter_gpumem.notebook.extension import get_extension
ext = get_extension()
print("NOW", torch.cuda.memory_allocated())
rows = [dict(r) for r in ext.ledger.rows if r.get("memory_source") == "torch"]
print("ROWS", json.dumps(rows, default=str))
print("HOLDERS", json.dumps(sorted({n for b in t.surviving for n in b.holders})))
print("MAX", torch.cuda.max_memory_allocated())
print("WIDGET", json.dumps({"live_view": ext.settings.live_view,
                            "anywidget": importlib.util.find_spec("anywidget") is not None,
                            "ipywidgets": importlib.util.find_spec("ipywidgets") is not None}))"""
OOM = """\
total = torch.cuda.mem_get_info()[1]
huge = torch.empty(int(2 * total), dtype=torch.uint8, device=dev)"""
AFTER_OOM = """\
st = torch.cuda.memory_stats()
panel = get_extension().last_oom
report = getattr(panel, "report", None)
print("OOMSTATS", json.dumps({
    "allocated": st.get("allocated_bytes.all.current", 0),
    "reserved": st.get("reserved_bytes.all.current", 0),
    "panel": panel is not None, "panel_cell": getattr(panel, "cell", None),
    "panel_allocated": getattr(report, "allocated", None),
    "panel_reserved": getattr(report, "reserved", None)}))"""
BOTH = "%gpumem source both"
BEFORE = """\
import cupy as cp
import jupyter_gpumem as gm
MiB = 1 << 20
def both_now():
    return json.dumps({"cupy": gm.memory_allocated(), "torch": torch.cuda.memory_allocated()})
print("BEFORE", both_now())"""
BOTH_ALLOC = """\
ca = cp.empty(3 * MiB, dtype=cp.uint8)
tb = torch.empty(5 * MiB, dtype=torch.uint8, device=dev)
torch.cuda.synchronize()
print("AFTER", both_now())"""
STATUS = "%gpumem"
FINAL = """\
print("ALLROWS", json.dumps([dict(r) for r in get_extension().ledger.rows][-6:], default=str))"""

#: (name, source, tags) of each cell, in order.
CELLS: list[tuple[str, str, list[str]]] = [
    ("load", "%load_ext jupyter_gpumem", []),
    ("source", "%gpumem source torch\n%gpumem auto on", []),
    ("setup", SETUP, []),
    ("train1", TRAIN, []), ("train2", TRAIN, []), ("train3", TRAIN, []),
    ("trace", TRACE, []),
    ("report", REPORT, []),
    ("oom", OOM, ["raises-exception"]),
    ("after_oom", AFTER_OOM, []),
    ("both", BOTH, []),
    ("before", BEFORE, []),
    ("both_alloc", BOTH_ALLOC, []),
    ("status", STATUS, []),
    ("final", FINAL, []),
]

# -- the dry run: no GPU, no torch, no CuPy --------------------------------------------------------

DRY_PRELUDE = """\
import sys, types
sys.path.insert(0, {tests!r})
import fake_torch as ft
mem = ft.FakeTorchMemory(capacity=4 << 30)
mem.memory = mem
mem.synchronize = lambda *a: None
torch = types.ModuleType("torch")
torch.cuda = mem
torch.OutOfMemoryError = ft.OutOfMemoryError
torch.uint8 = "uint8"
torch.device = lambda name: name
torch.empty = lambda n, dtype=None, device=None: mem.empty(n)
sys.modules.update({{"torch": torch, "torch.cuda": mem, "torch.cuda.memory": mem}})"""
DRY = {
    "load": "%load_ext jupyter_gpumem\n%gpumem device sim",
    "setup": """\
dev = torch.device("cuda")
model = ft.FakeSequential(ft.FakeLinear(mem, 512, 2048), None, ft.FakeLinear(mem, 2048, 10))
opt = ft.FakeAdamW(model.parameters())
def step(batch=512):
    x = mem.empty(batch * 512 * 4)
    for p in model.parameters():
        p.grad = mem.empty(p.nbytes)
    opt.step()
    return x
print("ALLOC", torch.cuda.memory_allocated())""",
    "trace": """\
%%gpumem_trace -o t --no-plot
model = ft.FakeSequential(ft.FakeLinear(mem, 512, 2048), None, ft.FakeLinear(mem, 2048, 10))
opt = ft.FakeAdamW(model.parameters())
for _ in range(2):
    acts = [mem.empty(512 * 2048 * 4) for _ in range(2)]
    out = mem.empty(512 * 10 * 4)
    for p in model.parameters():
        if p.grad is None:
            p.grad = mem.empty(p.nbytes)
    opt.step()
    del acts
import time
time.sleep(2.5)""",
    "before": BEFORE.replace("import cupy as cp\n", ""),
    "both_alloc": BOTH_ALLOC.replace("cp.empty(3 * MiB, dtype=cp.uint8)",
                                     "gm.caching_allocator_alloc(3 * MiB)"),
}


def build(dry: bool = False) -> Any:
    import nbformat

    nb = nbformat.v4.new_notebook()
    cells = []
    if dry:
        cells.append(nbformat.v4.new_code_cell(DRY_PRELUDE.format(tests=str(ROOT / "tests")),
                                               metadata={"name": "dry_prelude"}))
    for name, source, tags in CELLS:
        source = DRY.get(name, source) if dry else source
        cells.append(nbformat.v4.new_code_cell(source, metadata={"name": name, "tags": tags}))
    nb.cells = cells
    return nb


# -- reading the executed notebook ---------------------------------------------------------------

def stdout_of(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def displays_of(cell: Any) -> list[dict[str, Any]]:
    """The data bundles of a cell's display_data / execute_result outputs."""
    return [dict(o.get("data", {})) for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")]


def errors_of(cell: Any) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue', '')[:300]}" for o in cell.get("outputs", [])
            if o.get("output_type") == "error"]


def tagged(nb: Any, prefix: str) -> dict[int, Any]:
    """``{cell index: json}`` of each stdout line ``PREFIX json`` (or ``PREFIX int``)."""
    out: dict[int, Any] = {}
    for i, cell in enumerate(nb.cells):
        for line in stdout_of(cell).splitlines():
            head, _, rest = line.partition(" ")
            if head == prefix:
                out[i] = json.loads(rest)
    return out


class Checks:
    """PASS/FAIL lines; a check that raises is a FAIL with the exception."""

    def __init__(self) -> None:
        self.results: list[tuple[bool, str]] = []

    def add(self, ok: bool, text: str) -> None:
        self.results.append((bool(ok), text))

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            self.add(False, f"{name}: check raised {type(exc).__name__}: {exc}")
            tb = traceback.format_exc().strip().splitlines()
            self.results.append((False, f"{name}:   " + " | ".join(tb[-3:])))


def check(nb: Any) -> Checks:
    """Every check of the module docstring on the executed notebook ``nb``."""
    from jupyter_gpumem.data.units import format_bytes, format_signed_bytes

    index = {c.metadata.get("name"): i for i, c in enumerate(nb.cells)}
    texts = [stdout_of(c) for c in nb.cells]
    count = {name: nb.cells[i].get("execution_count") for name, i in index.items()}
    checks = Checks()

    def report(prefix: str, cell: str) -> Any:
        found = tagged(nb, prefix)
        if index[cell] not in found:
            raise LookupError(f"cell {cell!r} printed no {prefix} line; its errors: "
                              f"{errors_of(nb.cells[index[cell]])}")
        return found[index[cell]]

    def no_errors() -> None:
        bad = {name: errors_of(nb.cells[i]) for name, i in index.items()
               if name != "oom" and errors_of(nb.cells[i])}
        checks.add(not bad, f"no cell but the OOM cell raised ({bad or 'none'})")

    def ledger() -> None:
        allocs = tagged(nb, "ALLOC")
        rows = {r["cell"]: r for r in report("ROWS", "report")}
        peak_max = report("MAX", "report")
        for name in ("train1", "train2", "train3"):
            i = index[name]
            row = rows.get(count[name])
            if row is None:
                checks.add(False, f"{name} (In [{count[name]}]): no ledger row")
                continue
            want = allocs[i] - allocs[i - 1]
            checks.add(row["allocated_delta"] == want,
                       f"{name}: ledger Δallocated {row['allocated_delta']} == "
                       f"memory_allocated() difference {want}")
            exact = row.get("peak_exact", True)
            checks.add(row["peak_allocated"] <= peak_max
                       and (not exact or row["peak_allocated"] >= allocs[i]),
                       f"{name}: peak {row['peak_allocated']} (exact={exact}) within "
                       f"[{allocs[i]}, {peak_max}]")
            checks.add(f"gpumem [{count[name]}] torch: Δallocated" in texts[i],
                       f"{name}: footer printed")

    def holders() -> None:
        names = report("HOLDERS", "report")
        for what, test in (("parameter", lambda n: n == "model.0.weight"),
                           ("gradient", lambda n: n.endswith(".grad")),
                           ("optimizer state", lambda n: n.startswith("opt.state[")),
                           ("activation", lambda n: n == "out")):
            checks.add(any(test(n) for n in names), f"trace holders name a {what}")
        print(f"holders: {names}")

    def bands() -> None:
        import base64

        import numpy as np

        def column(col: dict[str, Any]) -> Any:
            raw = col["data"]
            data = base64.b64decode(raw) if isinstance(raw, str) else bytes(raw)
            return np.frombuffer(data, dtype={"f8": "<f8", "i4": "<i4"}[col["dtype"]])

        payloads = [json.loads(d[MIME_TYPE]) if isinstance(d[MIME_TYPE], str) else d[MIME_TYPE]
                    for d in displays_of(nb.cells[index["trace"]]) if MIME_TYPE in d]
        traces = [p for p in payloads if p.get("kind") == "trace"]
        checks.add(bool(traces), f"trace cell: a {MIME_TYPE} payload of kind trace "
                                 f"({[p.get('kind') for p in payloads]})")
        if not traces:
            return
        tl = traces[-1]["timeline"]
        labels = list(tl["band_labels"])
        values = np.array([column(c) for c in tl["bands"]]).reshape(len(labels), -1)
        allocated = column(tl["allocated"])
        checks.add(tl.get("bands_by") == "holder",
                   f"trace bands by holder under PyTorch (bands_by={tl.get('bands_by')!r})")
        checks.add(bool(np.array_equal(values.sum(axis=0), allocated)),
                   f"trace bands sum to allocated at all {len(allocated)} points")
        j = int(np.argmax(allocated)) if len(allocated) else 0
        at_peak = {label: int(values[g, j]) if len(allocated) else 0
                   for g, label in enumerate(labels)}
        print(f"bands at the peak: {at_peak}")
        for want in ("parameters & buffers", "gradients", "optimizer state",
                     "freed during the trace"):
            found = [label for label in labels if label.startswith(want)]
            checks.add(bool(found) and at_peak[found[0]] > 0,
                       f"trace band {want!r}: {at_peak.get(found[0]) if found else 'absent'} "
                       f"bytes at the peak (bands: {labels})")

    def live_view() -> None:
        import base64

        import numpy as np

        widget = report("WIDGET", "report")
        shown = [d for d in displays_of(nb.cells[index["trace"]])
                 if str(d.get("text/plain", "")).startswith("gpumem live view")]
        checks.add(bool(shown), f"trace cell: live view output shown ({len(shown)}; settings "
                                f"and modules: {widget})")
        if not shown:
            return
        bundle = shown[-1]
        checks.add("text/html" in bundle and MIME_TYPE in bundle,
                   f"trace cell: live view's static fallback has text/html and {MIME_TYPE} "
                   f"({sorted(bundle)}); text: {bundle['text/plain']!r}")
        payload = bundle[MIME_TYPE]
        if isinstance(payload, str):
            payload = json.loads(payload)
        samples = payload["samples"]
        col = samples["data"]
        raw = col["data"]
        data = base64.b64decode(raw) if isinstance(raw, str) else bytes(raw)
        arr = np.frombuffer(data, dtype=np.float64).reshape(-1, 4)
        allocated = arr[:, 1]
        peak_max = report("MAX", "report")
        now = report("NOW", "report")
        checks.add(len(arr) >= 1 and int(samples["n"]) == len(arr),
                   f"live view: {len(arr)} samples (n={samples['n']})")
        if len(arr):
            checks.add(bool(allocated.min() >= 0 and allocated.max() <= peak_max),
                       f"live view: allocated samples in [{int(allocated.min())}, "
                       f"{int(allocated.max())}] within [0, max_memory_allocated() {peak_max}]")
            checks.add(int(allocated[-1]) == now,
                       f"live view: last sample {int(allocated[-1])} == memory_allocated() "
                       f"after the cell {now}")

    def oom_panel() -> None:
        cell = nb.cells[index["oom"]]
        errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        checks.add(any(o.get("ename") == "OutOfMemoryError" for o in errs),
                   f"oom cell raised OutOfMemoryError ({errors_of(cell)})")
        panels = [d for d in displays_of(cell)
                  if "GPU out of memory" in str(d.get("text/plain", ""))]
        checks.add(bool(panels) and "jupyter-gpumem-oom" in str(panels[-1].get("text/html", "")),
                   f"OOM panel shown with text/plain and text/html ({len(panels)} panel(s))")
        st = report("OOMSTATS", "after_oom")
        checks.add(st["panel_allocated"] == st["allocated"],
                   f"OOM panel: allocated {st['panel_allocated']} == memory_stats() "
                   f"allocated_bytes.all.current {st['allocated']}")
        checks.add(st["panel_reserved"] == st["reserved"],
                   f"OOM panel: reserved {st['panel_reserved']} == memory_stats() "
                   f"reserved_bytes.all.current {st['reserved']}")
        checks.add(st["panel_cell"] == count["oom"],
                   f"OOM panel: names cell [{st['panel_cell']}] (the cell is In [{count['oom']}])")
        if panels:
            text = str(panels[-1]["text/plain"])
            m = re.search(r"this process: (.+?) allocated, (.+?) reserved", text)
            want = (format_bytes(st["allocated"]), format_bytes(st["reserved"]))
            got = m.groups() if m else None
            checks.add(got == want, f"OOM panel prints allocated, reserved {got} == "
                                    f"memory_stats() formatted {want}")
            print("OOM panel text:\n  " + text.replace("\n", "\n  "))

    def both() -> None:
        before = report("BEFORE", "before")
        after = report("AFTER", "both_alloc")
        text = texts[index["both_alloc"]]
        footer = [ln for ln in text.splitlines() if ln.startswith("gpumem [")]
        n = count["both_alloc"]
        rows = report("ALLROWS", "final")
        for label in ("cupy", "torch"):
            want = after[label] - before[label]
            line = [ln for ln in footer if ln.startswith(f"gpumem [{n}] {label}: Δallocated ")]
            row = [r for r in rows if r["cell"] == n
                   and r.get("memory_source", "cupy") == label]
            checks.add(len(line) == 1, f"both: footer row {label!r} ({line})")
            if not row:
                checks.add(False, f"both: no {label} ledger row for In [{n}]")
                continue
            delta = row[-1]["allocated_delta"]
            checks.add(delta == want, f"both: {label} ledger Δallocated {delta} == the "
                                      f"library's difference {want}")
            if line:
                shown = line[0].split("Δallocated ", 1)[1].split(" · ")[0]
                checks.add(shown == format_signed_bytes(want),
                           f"both: {label} footer Δallocated {shown!r} == "
                           f"{format_signed_bytes(want)!r}")
        checks.add([ln.split(":")[0].split()[-1] for ln in footer] == ["cupy", "torch"],
                   f"both: footer rows in order cupy, torch ({len(footer)} rows)")

    def status() -> None:
        plain = "\n".join(str(d.get("text/plain", ""))
                          for d in displays_of(nb.cells[index["status"]]))
        lines = plain.splitlines()
        cupy = [ln for ln in lines if ln.startswith("cupy: gpumem ·")]
        torch = [ln for ln in lines if ln.startswith("torch: gpumem · torch device")]
        checks.add(len(cupy) == 1 and len(torch) == 1,
                   f"status line under both sources: two rows ({cupy + torch or lines[:4]})")

    for name, fn in (("errors", no_errors), ("ledger", ledger), ("holders", holders),
                     ("bands", bands), ("live view", live_view), ("OOM panel", oom_panel),
                     ("both sources", both), ("status", status)):
        checks.run(name, fn)
    return checks


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    dry = "--dry-run" in argv
    if len(args) != 1:
        print(__doc__)
        return 2
    out = Path(args[0])
    report_path = out.with_suffix(".report.txt")
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    import nbformat
    from nbclient import NotebookClient

    nb = build(dry)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True).execute()
    except Exception as exc:  # a kernel that died or timed out: check what ran
        say(f"FAIL notebook run: {type(exc).__name__}: {exc}")
    try:
        nbformat.write(nb, str(out))
        say(f"notebook: {out}")
    except Exception as exc:
        say(f"FAIL writing the notebook: {exc}")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        checks = check(nb)
    for line in buf.getvalue().splitlines():
        say(line)
    for ok, text in checks.results:
        say(("PASS " if ok else "FAIL ") + text)
    failed = sum(not ok for ok, _ in checks.results)
    say(f"{len(checks.results) - failed} passed, {failed} failed" + (" (dry run)" if dry else ""))
    with contextlib.suppress(OSError):
        report_path.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
