"""Expandable segments: what they save on fragmentation-heavy programs, and what they cost.

One run, five columns: CuPy's own MemoryPool, ours (default policy), ours with
``expandable_segments:True``, PyTorch (default), PyTorch with ``expandable_segments:True``
(PyTorch runs in two child processes, since it reads PYTORCH_CUDA_ALLOC_CONF once).

Programs, each a fixed list of allocs and frees through the allocator's raw API:

(a) a growing buffer: re-allocated a little larger every step, the old one freed once the new
    one exists, and after each step a mid-size tensor that lives for a few steps. Under the
    default policy each freed buffer's segment gets one of those tensors, so the segment can
    neither hold the next (larger) buffer nor go back to the device: under the capacity limit
    CAP_A the default policy runs out of memory (the dry run checks this on the simulated
    device). Expandable segments map only the pages in use, and give back the free pages.
(b) many mid-size blocks, every other one freed, then one large request (reported as it is).

Rows: peak reserved with no limit, then under the limit (a memory fraction for ours and
PyTorch, ``MemoryPool.set_limit`` for CuPy): out of memory or not, and the peak reserved; wall
time of the program. The issue's targets: on (a), ours-expandable peak reserved <= 0.8x
ours-default, and the run that OOMs under the default policy fits.

Cost: cached malloc+free of one size in a steady state (raw API, rounds taking turns, median),
ours-expandable against ours-default (target <= 1.1x), CuPy's pool and PyTorch; and growth by
mapping, timed on the device alone: µs per page mapped (one page a call, and many in one call)
and unmapped.

    python bench/bench_expandable.py [--quick] [--out PATH.json]
    python bench/bench_expandable.py --dry-run [--out PATH.json]   # simulated device only

Until the engine has the ``expandable_segments`` key, that column is skipped with a message.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
EXPANDABLE = "expandable_segments:True"
COLUMNS = ["cupy_pool", "ours_default", "ours_expandable", "torch_default", "torch_expandable"]
TITLES = {"cupy_pool": "CuPy MemoryPool", "ours_default": "ours default",
          "ours_expandable": "ours expandable", "torch_default": "PyTorch default",
          "torch_expandable": "PyTorch expandable"}

# (a): buffers of 384 MiB growing 4 MiB a step; tensors of 240 MiB living 6 steps. The tensors
# are more than half a buffer, so each lands alone in the segment of the buffer just freed. Live
# bytes peak at 2,388 MiB; the default policy needs 3,696 MiB (checked on the simulated device),
# expandable segments about live + 2 partial 20 MiB pages per free hole (~2,700 MiB).
A_STEPS, A_BASE, A_GROW, A_PIN, A_WINDOW = 24, 384 * MiB, 4 * MiB, 240 * MiB, 6
CAP_A = 3200 * MiB
# (b): 200 blocks of 8 MiB, every other one freed, then 600 MiB
B_BLOCKS, B_BLOCK, B_LARGE = 200, 8 * MiB, 600 * MiB
CAP_B = 2400 * MiB
COST_SIZES = [("4 KiB", 4 * KiB), ("16 MiB", 16 * MiB)]

Op = tuple[str, int, int]  # ("alloc", slot, size) or ("free", slot, 0)


# -- the programs ----------------------------------------------------------------------------

def program_growing() -> list[Op]:
    """(a): a buffer re-allocated larger each step, old freed after; mid-size tensors live."""
    ops: list[Op] = []
    slot = 0
    buffer: int | None = None
    pins: list[int] = []
    for step in range(A_STEPS):
        ops.append(("alloc", slot, A_BASE + step * A_GROW))
        if buffer is not None:
            ops.append(("free", buffer, 0))
        buffer, slot = slot, slot + 1
        ops.append(("alloc", slot, A_PIN))
        pins.append(slot)
        slot += 1
        if len(pins) > A_WINDOW:
            ops.append(("free", pins.pop(0), 0))
    return ops


def program_every_other() -> list[Op]:
    """(b): many mid-size blocks, every other one freed, then one large request."""
    ops: list[Op] = [("alloc", i, B_BLOCK) for i in range(B_BLOCKS)]
    ops += [("free", i, 0) for i in range(0, B_BLOCKS, 2)]
    ops.append(("alloc", B_BLOCKS, B_LARGE))
    return ops


PROGRAMS: dict[str, tuple[str, Callable[[], list[Op]], int]] = {
    "a": ("(a) growing buffer + live mid-size tensors", program_growing, CAP_A),
    "b": ("(b) mid-size blocks, every other freed, one large", program_every_other, CAP_B),
}


# -- backends: one allocator behind alloc/free/peak/cap --------------------------------------

class Backend:
    """An allocator driven through its raw API; ``oom`` is what it raises when out of memory."""

    oom: tuple[type[BaseException], ...] = (MemoryError,)

    def alloc(self, size: int) -> Any:
        raise NotImplementedError

    def free(self, handle: Any) -> None:
        raise NotImplementedError

    def peak_reserved(self) -> int:
        raise NotImplementedError

    def set_cap(self, cap: int | None) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Give back every cached byte and reset the peak."""
        raise NotImplementedError

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, self.oom)


