"""One run on a GPU that answers what sharing our cache with PyTorch needs to know (issue 25).

PyTorch allocates through our C entry points (csrc/torch.c) handed to
``torch._C._cuda_customAllocator``; CuPy through our usual hooks; one core per device. Items,
each on its own (one failing does not stop the others), each with lines
``PROBE <item> OK|FAIL <detail>``:

(a) install: our entry points as PyTorch's allocator, before its first CUDA allocation;
(b) one cache: torch.empty/del moves our books; CuPy reuses a block PyTorch freed, and back;
(c) threads: which thread, with or without the GIL, calls alloc/free in a forward op, in
    backward() (autograd's device threads), with a DataLoader(pin_memory=True), on a side stream
    (which stream handle arrives);
(d) PyTorch's memory functions under the pluggable allocator, and the torch._C names behind them;
(e) cost: µs per cached torch.empty(1 << 20, device="cuda") + del, ours against PyTorch's own
    allocator (each in a child process: the allocator cannot change after first use), and the
    entry points timed from C;
(f) a tiny training loop's losses, ours against PyTorch's (two children): bit-identical?
(g) interpreter exit with tensors and CuPy arrays alive: no crash;
(h) what PyTorch does with a NULL from alloc (out of memory); (i) CUDA graph capture.

    python3 -m jupyter_gpumem.engine._build_native && python3 bench/torch_share_probe.py --out DIR
    python3 bench/torch_share_probe.py --self-test   # no GPU: the entry points, simulated device

Exit status: 0 all OK, 1 some item failed, 2 it cannot run here (no PyTorch, no CUDA, no C core).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import inspect
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
OPS = {0: "alloc", 1: "free"}
PATHS = {0: "cached", 1: "slow", 2: "unknown", 3: "refused"}
CHILD_TIMEOUT = 90


class Probe:
    """Prints ``PROBE`` lines and notes, and keeps them for the log file."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = 0

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def result(self, item: str, ok: bool, detail: str = "") -> None:
        self.failed += not ok
        self.say(f"PROBE {item} {'OK' if ok else 'FAIL'} {detail}".rstrip())

    def note(self, text: str) -> None:
        for line in text.splitlines():
            self.say(f"    {line}")

    @contextlib.contextmanager
    def item(self, name: str) -> Iterator[None]:
        """Run an item's body; an exception becomes its FAIL line."""
        try:
            yield
        except Exception as exc:  # a probe reports every failure and goes on
            self.result(name, False, f"{type(exc).__name__}: {_first_line(exc)}")
            self.note(traceback.format_exc(limit=4))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


# -- the entry points, and who calls them ------------------------------------------------------


def native() -> Any:
    from jupyter_gpumem.engine import _native

    return _native


def thread_label(ident: int, native_id: int, names: dict[int, str]) -> str:
    """A caller's thread as a person reads it: the Python thread's name, else the kernel's."""
    if ident in names:
        return names[ident]
    try:
        comm = Path(f"/proc/self/task/{native_id}/comm").read_text().strip()
    except OSError:
        comm = "?"
    return f"C++ thread {comm!r} (tid {native_id})"


def summarize_calls(rows: list[tuple[int, ...]], streams: dict[int, str] | None = None
                    ) -> list[str]:
    """Calls grouped by (op, path, GIL, thread, stream), with counts, most frequent first."""
    names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
    names[threading.main_thread().ident or 0] = "MainThread"
    groups: Counter[tuple[str, str, str, str, str]] = Counter()
    for op, path, gil, ident, native_id, _device, stream, _size, _ptr in rows:
        stream_name = (streams or {}).get(stream, hex(stream))
        groups[(OPS[op], PATHS[path], "GIL held" if gil else "no GIL",
                thread_label(ident, native_id, names), f"stream {stream_name}")] += 1
    return [f"{n:5d} x {' | '.join(key)}" for key, n in groups.most_common()]


@contextlib.contextmanager
def logged_calls(out: list[tuple[int, ...]], limit: int = 8192) -> Iterator[None]:
    """Log the entry points' calls made inside the block into ``out``."""
    n = native()
    n.torch_log(limit)
    try:
        yield
    finally:
        rows, _seen = n.torch_log_read()
        n.torch_log(0)
        out.extend(rows)


