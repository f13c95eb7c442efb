"""On a GPU: a PyTorch fragmentation OOM in a notebook, the replay's offer, and the proof.

    python bench/torch_whatif_check.py OUT_DIR [--dry-run]

A notebook run by nbclient, with only ``%load_ext jupyter_gpumem``, ``%gpumem source torch`` and
``%gpumem history on``, leaves PyTorch ``ROOM`` bytes of the GPU: the rest is taken by a raw
``cudaMalloc`` outside PyTorch's allocator (as a CUDA context, libraries or other processes take
some of every GPU). It then runs a program that fragments PyTorch's cache: 2,400 MiB allocated and
freed, 400 MiB kept (the default policy splits the cached segment for it), 2,400 MiB asked again:
``torch.OutOfMemoryError``, though the program needs 2,800 MiB of the 4,096. Then:

- the OOM panel must offer a config that would have fit, with how PyTorch takes it;
- ``%gpumem replay last --suggest`` must find one, and replaying the trace under its recorded
  config must meet the out-of-memory error at the recorded event, on a device of about ``ROOM``
  (what PyTorch could use: Note [The replayed device's size]);
- the proof: the same program, in a fresh process with ``PYTORCH_CUDA_ALLOC_CONF`` set to the
  suggested config, fits; with the recorded (default) config it fails again.

Then the same program in this process under ``torch.cuda.set_per_process_memory_fraction``
(``fraction_check``): the fraction, which PyTorch's snapshot does not say, is read with the
trace, so the replay meets the error where it was recorded.

Each check prints PASS or FAIL with its numbers; exit status 1 on any failure. The executed
notebook and the report go to OUT_DIR. ``--dry-run`` runs it all with no GPU: a fake ``torch``
(``tests/fake_torch.py``: PyTorch's policy on a simulated device) whose other "process" holds the
memory outside, and the fresh processes replaced by fresh fake allocators.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
ROOM = 4096 * MiB
#: The program: sizes in MiB; the middle one stays live.
FIRST, KEPT, AGAIN = 2400, 400, 2400

GPU_SETUP = f"""\
import json, torch, cupy
MiB = 1 << 20
dev = torch.device("cuda")
torch.empty(1, device=dev)  # PyTorch's context first: what is free after it is what we split
free, total = torch.cuda.mem_get_info()
outside = cupy.cuda.runtime.malloc(free - {ROOM})  # raw: neither PyTorch's nor our allocator
def empty(mib):
    return torch.empty(mib * MiB, dtype=torch.uint8, device=dev)"""
DRY_SETUP = f"""\
import json, sys, types
sys.path.insert(0, {str(ROOT / "tests")!r})
import fake_torch as ft
MiB = 1 << 20
mem = ft.FakeTorchMemory(capacity=4 * {ROOM})
mem.memory = mem
mem.device.hold_for_process(4242, 3 * {ROOM}, "outside PyTorch")
torch = types.ModuleType("torch")
torch.cuda = mem
torch.OutOfMemoryError = ft.OutOfMemoryError
sys.modules.update({{"torch": torch, "torch.cuda": mem, "torch.cuda.memory": mem}})
def empty(mib):
    return mem.empty(mib * MiB)"""
PROGRAM = f"""\
x = empty({FIRST})
del x
y = empty({KEPT})"""
OOM = f"z = empty({AGAIN})"
REPORT = """\
from jupyter_gpumem.notebook.extension import get_extension
import jupyter_gpumem as gm
panel = get_extension().last_oom
snap = torch.cuda.memory._snapshot()
trace = snap["device_traces"][torch.cuda.current_device()]
recorded_oom = [i for i, e in enumerate(trace) if e["action"] == "oom"]
own = gm.replay(snap)
print("REPORT", json.dumps({
    "error": type(panel).__name__, "panel_source": getattr(panel, "source", None),
    "advice": list(getattr(panel, "advice", [])),
    "best": found.best.config.as_text() if found.best is not None else None,
    "improves": found.improves, "recorded_oom": recorded_oom,
    "own_first_oom": own.first_oom, "own_ooms": own.num_ooms,
    "capacity": own.capacity - own.outside,
    "notes": list(own.notes)}))"""
CLEANUP_GPU = "del y\ncupy.cuda.runtime.free(outside)"

#: The same program in a fresh process under PYTORCH_CUDA_ALLOC_CONF, on a real GPU.
FRESH_GPU = f"""\
import torch, cupy
MiB = 1 << 20
dev = torch.device("cuda")
torch.empty(1, device=dev)
free, total = torch.cuda.mem_get_info()
outside = cupy.cuda.runtime.malloc(free - {ROOM})
def empty(mib):
    return torch.empty(mib * MiB, dtype=torch.uint8, device=dev)
