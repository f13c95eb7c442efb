"""One cache for CuPy and PyTorch on a GPU (issue 25), in one run: µs per cached
``torch.empty(1 << 20, device="cuda")`` + ``del`` through our cache against PyTorch's own
allocator (target: at most 1.0×), ``cupy.empty`` through ours and through CuPy's MemoryPool for
reference, the c10 shim's compile time, and the mixed workload's peak reserved bytes with two
caches and with one. Each measurement runs in a child of its own (``tests/gpu/
torch_share_child.py``): PyTorch's allocator is chosen once a process.

    python3 bench/bench_torch_share.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "tests" / "gpu" / "torch_share_child.py"
GiB = 1 << 30


def child(*args: str, env: dict[str, str] | None = None, timeout: int = 240) -> Any:
    """The RESULT of ``torch_share_child.py ARGS``; RuntimeError with its stderr if none."""
    done = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT), check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: "
                           f"{done.stderr.strip()[-1500:]}")
    return json.loads(lines[-1][len("RESULT "):])


def report(results: dict[str, Any]) -> str:
    """The lines the bench prints, from its results."""
    ours, native, cupy = (results["empty"][k] for k in ("ours", "native", "cupy"))
    ratio = ours["torch_empty_us"] / native["torch_empty_us"]
    shim = results["shim"]
    lines = [
        f"cached torch.empty(1 << 20) + del: ours {ours['torch_empty_us']:.3f} µs, PyTorch's own "
        f"{native['torch_empty_us']:.3f} µs: {ratio:.2f}x (target <= 1.0x)",
        f"cached cupy.empty(4 MiB) + del: ours {ours['cupy_empty_us']:.3f} µs (shared with "
        f"PyTorch), ours {native['cupy_empty_us']:.3f} µs (CuPy alone), CuPy's MemoryPool "
        f"{cupy['cupy_empty_us']:.3f} µs",
        f"c10 shim for PyTorch {shim['torch']}: {shim['kind']}, {shim['origin']}, compiled in "
        f"{shim['compile_seconds'] or 0:.2f} s ({shim['seconds']:.2f} s with loading)"
        + (f"; {shim['reasons']}" if shim["reasons"] else ""),
    ]
    for label, key in (("two caches (PyTorch's + ours under CuPy)", "two"),
                       ("one shared cache", "one")):
        r = results["mixed"][key]
        peaks = ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in r["peak_reserved"].items())
        outcome = (f"out of memory at {r['oom_at']}" if r["oom_at"] else
                   f"fits ({r['iterations']} iterations)")
        lines.append(f"mixed workload, {label}, budget {r['budget'] / GiB:.1f} GiB: {outcome}; "
                     f"peak reserved {peaks}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args(argv)
    env = {**os.environ, "JUPYTER_GPUMEM_CACHE_DIR": tempfile.mkdtemp(),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    started = time.perf_counter()
    results: dict[str, Any] = {"shim": child("shim", env=env), "empty": {}, "mixed": {}}
    for allocator in ("ours", "native", "cupy"):
        results["empty"][allocator] = child("empty-bench", allocator, env=env)
    results["mixed"]["two"] = child("mixed", "native", env=env)
    results["mixed"]["one"] = child("mixed", "ours", env=env)
    print(report(results))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