def entry_cost_us(size: int, device: int, pairs: int = 200_000, release: bool = True) -> float:
    """µs per alloc+free pair through the entry points, timed in a C loop (a warm cache)."""
    n = native()
    n.torch_time_pairs(size, device, 1000, 0, release)
    return float(n.torch_time_pairs(size, device, pairs, 0, release)) / pairs / 1000


# -- installing ours (the probe's own few lines; the package's install_torch comes later) ------


def install_ours(torch: Any) -> Any:
    """CuPy and PyTorch on our allocator of device 0 (one core per device); the allocator."""
    from jupyter_gpumem.runtime import binding, registry

    n = native()
    binding.install()
    n.torch_set_missing(lambda device: registry.cuda_allocator(device).native_core)
    allocator = registry.cuda_allocator(0)
    n.torch_bind(0, allocator.native_core)
    alloc, free = n.torch_entry_points()
    raw = torch._C._cuda_customAllocator(alloc, free)
    torch._C._cuda_changeCurrentAllocator(raw)
    return allocator


def preflight(probe: Probe) -> Any:
    """torch if this machine can run the probe, else None (with the reason printed)."""
    from jupyter_gpumem.engine.allocator import native_core_available

    compilers = {name: shutil.which(name) is not None for name in ("cc", "g++", "c++")}
    probe.note(f"python {sys.version.split()[0]}; compilers on PATH: {compilers}")
    if not native_core_available():
        probe.result("preflight", False, "the C core is not built: run "
                     "python3 -m jupyter_gpumem.engine._build_native first")
        return None
    try:
        import torch
    except ImportError as exc:
        probe.result("preflight", False,
                     f"PyTorch is not importable here ({exc}): nothing to probe")
        return None
    if not torch.cuda.is_available():
        probe.result("preflight", False, f"torch {torch.__version__} sees no CUDA device")
        return None
    import cupy

    # not torch.cuda.get_device_name: it initializes PyTorch's allocator, which then cannot change
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    probe.result("preflight", True, f"torch {torch.__version__} (CUDA {torch.version.cuda}), cupy "
                 f"{cupy.__version__}, {name}")
    return torch


# -- the items ---------------------------------------------------------------------------------


def item_a(probe: Probe, torch: Any) -> Any:
    with probe.item("a.install"):
        allocator = install_ours(torch)
        backend = getattr(torch.cuda.memory, "get_allocator_backend", lambda: "?")()
        t = torch.ones(16, device="cuda")
        ok = bool(t.sum().item() == 16) and allocator.owns(t.data_ptr())
        probe.result("a.install", ok, f"first tensor at {t.data_ptr():#x} is ours: "
                     f"{allocator.owns(t.data_ptr())}; get_allocator_backend() = {backend!r}")
        del t
        return allocator
    return None


def item_b(probe: Probe, torch: Any, allocator: Any) -> None:
    import cupy

    with probe.item("b.books"):
        before = allocator.memory_stats()
        rows: list[tuple[int, ...]] = []
        with logged_calls(rows):
            t = torch.empty(1 << 20, device="cuda")  # 4 MiB of float32
            during = allocator.memory_allocated()
            ptr = t.data_ptr()
            del t
        after = allocator.memory_stats()
        moved = during - before["allocated_bytes.all.current"]
        ok = moved == 4 * MiB and after["allocation.all.allocated"] > before[
            "allocation.all.allocated"]
        probe.result("b.books", ok, f"torch.empty(1<<20) moved our allocated bytes by {moved} B "
                     f"(block {ptr:#x}); allocations counted {before['allocation.all.allocated']}"
                     f" -> {after['allocation.all.allocated']}")
        probe.note("\n".join(summarize_calls(rows)))
    with probe.item("b.torch_to_cupy"):
        t = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        ptr = t.data_ptr()
        del t
        x = cupy.empty(4 * MiB, dtype=cupy.uint8)
        reused = x.data.ptr == ptr
        del x
        t = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        back = t.data_ptr() == ptr
        del t
        probe.result("b.torch_to_cupy", reused and back,
                     f"CuPy got the block PyTorch freed: {reused}; PyTorch got it back: {back}")
    with probe.item("b.empty_tensor"):
        rows = []
        with logged_calls(rows):
            z = torch.empty(0, device="cuda")
            zp = z.data_ptr()
            del z
        probe.result("b.empty_tensor", True, f"torch.empty(0): data_ptr {zp:#x}; calls "
                     f"{[(OPS[r[0]], r[7]) for r in rows]}")