class Ours(Backend):
    def __init__(self, allocator: CachingAllocator, stream: int = 0) -> None:
        self.a = allocator
        self.stream = stream
        self.total = allocator.device.mem_get_info()[1]

    def alloc(self, size: int) -> Any:
        return self.a.malloc(size, self.stream)

    def free(self, handle: Any) -> None:
        self.a.free(handle)

    def peak_reserved(self) -> int:
        return int(self.a.memory_stats()["reserved_bytes.all.peak"])

    def set_cap(self, cap: int | None) -> None:
        self.a.set_memory_fraction(None if cap is None else cap / self.total)

    def reset(self) -> None:
        self.a.empty_cache()
        self.a.reset_peak_memory_stats()


class CupyPool(Backend):
    def __init__(self, cp: Any) -> None:
        self.pool = cp.cuda.MemoryPool()
        self.oom = (cp.cuda.memory.OutOfMemoryError,)
        self.peak = 0

    def alloc(self, size: int) -> Any:
        mem = self.pool.malloc(size)
        self.peak = max(self.peak, self.pool.total_bytes())
        return mem

    def free(self, handle: Any) -> None:
        pass  # the last reference goes with the caller's: the block returns to the pool

    def peak_reserved(self) -> int:
        return self.peak

    def set_cap(self, cap: int | None) -> None:
        self.pool.set_limit(size=cap or 0)

    def reset(self) -> None:
        self.pool.free_all_blocks()
        self.peak = 0


class Torch(Backend):
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.total = torch.cuda.mem_get_info()[1]
        self.oom = (torch.OutOfMemoryError,)

    def alloc(self, size: int) -> Any:
        return self.torch.cuda.caching_allocator_alloc(size)

    def free(self, handle: Any) -> None:
        self.torch.cuda.caching_allocator_delete(handle)

    def peak_reserved(self) -> int:
        return int(self.torch.cuda.max_memory_reserved())

    def set_cap(self, cap: int | None) -> None:
        self.torch.cuda.set_per_process_memory_fraction(1.0 if cap is None else cap / self.total)

    def reset(self) -> None:
        self.torch.cuda.empty_cache()
        self.torch.cuda.reset_peak_memory_stats()

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, self.oom) or "out of memory" in str(exc).lower()


def run_program(backend: Backend, ops: list[Op], cap: int | None) -> dict[str, Any]:
    """Run ``ops`` until done or out of memory; everything is given back afterwards."""
    backend.reset()
    backend.set_cap(cap)
    live: dict[int, Any] = {}
    oom_at: int | None = None
    t0 = time.perf_counter()
    try:
        for i, (op, slot, size) in enumerate(ops):
            if op == "alloc":
                try:
                    live[slot] = backend.alloc(size)
                except Exception as exc:
                    if not backend.is_oom(exc):
                        raise
                    oom_at = i
                    break
            else:
                backend.free(live.pop(slot))
        wall = time.perf_counter() - t0
        peak = backend.peak_reserved()
    finally:
        for handle in live.values():
            backend.free(handle)
        live.clear()
        backend.set_cap(None)
        backend.reset()
    return {"oom": oom_at is not None, "oom_at_op": oom_at, "ops": len(ops),
            "peak_reserved": peak, "wall_ms": wall * 1e3}


def measure_programs(backend: Backend) -> dict[str, Any]:
    """Each program twice: no limit (peak reserved, wall time), then under its limit."""
    out: dict[str, Any] = {}
    for key, (_, make, cap) in PROGRAMS.items():
        ops = make()
        free_run = run_program(backend, ops, None)
        capped = run_program(backend, ops, cap)
        out[key] = {"peak_reserved": free_run["peak_reserved"], "oom_nocap": free_run["oom"],
                    "wall_ms": free_run["wall_ms"], "cap": cap, "oom": capped["oom"],
                    "oom_at_op": capped["oom_at_op"], "ops": capped["ops"],
                    "peak_reserved_capped": capped["peak_reserved"]}
    return out