x = empty({FIRST})
del x
y = empty({KEPT})
try:
    z = empty({AGAIN})
except torch.OutOfMemoryError:
    print("RESULT oom", torch.cuda.memory_reserved())
else:
    print("RESULT fits", torch.cuda.memory_reserved())
"""


def build(dry: bool) -> Any:
    import nbformat

    cells = ["%load_ext jupyter_gpumem" + ("\n%gpumem device sim" if dry else ""),
             DRY_SETUP if dry else GPU_SETUP,
             "%gpumem source torch\n%gpumem history on", PROGRAM, OOM,
             "%gpumem replay last --suggest -o found", REPORT]
    if not dry:
        cells.append(CLEANUP_GPU)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.cells[4].metadata["tags"] = ["raises-exception"]
    return nb


def fresh_run(config: str, dry: bool) -> tuple[str, int]:
    """``("fits" | "oom", reserved bytes)`` of the program under ``config`` in a fresh
    allocator: a new process on the GPU; a new fake one in the dry run."""
    if not dry:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=config)
        proc = subprocess.run([sys.executable, "-c", FRESH_GPU], env=env, capture_output=True,
                              text=True, timeout=300)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), "")
        if not line:
            raise RuntimeError(f"fresh run failed: {proc.stderr.strip()[-400:]}")
        _, verdict, reserved = line.split()
        return verdict, int(reserved)
    from jupyter_gpumem import (
        AllocatorConfig,
        CachingAllocator,
        OutOfMemoryError,
        SimulatedDevice,
    )

    device = SimulatedDevice(4 * ROOM)
    device.hold_for_process(4242, 3 * ROOM)
    allocator = CachingAllocator(device, AllocatorConfig.parse(config))
    x = allocator.malloc(FIRST * MiB)
    allocator.free(x)
    y = allocator.malloc(KEPT * MiB)
    try:
        z = allocator.malloc(AGAIN * MiB)
    except OutOfMemoryError:
        verdict = "oom"
    else:
        verdict = "fits"
        allocator.free(z)
    reserved = allocator.memory_reserved()
    allocator.free(y)
    return verdict, reserved


def fraction_check(dry: bool) -> list[tuple[bool, str]]:
    """The same program under ``set_per_process_memory_fraction`` (ROOM of the device), in
    this process: PyTorch's snapshot does not say the fraction, the torch source reads it with
    the trace, and the replay under the recorded config meets the error where it was
    recorded; the suggestion fits."""
    import jupyter_gpumem as gm
    from jupyter_gpumem.sources.torch import TorchSource

    if dry:
        sys.path.insert(0, str(ROOT / "tests"))
        import fake_torch

        mem: Any = fake_torch.FakeTorchMemory(capacity=4 * ROOM)
        source = TorchSource(mem)
        oom_type: Any = fake_torch.OutOfMemoryError

        def empty(mib: int) -> Any:
            return mem.empty(mib * MiB)
    else:
        import torch

        mem = torch.cuda.memory
        source = TorchSource()
        oom_type = torch.OutOfMemoryError

        def empty(mib: int) -> Any:
            return torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")

    total = mem.mem_get_info()[1]
    mem.set_per_process_memory_fraction(ROOM / total)
    mem._record_memory_history(enabled="all", max_entries=10_000)
    failed = False
    try:
        x = empty(FIRST)
        del x
        y = empty(KEPT)
        try:
            empty(AGAIN)
        except oom_type:
            failed = True
        snap = source.snapshot()
        del y
    finally:
        mem._record_memory_history(enabled=None)
        mem.set_per_process_memory_fraction(1.0)
        mem.empty_cache()
    trace = snap["device_traces"][source.device_index]
    recorded = [i for i, e in enumerate(trace) if e["action"] == "oom"]
    own = gm.replay(snap)
    found = gm.suggest_config(snap)
    fraction = own.config.per_process_memory_fraction or 0.0
    return [
        (failed, f"under a fraction of {ROOM / total:.4f}, the program ran out of memory"),
        (abs(fraction - ROOM / total) < 1e-9,
         f"the replay's recorded config carries PyTorch's fraction: {own.config.as_text()}"),
        (own.num_ooms >= 1 and recorded[:1] == [own.first_oom],
         f"replayed under it, the error is met at the recorded event: {own.first_oom}, "
         f"recorded at {recorded}"),
        (found.improves and found.best is not None,
         f"a config that fits under the same fraction: {found.change_text or None}"),
    ]


def report_of(nb: Any) -> dict[str, Any]:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if line.startswith("REPORT "):
                    parsed: dict[str, Any] = json.loads(line[len("REPORT "):])
                    return parsed
    raise ValueError("the notebook printed no REPORT line")


def check(nb: Any, dry: bool) -> list[tuple[bool, str]]:
    results: list[tuple[bool, str]] = []
    errors = [(i, o.get("ename")) for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    results.append((errors == [(4, "OutOfMemoryError")],
                    f"only the OOM cell raised, torch's OutOfMemoryError: {errors}"))
    try:
        r = report_of(nb)
    except ValueError as exc:
        return [*results, (False, str(exc))]
    offer = [a for a in r["advice"] if a.startswith("replaying this trace")]
    results.append((r["panel_source"] == "torch" and len(offer) == 1
                    and "PYTORCH_CUDA_ALLOC_CONF" in offer[0],
                    f"the OOM panel (source {r['panel_source']}) offers a config PyTorch can "
                    f"use: {offer}"))
    results.append((r["best"] is not None and r["improves"],
                    f"replay --suggest found a config that fits: {r['best']}"))
    results.append((r["own_ooms"] >= 1 and r["recorded_oom"][:1] == [r["own_first_oom"]],
                    f"the recorded config meets the error at the recorded event: replayed "
                    f"first OOM at {r['own_first_oom']}, recorded at {r['recorded_oom']}"))
    room = r["capacity"]
    results.append((abs(room - ROOM) <= 64 * MiB,
                    f"the replayed device is what PyTorch could use: {room / MiB:.0f} MiB "
                    f"(ROOM {ROOM / MiB:.0f} MiB); notes: {r['notes']}"))
    if r["best"] is not None:
        verdict, reserved = fresh_run(r["best"], dry)
        results.append((verdict == "fits", f"a fresh run under PYTORCH_CUDA_ALLOC_CONF="
                        f"{r['best']}: {verdict}, {reserved / MiB:.0f} MiB reserved"))
    verdict, reserved = fresh_run("", dry)
    results.append((verdict == "oom", f"a fresh run under the defaults: {verdict}, "
                    f"{reserved / MiB:.0f} MiB reserved"))
    return results


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    dry = "--dry-run" in argv
    if len(args) != 1:
        print(__doc__)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    import nbformat
    from nbclient import NotebookClient

    nb = build(dry)
    lines: list[str] = []
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
    except Exception as exc:  # a kernel that died or timed out: check what ran
        lines.append(f"FAIL notebook run: {type(exc).__name__}: {exc}")
    nbformat.write(nb, str(out / "torch_whatif.ipynb"))
    try:
        results = check(nb, dry)
    except Exception as exc:
        results = [(False, f"the checks raised {type(exc).__name__}: {exc}")]
    try:
        results += fraction_check(dry)
    except Exception as exc:
        results.append((False, f"the fraction check raised {type(exc).__name__}: {exc}"))
    lines += [("PASS " if ok else "FAIL ") + text for ok, text in results]
    failed = sum(not ok for ok, _ in results) + sum(ln.startswith("FAIL") for ln in lines[:1])
    lines.append(f"{len(results) - failed} passed, {failed} failed"
                 + (" (dry run)" if dry else ""))
    print("\n".join(lines), flush=True)
    (out / "torch_whatif.report.txt").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