def item_c(probe: Probe, torch: Any) -> None:
    import torch.utils.data

    with probe.item("c.forward"):
        w = torch.randn(1024, 1024, device="cuda")
        rows: list[tuple[int, ...]] = []
        with logged_calls(rows):
            y = (w @ w).relu()
            del y
        gil = {r[2] for r in rows}
        probe.result("c.forward", bool(rows), f"{len(rows)} calls, GIL held: {sorted(gil)}")
        probe.note("\n".join(summarize_calls(rows)))
    with probe.item("c.backward"):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 10)).cuda()
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).square().mean()
        rows = []
        with logged_calls(rows):
            loss.backward()
            torch.cuda.synchronize()
        main = threading.main_thread().ident
        off_main = [r for r in rows if r[3] != main]
        probe.result("c.backward", bool(rows), f"{len(rows)} calls, {len(off_main)} from other "
                     f"threads, of which without the GIL: {sum(1 for r in off_main if not r[2])}")
        probe.note("\n".join(summarize_calls(rows)))
    with probe.item("c.pin_memory"):
        data = torch.utils.data.TensorDataset(torch.randn(1024, 256))
        loader = torch.utils.data.DataLoader(data, batch_size=128, num_workers=2,
                                             pin_memory=True)
        rows = []
        total = torch.zeros((), device="cuda")
        batches = iter(loader)  # not run to its end: its pin thread lives on to be named below
        with logged_calls(rows):
            for _ in range(6):
                (batch,) = next(batches)
                pinned = batch.is_pinned()
                total += batch.cuda(non_blocking=True).sum()
            torch.cuda.synchronize()
        pin_threads = [r for r in rows if r[3] != threading.main_thread().ident]
        probe.result("c.pin_memory", True, f"batches pinned: {pinned}; {len(rows)} device calls, "
                     f"{len(pin_threads)} from threads other than the main one (pinned host "
                     "memory comes from PyTorch's host allocator, not ours)")
        probe.note("\n".join(summarize_calls(rows)))
        del batches
    with probe.item("c.side_stream"):
        import cupy

        side = torch.cuda.Stream()
        rows = []
        with logged_calls(rows):
            with torch.cuda.stream(side):
                t = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
                ptr = t.data_ptr()
                del t
            with cupy.cuda.ExternalStream(side.cuda_stream):
                x = cupy.empty(4 * MiB, dtype=cupy.uint8)
                reused = x.data.ptr == ptr
                del x
        arrived = {r[6] for r in rows}
        probe.result("c.side_stream", side.cuda_stream in arrived and reused,
                     f"side stream handle {side.cuda_stream:#x}; handles that arrived "
                     f"{sorted(hex(s) for s in arrived)}; default stream handle "
                     f"{torch.cuda.default_stream().cuda_stream:#x}; CuPy on the same stream "
                     f"reused PyTorch's block: {reused}")
        probe.note("\n".join(summarize_calls(rows, {side.cuda_stream: "side"})))


def torch_c_names(fn: Callable[..., Any], depth: int = 3) -> list[str]:
    """The ``torch._C._cuda_*`` functions behind a torch.cuda function: those its source calls,
    else those of the functions of its module it calls, and so on, ``depth`` levels down."""
    level, seen = [fn], set()
    for _ in range(depth + 1):
        names: set[str] = set()
        callees: list[Any] = []
        for f in level:
            seen.add(f)
            try:
                source = inspect.getsource(f)
            except (OSError, TypeError):
                continue
            names.update(re.findall(r"\b_C\.(_cuda_\w+)", source))
            module = sys.modules.get(getattr(f, "__module__", ""))
            for callee in sorted(set(re.findall(r"\b([A-Za-z_]\w*)\(", source))):
                g = getattr(module, callee, None)
                if inspect.isfunction(g) and g not in seen:
                    callees.append(g)
        if names:
            return sorted(names)
        level = callees
    return []