def time_pairs(alloc: Callable[[int], Any], free: Callable[[Any], None], size: int,
               loops: int) -> float:
    """µs per cached alloc+free pair of one size, after one warm-up pair."""
    free(alloc(size))
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        free(alloc(size))
    return (time.perf_counter_ns() - t0) / loops / 1e3


def measure_cost(backends: dict[str, Backend], loops: int, rounds: int) -> dict[str, Any]:
    """Median µs per pair over ``rounds``; the backends take turns within each round."""
    out: dict[str, Any] = {}
    for label, size in COST_SIZES:
        samples: dict[str, list[float]] = {name: [] for name in backends}
        for _ in range(rounds):
            for name, b in backends.items():
                samples[name].append(time_pairs(b.alloc, b.free, size, loops))
        out[label] = {name: statistics.median(v) for name, v in samples.items()}
        for b in backends.values():
            b.reset()
    return out


def measure_growth(device: Any, pages: int) -> dict[str, Any]:
    """µs per page: mapped one page a call, mapped many in one call, unmapped; on the device."""
    gran = device.vmm_granularity()
    span = 2 * pages * gran
    ptr = device.reserve(span)
    try:
        t0 = time.perf_counter_ns()
        for i in range(pages):
            device.map(ptr + i * gran, gran)
        t1 = time.perf_counter_ns()
        device.map(ptr + pages * gran, pages * gran)
        t2 = time.perf_counter_ns()
        device.unmap(ptr, span)
        t3 = time.perf_counter_ns()
    except BaseException:
        for i in range(2 * pages):  # give back whatever a step that failed midway left mapped
            with suppress(Exception):
                device.unmap(ptr + i * gran, gran)
        with suppress(Exception):
            device.release(ptr, span)
        raise
    device.release(ptr, span)
    return {"granularity": gran, "pages": pages,
            "map_us_per_page_one_a_call": (t1 - t0) / pages / 1e3,
            "map_us_per_page_batched": (t2 - t1) / pages / 1e3,
            "unmap_us_per_page": (t3 - t2) / (2 * pages) / 1e3}


# -- configs ---------------------------------------------------------------------------------

def expandable_config() -> tuple[AllocatorConfig | None, str]:
    """``AllocatorConfig(expandable_segments=True)``, or None and why not."""
    try:
        config = AllocatorConfig(expandable_segments=True)  # type: ignore[call-arg]
    except TypeError as exc:
        return None, f"this engine has no expandable_segments key yet ({exc})"
    parsed = AllocatorConfig.parse(EXPANDABLE)
    if parsed != config:
        return None, f"AllocatorConfig.parse({EXPANDABLE!r}) gave {parsed}, not {config}"
    return config, ""


# -- PyTorch, in a child process per setting -------------------------------------------------

def torch_child(out_path: str, loops: int, rounds: int) -> int:
    """Run in a child with PYTORCH_CUDA_ALLOC_CONF set: programs and cost, as JSON."""
    result: dict[str, Any] = {"conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    try:
        import torch
    except ImportError as exc:
        result["skipped"] = f"PyTorch is not installed ({exc})"
        Path(out_path).write_text(json.dumps(result))
        return 0
    if not torch.cuda.is_available():
        result["skipped"] = "PyTorch sees no CUDA device"
        Path(out_path).write_text(json.dumps(result))
        return 0
    result["version"] = torch.__version__
    backend = Torch(torch)
    probe = backend.alloc(32 * MiB)
    result["expandable_seen"] = any(
        seg.get("is_expandable", False) for seg in torch.cuda.memory_snapshot())
    backend.free(probe)
    for name, fn in (("programs", lambda: measure_programs(backend)),
                     ("cost", lambda: measure_cost({"torch": backend}, loops, rounds))):
        try:
            result[name] = fn()
        except Exception:
            result[name + "_error"] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(result))
    return 0


def run_torch(conf: str, loops: int, rounds: int, quick: bool) -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"skipped": "PyTorch is not installed"}
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "torch.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-child", path,
               "--loops", str(loops), "--rounds", str(rounds)] + (["--quick"] if quick else [])
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
        except subprocess.TimeoutExpired:
            return {"skipped": "the PyTorch child ran past 150 s"}
        if proc.returncode != 0 or not os.path.exists(path):
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
            return {"skipped": f"the PyTorch child failed (exit {proc.returncode}): "
                               + " | ".join(tail)}
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return data


# -- the report ------------------------------------------------------------------------------

