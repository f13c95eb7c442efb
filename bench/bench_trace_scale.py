"""Ten million events (issue 22): each step of a long trace, here and in an older checkout.

    python bench/bench_trace_scale.py                                  # 10 M events, ours only
    python bench/bench_trace_scale.py --events 1000000 --baseline .baseline
    python bench/bench_trace_scale.py --only snapshot --repeat 3       # one step, best of 3
    mkdir .baseline && git archive REV jupyter_gpumem | tar -x -C .baseline   # an old checkout

A training-like loop records N events on a simulated 80 GiB device (history on, Python stacks
on, a ring of N events): a few lines allocate and free blocks of repeating sizes, over several
cells. Then each step is timed (wall clock, seconds): once, or with ``--repeat K`` K times,
reporting the best (the least) of the K of each figure (sizes do not change between runs):

- ``snapshot``: ``snapshot()`` with the whole trace (after an untimed snapshot of a small trace,
  so that the modules a first snapshot imports, numpy among them, are not counted: a notebook
  has them loaded);
- ``save`` / ``load``: our columnar file (``.gpumem``) where the checkout has it, else
  PyTorch's pickle, and the file's bytes per event;
- ``payload``: the notebook's view data (``render.view_payload.build_view``, from the snapshot:
  timeline, lives, level-of-detail series) and its size as the notebook stores it (JSON,
  columns in base64);
- ``window`` / ``layout``: what a kernel answers a zoomed view (``render.view_detail``, once
  the trace's detail is worked out): the slowest of windows of 100 %, 10 %, 1 % and 0.01 % of
  the trace in 2,000 columns (with the lives in it where they fit), and the slowest layout at
  the first, middle and last event; ``detail`` the one-off time to work the detail out;
- ``picture``: the static timeline (``render.plots.plot_timeline``) drawn to a PNG;
- ``replay``: the what-if replay, whole call (``jupyter_gpumem.replay`` under defaults);
- ``ring``: bytes per recorded event in the ring, with and without stacks, read from the
  core's own figure where it reports one (and the side lists' bytes per event beside it),
  else from ``tracemalloc`` (the C core allocates its ring with ``PyMem_Realloc``, which
  tracemalloc sees) over a run of 200,000 events.

``--baseline DIR`` runs the same steps with the package in DIR (in a subprocess, its C core
built there first) on ``--baseline-events`` events (default 1 M: the old code needs minutes
and gigabytes at 10 M) and prints, per step, ours, the baseline, and the baseline scaled
linearly to our N (said so in the table), with PASS/MISS against the issue's targets at 10 M.
``--json PATH`` writes every figure. ``--only STEP[,STEP]`` runs the chosen steps (the
table's names, or the groups ``files`` and ``answers``; the trace is recorded, and snapshotted
once, whatever is chosen); the others show "—".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

MiB = 1 << 20
#: The issue's targets at 10 M events: step -> (limit, unit).
TARGETS: dict[str, tuple[float, str]] = {
    "snapshot": (0.5, "s"), "save": (1.0, "s"), "load": (1.0, "s"), "file": (16.0, "B/event"),
    "payload": (0.3, "s"), "payload_size": (2.0, "MB"), "window": (0.1, "s"),
    "layout": (0.1, "s"), "picture": (1.0, "s"),
    "replay": (3.0, "s"), "ring": (32.0, "B/event"), "ring_nostacks": (32.0, "B/event"),
}


def _allocator(events: int, stacks: bool = True) -> Any:
    from jupyter_gpumem import CachingAllocator, SimulatedDevice

    a = CachingAllocator(SimulatedDevice(80 << 30))
    a.record_history(True, stacks=stacks, max_entries=events)
    return a


#: Request sizes of the loop, drawn with a fixed seed: activations of a few shapes, small
#: temporaries, gradients; the drawn order makes addresses and sizes vary as a real run's do.
_SIZES = [(1 << 20) * k for k in (1, 2, 4, 6, 8, 12, 16, 24)] + [512 * k for k in range(1, 40)]


def _draws(n: int) -> list[int]:
    import random

    rng = random.Random(22)
    return [rng.choice(_SIZES) for _ in range(n)]


def _step(a: Any, live: list[int], size: int, keep: bool) -> None:
    """A layer: a temporary freed at once, and a block that lives for a while."""
    tmp = a.malloc(1000)
    a.free(tmp)
    p = a.malloc(size)
    if keep:
        live.append(p)
        if len(live) > 64:
            a.free(live.pop(0))
    else:
        a.free(p)


def _optimizer(a: Any) -> None:
    grad = a.malloc(24 * MiB)
    a.free(grad)


def record(events: int, stacks: bool = True) -> Any:
    """An allocator whose ring holds ``events`` events of a training-like loop."""
    a = _allocator(events, stacks)
    live: list[int] = []
    sizes = _draws(4096)
    cell = 0
    while a.history.recorded < events:
        cell += 1
        if hasattr(a, "current_cell"):
            a.current_cell = cell  # a cell of a notebook
        for i, size in enumerate(sizes):
            _step(a, live, size, keep=i % 3 == 0)
            if i % 16 == 0:
                _optimizer(a)
    return a


def _timed(fn: Any) -> tuple[float, Any]:
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


#: The steps ``--only`` picks, each with the table's names it gives.
STEPS: dict[str, tuple[str, ...]] = {
    "snapshot": ("snapshot",), "files": ("save", "load", "file"),
    "payload": ("payload", "payload_size"), "answers": ("window", "layout", "detail"),
    "picture": ("picture",), "replay": ("replay",), "ring": ("ring", "ring_nostacks"),
}


def chosen_steps(only: str | None) -> set[str]:
    """The steps named in ``only`` (``STEPS``' keys or the table's names), or all of them."""
    if not only:
        return set(STEPS)
    out = set()
    for name in (n.strip() for n in only.split(",") if n.strip()):
        found = [step for step, names in STEPS.items() if name == step or name in names]
        if not found:
            names = sorted({*STEPS, *(n for ns in STEPS.values() for n in ns)})
            raise SystemExit(f"--only: no step {name!r}; the steps are {', '.join(names)}")
        out.update(found)
    return out


def best_of(repeat: int, fn: Any) -> dict[str, Any]:
    """``fn()`` (a dict of figures) run ``repeat`` times: the least of each number."""
    best: dict[str, Any] = {}
    for _ in range(max(1, repeat)):
        for key, value in fn().items():
            old = best.get(key)
            if isinstance(value, (int, float)) and isinstance(old, (int, float)):
                value = min(old, value)
            best[key] = value
    return best


def _ring_bytes(stacks: bool) -> tuple[float, float]:
    """(bytes an event in the ring, bytes beyond them: the side lists, per event) from the
    core's own figures; where a checkout has none, tracemalloc's (the C core allocates with
    ``PyMem_Realloc``, which it sees) over a ring of 200,000 events filled past full."""
    n = 200_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    a = record(n, stacks)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    h = a.history
    if hasattr(h, "event_bytes"):
        return float(h.event_bytes), (h.ring_bytes - h.event_bytes * h.kept) / h.kept
    return used / n, 0.0


def _save_load(snap: dict[str, Any], folder: str, n: int) -> dict[str, Any]:
    from jupyter_gpumem.data import files
    from jupyter_gpumem.data.schema import LoadLimits

    ours = getattr(files, "save_format", lambda p: None)("t.gpumem") is not None
    path = os.path.join(folder, "trace.gpumem" if ours else "trace.pickle")
    save_s, _ = _timed(lambda: files.save_snapshot(snap, path))
    size = os.path.getsize(path)
    limits = LoadLimits(max_bytes=1 << 40, max_events=n * 2, max_frames=1 << 40)
    load_s, loaded = _timed(lambda: files.load_snapshot(path, limits=limits))
    del loaded
    return {"format": "gpumem" if ours else "pickle", "save": save_s, "load": load_s,
            "file": size / max(n, 1), "file_mb": size / 1e6}


def _payload(snap: dict[str, Any]) -> tuple[float, float]:
    from jupyter_gpumem.render import view_payload

    def build() -> str:
        view = view_payload.build_view(snap, kind="trace")
        return json.dumps(view_payload.encode(view, "base64"), separators=(",", ":"))

    seconds, text = _timed(build)
    return seconds, len(text) / 1e6


def _answers(snap: dict[str, Any]) -> dict[str, float]:
    """The detail's one-off cost, then the slowest window and layout answer (seconds)."""
    from jupyter_gpumem.render import view_payload

    if not hasattr(view_payload, "trace_detail"):
        raise RuntimeError("this checkout answers no window (no view_detail)")
    detail_s, detail = _timed(lambda: view_payload.trace_detail(snap))
    detail_s += _timed(lambda: detail.band_index)[0]  # built on the first window: its cost too
    n = detail.n
    windows = []
    for share in (1.0, 0.1, 0.01, 0.0001):
        width = max(1, int(n * share))
        i0 = (n - width) // 2
        windows.append(_timed(lambda i0=i0, width=width: detail.window(i0, i0 + width, 2000))[0])
    layouts = [_timed(lambda k=k: detail.layout(k))[0] for k in (0, n // 2, n - 1)]
    return {"detail": detail_s, "window": max(windows), "layout": max(layouts)}


def _picture(snap: dict[str, Any], folder: str) -> float:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jupyter_gpumem.render.plots import plot_timeline

    def draw() -> None:
        ax = plot_timeline(snap)
        ax.figure.savefig(os.path.join(folder, "timeline.png"), dpi=100)
        plt.close(ax.figure)

    return _timed(draw)[0]


def _replay(snap: dict[str, Any]) -> float:
    import jupyter_gpumem as gm

    return _timed(lambda: gm.replay(snap))[0]


def run_steps(events: int, repeat: int = 1, only: set[str] | None = None) -> dict[str, Any]:
    """The ``only`` steps (default: every step) on a trace of ``events`` events, each timed
    ``repeat`` times (the best kept); a step that fails gives its error."""
    only = set(STEPS) if only is None else only
    out: dict[str, Any] = {"events": events, "repeat": repeat}
    t0 = time.perf_counter()
    a = record(events)
    out["record_s"] = time.perf_counter() - t0

    def snapshot() -> dict[str, Any]:
        seconds, snap = _timed(lambda: a.snapshot(mark=False))
        return {"snapshot": seconds, "snap": snap}

    record(1000).snapshot(mark=False)  # untimed: the one-off imports (numpy, ...) are not counted
    taken = best_of(repeat if "snapshot" in only else 1, snapshot)
    snap = taken.pop("snap")
    if "snapshot" in only:
        out.update(taken)
    out["events"] = len(snap["device_traces"][a.device.index])

    def one(name: str, fn: Any) -> dict[str, Any]:
        return {name: fn()}

    steps = {
        "files": lambda folder: _save_load(snap, folder, out["events"]),
        "payload": lambda folder: dict(zip(("payload", "payload_size"), _payload(snap),
                                           strict=True)),
        "answers": lambda folder: _answers(snap),
        "picture": lambda folder: one("picture", lambda: _picture(snap, folder)),
        "replay": lambda folder: one("replay", lambda: _replay(snap)),
    }
    with tempfile.TemporaryDirectory() as folder:
        for name, step in steps.items():
            if name not in only:
                continue
            try:
                out.update(best_of(repeat, lambda step=step: step(folder)))
            except Exception as exc:  # a step the checkout cannot do: say why, go on
                out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    for key, stacks in (("ring", True), ("ring_nostacks", False)):
        if "ring" not in only:
            continue
        try:
            out.update(best_of(repeat, lambda key=key, stacks=stacks: dict(
                zip((key, f"{key}_side"), _ring_bytes(stacks), strict=True))))
        except Exception as exc:
            out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _baseline(folder: str, events: int, repeat: int = 1, only: str | None = None
              ) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(folder)}
    subprocess.run([sys.executable, "-m", "jupyter_gpumem.engine._build_native"], cwd=folder,
                   env=env, capture_output=True, check=False)
    args = ["--events", str(events), "--repeat", str(repeat), "--steps-only"]
    args += ["--only", only] if only else []
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *args],
                          cwd=folder, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        return {"error": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _fmt(value: Any, unit: str) -> str:
    if not isinstance(value, (int, float)):
        return "—"
    return f"{value:.3f} {unit}" if unit == "s" else f"{value:.1f} {unit}"


def table(ours: dict[str, Any], base: dict[str, Any] | None) -> str:
    n, bn = ours["events"], (base or {}).get("events")
    scale = n / bn if base and bn else 1.0
    rows = [f"{'step':<14} {'target@10M':>12} {'ours':>14} {'baseline':>14} {'base×N':>14}"
            f" {'ratio':>8}  verdict"]
    for step, (limit, unit) in TARGETS.items():
        mine = ours.get(step)
        old = (base or {}).get(step)
        scaled = old * scale if isinstance(old, (int, float)) and unit in ("s",) else old
        if step == "payload_size" and isinstance(old, (int, float)):
            scaled = old * scale
        ratio = (f"{scaled / mine:.1f}×" if isinstance(mine, (int, float)) and mine
                 and isinstance(scaled, (int, float)) else "—")
        verdict = ("PASS" if isinstance(mine, (int, float)) and mine <= limit else
                   "MISS" if isinstance(mine, (int, float)) else
                   ours.get(f"{step}_error") or ours.get(f"{_step_of(step)}_error") or "—")
        rows.append(f"{step:<14} {_fmt(limit, unit):>12} {_fmt(mine, unit):>14} "
                    f"{_fmt(old, unit):>14} {_fmt(scaled, unit):>14} {ratio:>8}  {verdict}")
    if isinstance(ours.get("detail"), (int, float)):
        rows.append(f"detail (worked out once, when a linked view is shown): "
                    f"{ours['detail']:.3f} s")
    rows.append(f"ring side lists: {ours.get('ring_side', 0):.4f} B an event beyond the ring's "
                f"(with stacks), {ours.get('ring_nostacks_side', 0):.4f} (without)")
    best = f", best of {ours['repeat']} runs" if ours.get("repeat", 1) > 1 else ""
    rows.append(f"ours: {n:,} events ({ours.get('format', '?')} file{best}); "
                + (f"baseline: {bn:,} events, its times and payload scaled ×{scale:.1f} to "
                   f"ours in 'base×N' (ratio: base×N / ours)" if base and bn else "no baseline"))
    for key, value in {**ours, **{f"baseline {k}": v for k, v in (base or {}).items()}}.items():
        if key.endswith("error"):
            rows.append(f"{key}: {value}")
    return "\n".join(rows)


def _step_of(step: str) -> str:
    return {"save": "files", "load": "files", "file": "files", "payload_size": "payload",
            "window": "answers", "layout": "answers"}.get(step, step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--baseline", metavar="DIR", help="an older checkout's package folder root")
    ap.add_argument("--baseline-events", type=int, default=1_000_000)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="time each step K times and report the best (default 1)")
    ap.add_argument("--only", metavar="STEP[,STEP]",
                    help=f"run only these steps ({', '.join(STEPS)}, or the table's names)")
    ap.add_argument("--steps-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    only = chosen_steps(args.only)
    if args.steps_only:
        print(json.dumps(run_steps(args.events, args.repeat, only)))
        return
    base = (_baseline(args.baseline, args.baseline_events, args.repeat, args.only)
            if args.baseline else None)
    ours = run_steps(args.events, args.repeat, only)
    print(table(ours, base))
    if args.json:
        Path(args.json).write_text(json.dumps({"ours": ours, "baseline": base}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