def item_d(probe: Probe, torch: Any, allocator: Any) -> None:
    mem = torch.cuda.memory
    dump = os.path.join(tempfile.mkdtemp(), "snapshot.pickle")
    side = torch.cuda.Stream()
    held = [torch.empty(MiB, device="cuda")]

    def empty_cache() -> str:
        reserved = allocator.memory_reserved()
        torch.cuda.empty_cache()
        return f"our reserved {reserved} -> {allocator.memory_reserved()} B"

    def raw_alloc() -> str:
        rows: list[tuple[int, ...]] = []
        with logged_calls(rows):
            p = torch.cuda.caching_allocator_alloc(MiB)
            torch.cuda.caching_allocator_delete(p)
        return f"{len(rows)} calls through ours"

    def cudnn_benchmark() -> str:
        old = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            conv = torch.nn.Conv2d(3, 8, 3).cuda()
            return f"output {tuple(conv(torch.randn(2, 3, 32, 32, device='cuda')).shape)}"
        finally:
            torch.backends.cudnn.benchmark = old

    calls: list[tuple[str, Callable[[], Any], Callable[..., Any] | None]] = [
        ("memory_stats", lambda: f"{len(torch.cuda.memory_stats())} keys", torch.cuda.memory_stats),
        ("memory_allocated", torch.cuda.memory_allocated, torch.cuda.memory_allocated),
        ("memory_reserved", torch.cuda.memory_reserved, torch.cuda.memory_reserved),
        ("max_memory_allocated", torch.cuda.max_memory_allocated, torch.cuda.max_memory_allocated),
        ("max_memory_reserved", torch.cuda.max_memory_reserved, torch.cuda.max_memory_reserved),
        ("reset_peak_memory_stats", torch.cuda.reset_peak_memory_stats,
         torch.cuda.reset_peak_memory_stats),
        ("reset_accumulated_memory_stats", torch.cuda.reset_accumulated_memory_stats,
         torch.cuda.reset_accumulated_memory_stats),
        ("memory_summary", lambda: f"{len(torch.cuda.memory_summary())} chars",
         torch.cuda.memory_summary),
        ("memory._snapshot", lambda: f"{len(mem._snapshot()['segments'])} segments", mem._snapshot),
        ("memory._record_memory_history", lambda: mem._record_memory_history(max_entries=1000),
         mem._record_memory_history),
        ("memory._record_memory_history(None)", lambda: mem._record_memory_history(enabled=None),
         None),
        ("memory._dump_snapshot", lambda: mem._dump_snapshot(dump), mem._dump_snapshot),
        ("empty_cache", empty_cache, torch.cuda.empty_cache),
        ("mem_get_info", torch.cuda.mem_get_info, torch.cuda.mem_get_info),
        ("set_per_process_memory_fraction",
         lambda: torch.cuda.set_per_process_memory_fraction(0.99),
         torch.cuda.set_per_process_memory_fraction),
        ("get_per_process_memory_fraction",
         lambda: torch.cuda.get_per_process_memory_fraction(),
         getattr(torch.cuda, "get_per_process_memory_fraction", None)),
        ("caching_allocator_alloc/delete", raw_alloc, torch.cuda.caching_allocator_alloc),
        ("Tensor.record_stream", lambda: held[0].record_stream(side), None),
        ("cudnn.benchmark conv2d (cacheInfo)", cudnn_benchmark, None),
    ]
    for name, call, fn in calls:
        names = torch_c_names(fn) if fn is not None else []
        behind = f" [torch._C: {', '.join(names)}]" if names else ""
        try:
            value = call()
        except Exception as exc:  # what each raises is the answer
            probe.result(f"d.{name}", False, f"{type(exc).__name__}: {_first_line(exc)}{behind}")
        else:
            probe.result(f"d.{name}", True, f"{_short(value)}{behind}")
    held.clear()
    cuda_names = sorted(n for n in dir(torch._C) if n.startswith("_cuda_"))
    memoryish = [n for n in cuda_names
                 if re.search(r"emory|lloc|Stat|napshot|istory|Cache|Peak|Pool", n)]
    probe.result("d.names", True, f"{len(cuda_names)} torch._C._cuda_* names; memory ones: "
                 f"{', '.join(memoryish)}")
    probe.note("all: " + " ".join(cuda_names))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# -- the children (subprocesses) ---------------------------------------------------------------