def _mib(n: Any) -> str:
    return f"{n / MiB:,.0f} MiB" if isinstance(n, (int, float)) else "-"


def report(result: dict[str, Any]) -> list[str]:
    """Markdown tables of ``result``, and the targets checked against it."""
    lines: list[str] = []
    cols = result["columns"]
    head = "| | " + " | ".join(TITLES[c] for c in COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    for key, (title, _, cap) in PROGRAMS.items():
        lines += ["", f"### {title}: {len(result['ops'][key])} ops, limit {_mib(cap)}", "",
                  head, rule]
        rows = [("peak reserved, no limit", "peak_reserved", _mib),
                ("OOM under the limit", "oom", lambda v: "OOM" if v else "fits"),
                ("peak reserved under the limit", "peak_reserved_capped", _mib),
                ("wall time, no limit", "wall_ms", lambda v: f"{v:.1f} ms")]
        for label, field, fmt in rows:
            cells = []
            for c in COLUMNS:
                prog = (cols[c].get("programs") or {}).get(key)
                cells.append(fmt(prog[field]) if prog and field in prog else "-")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "### cost: µs per cached malloc+free (raw API, median of rounds)", "",
              head, rule]
    for label, _ in COST_SIZES:
        cells = []
        for c in COLUMNS:
            cost = (cols[c].get("cost") or {}).get(label)
            value = None if cost is None else next(iter(cost.values()))
            cells.append("-" if value is None else f"{value:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    growth = result.get("growth")
    if growth and "map_us_per_page_one_a_call" in growth:
        lines += ["", f"growth by mapping on {result['device']} (page {_mib(growth['granularity'])}"
                  f", {growth['pages']} pages): {growth['map_us_per_page_one_a_call']:.1f} µs/page"
                  f" one page a call, {growth['map_us_per_page_batched']:.1f} µs/page in one call,"
                  f" unmap {growth['unmap_us_per_page']:.1f} µs/page"]
    elif growth:
        lines += ["", f"growth by mapping: {growth.get('skipped', growth)}"]
    skipped = [f"- {TITLES[c]}: {cols[c]['skipped']}" for c in COLUMNS if "skipped" in cols[c]]
    errors = [f"- {TITLES[c]} {k}: {v.strip().splitlines()[-1]}" for c in COLUMNS
              for k, v in cols[c].items() if k.endswith("_error")]
    if skipped or errors:
        lines += ["", "Not measured:", *skipped, *errors]
    lines += ["", "Targets:"] + [f"- {'PASS' if ok else 'FAIL'}: {text}"
                                 for ok, text in result["targets"]]
    return lines


def targets(result: dict[str, Any]) -> list[tuple[bool, str]]:
    cols = result["columns"]
    out: list[tuple[bool, str]] = []
    d = (cols["ours_default"].get("programs") or {}).get("a")
    e = (cols["ours_expandable"].get("programs") or {}).get("a")
    if d:
        out.append((d["oom"], f"(a) the default policy runs out of memory under {_mib(CAP_A)}"))
    if d and e:
        ratio = e["peak_reserved"] / d["peak_reserved"]
        out.append((ratio <= 0.8, f"(a) ours-expandable peak reserved / ours-default = "
                                  f"{ratio:.2f} (target <= 0.80)"))
        out.append((not e["oom"], f"(a) ours-expandable fits under {_mib(CAP_A)}"))
    for label, _ in COST_SIZES:
        dc = (cols["ours_default"].get("cost") or {}).get(label)
        ec = (cols["ours_expandable"].get("cost") or {}).get(label)
        if dc and ec:
            ratio = ec["ours_expandable"] / dc["ours_default"]
            out.append((ratio <= 1.1, f"cost {label}: ours-expandable / ours-default = "
                                      f"{ratio:.2f}x (target <= 1.10)"))
    return out


# -- main ------------------------------------------------------------------------------------

def _section(result: dict[str, Any], column: str, name: str, fn: Callable[[], Any]) -> None:
    """Run one measurement; a failure is printed and recorded, and the run goes on."""
    t0 = time.perf_counter()
    try:
        result["columns"][column][name] = fn()
        print(f"  {column} {name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    except Exception:
        text = traceback.format_exc()
        result["columns"][column][name + "_error"] = text
        print(f"  {column} {name}: FAILED\n{text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="ours only, on the simulated device (no CuPy, no PyTorch)")
    parser.add_argument("--quick", action="store_true", help="fewer cost loops")
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("--loops", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--torch-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # 100k pairs per column and size by default: 5 rounds of 20k
    loops = args.loops or (2_000 if args.quick or args.dry_run else 20_000)
    rounds = args.rounds or (3 if args.quick or args.dry_run else 5)
    if args.torch_child:
        return torch_child(args.torch_child, loops, rounds)

    exp_config, why_not = expandable_config()
    result: dict[str, Any] = {
        "dry_run": args.dry_run, "loops": loops, "rounds": rounds,
        "columns": {c: {} for c in COLUMNS},
        "ops": {k: make() for k, (_, make, _) in PROGRAMS.items()},
    }
    cols = result["columns"]
    ours: dict[str, Backend] = {}
    if args.dry_run:
        result["device"] = "simulated device (80 GiB)"

        def make_ours(config: AllocatorConfig) -> Ours:
            return Ours(CachingAllocator(SimulatedDevice(80 * GiB), config))

        cols["cupy_pool"]["skipped"] = "dry run: no CuPy"
        cols["torch_default"]["skipped"] = cols["torch_expandable"]["skipped"] = (
            "dry run: no PyTorch")
        cp: Any = None
    else:
        import cupy as cp

        from jupyter_gpumem.devices.cupy_device import CupyDevice, cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason is not None:
            print(f"bench_expandable: {reason}; --dry-run runs on the simulated device")
            return 1
        result["device"] = CupyDevice(0).name
        stream = int(cp.cuda.get_current_stream().ptr)

        def make_ours(config: AllocatorConfig) -> Ours:
            return Ours(CachingAllocator(CupyDevice(0), config), stream)

    print(f"bench_expandable on {result['device']}"
          + (" (dry run)" if args.dry_run else ""), flush=True)
    ours["ours_default"] = make_ours(AllocatorConfig())
    if exp_config is not None:
        try:
            ours["ours_expandable"] = make_ours(exp_config)
        except Exception:
            cols["ours_expandable"]["skipped"] = "FAILED to make: " + traceback.format_exc()
            print("  ours_expandable: " + cols["ours_expandable"]["skipped"], flush=True)
    else:
        cols["ours_expandable"]["skipped"] = why_not
        print(f"  ours_expandable: skipped: {why_not}", flush=True)
    backends: dict[str, Backend] = dict(ours)
    if cp is not None:
        try:
            backends["cupy_pool"] = CupyPool(cp)
        except Exception as exc:
            cols["cupy_pool"]["skipped"] = f"CuPy's MemoryPool failed: {exc}"

    for name, backend in backends.items():
        _section(result, name, "programs", lambda b=backend: measure_programs(b))  # type: ignore[misc]
    for name, backend in backends.items():
        _section(result, name, "cost",
                 lambda n=name, b=backend: measure_cost({n: b}, loops, rounds))  # type: ignore[misc]
    # ours against ours with both in turn, for the ratio the issue asks (drift hits both alike)
    if len(ours) == 2:
        _section(result, "ours_expandable", "cost_paired",
                 lambda: measure_cost(ours, loops, rounds))
        paired = cols["ours_expandable"].get("cost_paired")
        if paired:
            for label, row in paired.items():
                for name in ours:
                    cols[name].setdefault("cost", {})[label] = {name: row[name]}

    if "ours_expandable" in ours:
        device = ours["ours_expandable"].a.device
        if all(hasattr(device, m) for m in ("vmm_granularity", "reserve", "map", "unmap")):
            try:
                result["growth"] = measure_growth(device, 16 if args.dry_run else 64)
            except Exception:
                result["growth"] = {"skipped": "FAILED: " + traceback.format_exc()}
                print(result["growth"]["skipped"], flush=True)
        else:
            result["growth"] = {"skipped": f"{type(device).__name__} has no map/unmap yet"}
    else:
        result["growth"] = {"skipped": "no expandable column"}

    if not args.dry_run:
        for column, conf in (("torch_default", ""), ("torch_expandable", EXPANDABLE)):
            t0 = time.perf_counter()
            data = run_torch(conf, loops, rounds, args.quick)
            cols[column].update(data)
            print(f"  {column}: {'skipped: ' + data['skipped'] if 'skipped' in data else 'done'}"
                  f" in {time.perf_counter() - t0:.1f} s", flush=True)
            if column == "torch_expandable" and data.get("expandable_seen") is False:
                cols[column]["note"] = "PyTorch made no expandable segment: setting not applied?"
                print("  WARNING: " + cols[column]["note"], flush=True)

    result["targets"] = targets(result)
    lines = report(result)
    print("\n".join(lines), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({k: v for k, v in result.items() if k != "ops"},
                                             indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