def run_child(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    script = os.path.abspath(__file__)
    proc = subprocess.run([sys.executable, script, "--child", *args], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT, env={**os.environ, **(env or {})},
                          check=False)
    return proc.returncode, proc.stdout, proc.stderr


def child_json(args: list[str], env: dict[str, str] | None = None) -> Any:
    """The last JSON line a child printed (it may have failed after printing it)."""
    rc, out, err = run_child(args, env)
    lines = [line for line in out.splitlines() if line.startswith("{") or line.startswith("[")]
    if not lines:
        raise RuntimeError(f"child {args} exited {rc}: {err.strip()[-600:]}")
    return json.loads(lines[-1])


def time_empty(torch: Any, runs: int = 7, n: int = 20_000) -> float:
    """Median µs per cached torch.empty(1 << 20, device="cuda") + del."""
    for _ in range(2000):
        t = torch.empty(1 << 20, device="cuda")
        del t
    per: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            t = torch.empty(1 << 20, device="cuda")
            del t
        per.append((time.perf_counter_ns() - t0) / n / 1000)
    return statistics.median(per)


def time_miss(torch: Any, allocator: Any, n: int = 200) -> float:
    """µs per torch.empty(64 MiB) + del + empty_cache: a segment from the device and back."""
    release = allocator.empty_cache if allocator is not None else torch.cuda.empty_cache
    t = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del t
    release()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        t = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del t
        release()
    return (time.perf_counter_ns() - t0) / n / 1000


def time_cupy_empty(runs: int = 7, n: int = 20_000) -> float:
    import cupy

    for _ in range(2000):
        x = cupy.empty(4 * MiB, dtype=cupy.uint8)
        del x
    per: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            x = cupy.empty(4 * MiB, dtype=cupy.uint8)
            del x
        per.append((time.perf_counter_ns() - t0) / n / 1000)
    return statistics.median(per)


def child_main(mode: str, allocator_kind: str) -> int:
    import torch

    allocator = install_ours(torch) if allocator_kind == "ours" else None
    if mode == "empty-bench":
        out: dict[str, Any] = {"torch_empty_us": time_empty(torch),
                               "miss_us": time_miss(torch, allocator)}
        if allocator is not None:
            out["cupy_empty_us"] = time_cupy_empty()
            out["entry_c_loop_us"] = entry_cost_us(1 << 22, 0)
            out["entry_c_loop_gil_us"] = entry_cost_us(1 << 22, 0, release=False)
        print(json.dumps(out))
    elif mode == "losses":
        sys.path.insert(0, str(ROOT / "tests" / "gpu"))
        from torch_share_child import train_losses  # the run the GPU tests compare, too

        print(json.dumps(train_losses(torch)))
    elif mode == "exit-alive":
        exit_with_live_memory(torch)
    elif mode == "null-alloc":
        print(json.dumps(null_alloc(torch)), flush=True)
        os._exit(0)  # the device may be in a sticky error state: how it exits is item (g)'s
    elif mode == "graph":
        print(json.dumps(graph_capture(torch)), flush=True)
        os._exit(0)
    return 0


def exit_with_live_memory(torch: Any) -> None:
    import atexit

    import cupy

    keep = {
        "tensor": torch.randn(4096, 4096, device="cuda"),
        "graph": torch.randn(64, 64, device="cuda", requires_grad=True).square().sum(),
        "array": cupy.ones(MiB, dtype=cupy.float32),
        "matmul": torch.randn(512, 512, device="cuda") @ torch.randn(512, 512, device="cuda"),
    }
    globals()["_kept_alive"] = keep
    atexit.register(lambda: print("counters at exit:", json.dumps(native().torch_counters()),
                                  flush=True))
    print("alive:", sorted(keep), flush=True)


def null_alloc(torch: Any) -> dict[str, Any]:
    """torch.empty far above the device: our alloc returns NULL; what does PyTorch do?"""
    out: dict[str, Any] = {}
    try:
        t = torch.empty(512 * GiB, dtype=torch.uint8, device="cuda")
    except Exception as exc:
        out["raised"] = f"{type(exc).__module__}.{type(exc).__name__}: {_first_line(exc)}"
        return out
    out["raised"] = None
    out["data_ptr"] = t.data_ptr()
    error = native().torch_take_error()
    out["kept_error"] = f"{type(error).__name__}: {_first_line(error)}" if error else None
    try:
        t[:16].fill_(1)
        torch.cuda.synchronize()
        out["write"] = "no error"
    except Exception as exc:
        out["write"] = f"{type(exc).__name__}: {_first_line(exc)}"
    return out


def graph_capture(torch: Any) -> dict[str, Any]:
    """A CUDA graph captured and replayed while PyTorch allocates through our entry points."""
    out: dict[str, Any] = {}
    x = torch.ones(MiB, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    rows: list[tuple[int, ...]] = []
    try:
        with logged_calls(rows), torch.cuda.graph(graph):
            y = x * 2
        graph.replay()
        torch.cuda.synchronize()
        out["replayed_sum_ok"] = bool(y.sum().item() == 2 * MiB)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    out["calls"] = summarize_calls(rows)
    return out


def item_e(probe: Probe) -> None:
    with probe.item("e.cost"):
        ours = child_json(["empty-bench", "ours"])
        theirs = child_json(["empty-bench", "native"])
        ratio = ours["torch_empty_us"] / theirs["torch_empty_us"]
        probe.result("e.cost", ratio <= 1.0, f"cached torch.empty(1<<20)+del: ours "
                     f"{ours['torch_empty_us']:.3f} µs, PyTorch's own "
                     f"{theirs['torch_empty_us']:.3f} µs, ratio {ratio:.2f}x (target <= 1.0x)")
        probe.note(f"a miss, torch.empty(64 MiB)+del+empty_cache (cudaMalloc and cudaFree): ours "
                   f"{ours['miss_us']:.1f} µs, PyTorch's own {theirs['miss_us']:.1f} µs")
        probe.note(f"cupy.empty(4 MiB)+del through ours: {ours['cupy_empty_us']:.3f} µs; entry "
                   f"points alone, alloc+free of 4 MiB from C: {ours['entry_c_loop_us']:.3f} µs "
                   f"without the GIL, {ours['entry_c_loop_gil_us']:.3f} µs holding it")


def item_f(probe: Probe) -> None:
    with probe.item("f.losses"):
        env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        ours = child_json(["losses", "ours"], env)
        theirs = child_json(["losses", "native"], env)
        same = ours == theirs
        pairs = enumerate(zip(ours, theirs, strict=False))
        first_diff = next((i for i, (a, b) in pairs if a != b), None)
        probe.result("f.losses", same, f"{len(ours)} steps bit-identical: {same}"
                     + ("" if same else f" (first difference at step {first_diff})")
                     + f"; last loss {float.fromhex(ours[-1]):.6f}")


def item_g(probe: Probe) -> None:
    with probe.item("g.exit"):
        rc, out, err = run_child(["exit-alive", "ours"])
        bad = re.search(r"Segmentation|Fatal Python|core dumped|Aborted|terminate called", err)
        probe.result("g.exit", rc == 0 and not bad, f"exit status {rc}; "
                     f"{out.strip().splitlines()[-1] if out.strip() else 'no output'}")
        if err.strip():
            probe.note("stderr: " + err.strip()[-800:])


def item_h(probe: Probe) -> None:
    with probe.item("h.null_alloc"):
        got = child_json(["null-alloc", "ours"])
        probe.result("h.null_alloc", True, json.dumps(got))


def item_i(probe: Probe) -> None:
    with probe.item("i.graph"):
        got = child_json(["graph", "ours"])
        probe.result("i.graph", "error" not in got and got.get("replayed_sum_ok", False),
                     json.dumps({k: v for k, v in got.items() if k != "calls"}))
        probe.note("\n".join(got.get("calls", [])))


# -- the self-test on a simulated device -------------------------------------------------------


def self_test(probe: Probe) -> None:
    """The entry points as PyTorch calls them, on a simulated device: what this probe relies on
    that runs without a GPU (the log, its summary, the C timing loop)."""
    from jupyter_gpumem import CachingAllocator, SimulatedDevice
    from jupyter_gpumem.engine.allocator import native_core_available

    if not native_core_available():
        probe.result("self-test", False, "the C core is not built")
        return
    n = native()
    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    n.torch_bind(0, allocator.native_core)
    alloc_addr, free_addr = n.torch_entry_points()
    sig = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    free_sig = (None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    nogil = ctypes.CFUNCTYPE(*sig)(alloc_addr), ctypes.CFUNCTYPE(*free_sig)(free_addr)
    gil = ctypes.PYFUNCTYPE(*sig)(alloc_addr), ctypes.PYFUNCTYPE(*free_sig)(free_addr)

    summarized = threading.Event()

    def pairs(fns: tuple[Any, Any], stream: int, wait: bool = False) -> None:
        for _ in range(3):
            p = fns[0](MiB, 0, stream or None)
            fns[1](p, MiB, 0, stream or None)
        if wait:  # alive until its calls are summarized, so it is named
            summarized.wait(10)

    try:
        with probe.item("self-test.calls"):
            rows: list[tuple[int, ...]] = []
            with logged_calls(rows):
                pairs(gil, 0)
                worker = threading.Thread(target=pairs, args=(nogil, 0x7000, True),
                                          name="worker")
                worker.start()
                while native().torch_log_read()[1] < 12 and worker.is_alive():
                    time.sleep(0.001)
            summary = summarize_calls(rows, {0x7000: "side"})
            summarized.set()
            worker.join()
            held = {r[2] for r in rows if r[3] == threading.get_ident()}
            released = {r[2] for r in rows if r[3] != threading.get_ident()}
            probe.result("self-test.calls", len(rows) == 12 and held == {1} and released == {0},
                         f"{len(rows)} calls logged")
            probe.note("\n".join(summary))
        with probe.item("self-test.cost"):
            us = entry_cost_us(MiB, 0, pairs=100_000)
            us_gil = entry_cost_us(MiB, 0, pairs=100_000, release=False)
            probe.result("self-test.cost", us > 0, f"entry points from C, alloc+free of 1 MiB: "
                         f"{us:.3f} µs without the GIL, {us_gil:.3f} µs holding it")
        with probe.item("self-test.books"):
            stats = allocator.memory_stats()
            ok = stats["allocation.all.current"] == 0 and stats["allocation.all.allocated"] > 0
            allocator.check_invariants()
            probe.result("self-test.books", ok, f"{stats['allocation.all.allocated']} allocations,"
                         f" {stats['num_device_alloc']} segments from the device, none left live")
    finally:
        n.torch_bind(0, None)


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="a folder for the log (torch_share_probe.log)")
    parser.add_argument("--self-test", action="store_true",
                        help="no GPU: the entry points on a simulated device")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "ALLOCATOR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(*args.child)
    probe = Probe()
    started = time.perf_counter()
    if args.self_test:
        self_test(probe)
        status = 1 if probe.failed else 0
    else:
        torch = preflight(probe)
        if torch is None:
            status = 2
        else:
            allocator = item_a(probe, torch)
            if allocator is not None:
                item_b(probe, torch, allocator)
                item_c(probe, torch)
                item_d(probe, torch, allocator)
            item_e(probe)
            item_f(probe)
            item_g(probe)
            item_h(probe)
            item_i(probe)
            if allocator is not None:
                probe.note(f"our counters: {native().torch_counters()}")
                probe.note(f"our books at the end: allocated {allocator.memory_allocated()} B, "
                           f"reserved {allocator.memory_reserved()} B")
            status = 1 if probe.failed else 0
    probe.say(f"PROBE done in {time.perf_counter() - started:.1f} s: {probe.failed} FAIL line(s)"
              f", exit status {status}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "torch_share_probe.log").write_text("\n".join(probe.lines) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
