"""``python -m jupyter_gpumem``: the demo and tools for saved traces.

A file that cannot be read ends the command with one line, ``jupyter-gpumem: FILE: what is
wrong``, and exit status 1; no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

#: How error lines start.
PROG = "jupyter-gpumem"
_INPUT_HELP = ".json, .json.gz or a PyTorch .pickle (gzipped or not)"
_LIMITS_HELP = ("Files are checked before use; big ones may pass a limit (decompressed size "
                "and text, segments, blocks, events, frames, extras): raise it with the "
                "environment variable JUPYTER_GPUMEM_LOAD_LIMITS, e.g. "
                "max_bytes:4GiB,max_events:50000000.")


def _summary(path: str) -> str:
    from jupyter_gpumem.data.files import load_snapshot

    snap = load_snapshot(path)
    from jupyter_gpumem.data.intervals import live_intervals
    from jupyter_gpumem.data.ranking import top_sites
    from jupyter_gpumem.data.sites import short_site
    from jupyter_gpumem.data.timeline import build_timeline
    from jupyter_gpumem.data.units import format_bytes

    segs = snap["segments"]
    blocks = [b for s in segs for b in s["blocks"]]
    live = [b for b in blocks if b["state"] != "inactive"]
    reserved = sum(s["total_size"] for s in segs)
    allocated = sum(b["size"] for b in live)
    lines = [
        f"{path}",
        f"  segments: {len(segs)} ({sum(s['segment_type'] == 'small' for s in segs)} small, "
        f"{sum(s['segment_type'] == 'large' for s in segs)} large), {format_bytes(reserved)} "
        "reserved",
        f"  blocks:   {len(live)} allocated ({format_bytes(allocated)}), "
        f"{len(blocks) - len(live)} cached free ({format_bytes(reserved - allocated)})",
    ]
    stats = (snap.get("jupyter_gpumem") or {}).get("stats")
    keys = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_ooms",
            "num_alloc_retries")
    if isinstance(stats, dict) and all(type(stats.get(k)) is int for k in keys):
        lines.append(
            f"  stats:    peak allocated {format_bytes(stats['allocated_bytes.all.peak'])}, "
            f"peak reserved {format_bytes(stats['reserved_bytes.all.peak'])}, "
            f"{stats['num_ooms']} OOMs, {stats['num_alloc_retries']} retries")
    extra: dict[str, Any] = dict(snap.get("jupyter_gpumem") or {})
    workers = {k: addr for addr, k in (extra.get("workers") or {}).items()}
    if workers:
        lines.append(f"  cluster:  {len(workers)} Dask worker(s), worker k is device k")
        for addr, why in (extra.get("missing_workers") or {}).items():
            lines.append(f"  missing:  {addr}: {why}")
    for dev, trace in enumerate(snap["device_traces"]):
        if not trace:
            continue
        tl = build_timeline(snap, dev)
        iv = live_intervals(tl)
        peak = int(tl.allocated.argmax())
        where = f"worker {workers[dev]}, device {dev}" if dev in workers else f"device {dev}"
        lines.append(f"  trace ({where}): {len(tl)} events, peak "
                     f"{format_bytes(int(tl.allocated[peak]))} allocated at event {peak}")
        lines.append("  top sites at the peak:")
        for use in top_sites(tl, iv, peak, 10):
            lines.append(f"    {format_bytes(use.bytes):>10}  {use.count:>6}×  "
                         f"{short_site(use.site)}")
        if extra.get("tasks"):
            lines += _top_tasks_lines(snap, dev, peak)
    return "\n".join(lines) + "\n"


def _top_tasks_lines(snap: Any, device: int, peak: int) -> list[str]:
    """The top Dask task prefixes at the peak of a worker's trace (tasks need Dask's key_split)."""
    from jupyter_gpumem.data.units import format_bytes

    try:
        from jupyter_gpumem.dask.tasks import top_tasks
    except ImportError:
        return ["  top tasks: need Dask (pip install \"jupyter_gpumem[dask]\")"]
    lines = ["  top tasks at the peak:"]
    for use in top_tasks(snap, device, peak, 10):
        lines.append(f"    {format_bytes(use.bytes):>10}  {use.count:>6}×  {use.task}")
    return lines


def _render(path: str, out: str, what: str) -> None:
    from jupyter_gpumem.data.files import load_snapshot

    snap = load_snapshot(path)
    if out.endswith((".html", ".htm")):
        from jupyter_gpumem.render.html import save_html

        save_html(snap, out, title=f"GPU memory · {os.path.basename(path)}")
    else:
        from jupyter_gpumem.render.plots import plot_segments, plot_timeline

        if what == "auto":
            what = "timeline" if any(snap["device_traces"]) else "segments"
        ax = plot_timeline(snap) if what == "timeline" else plot_segments(snap)
        ax.figure.savefig(out, dpi=100, bbox_inches="tight")


def _replay(path: str, configs: list[str], suggest: bool, capacity: str | None) -> str:
    """What ``%gpumem replay FILE`` shows, as text: the comparison, or the suggestion."""
    from jupyter_gpumem.data.sizes import MAX_ALLOC_SIZE
    from jupyter_gpumem.data.units import format_bytes, parse_bytes
    from jupyter_gpumem.engine.config import AllocatorConfig
    from jupyter_gpumem.whatif.compare import compare, suggest_config
    from jupyter_gpumem.whatif.replay import prepare

    chosen: list[AllocatorConfig | None] = []
    for text in configs:
        word = text.strip().lower()
        try:
            chosen.append(None if word == "recorded" else AllocatorConfig() if word in (
                "defaults", "default") else AllocatorConfig.parse(text))
        except (ValueError, TypeError) as exc:
            raise _UsageProblem(f"--config {text}: {exc}") from None
    try:
        size = None if capacity is None else parse_bytes(capacity)
    except ValueError as exc:
        raise _UsageProblem(f"--capacity: {exc}") from None
    if size is not None and not 0 < size <= MAX_ALLOC_SIZE:  # the largest device replayed
        raise _UsageProblem(f"--capacity must be between 1 B and {format_bytes(MAX_ALLOC_SIZE)}"
                            f", got {capacity!r}")
    prepared = prepare(path, size)
    result: Any = suggest_config(prepared) if suggest else compare(prepared, chosen or None)
    return str(result.text()) + "\n"


class _UsageProblem(Exception):
    """A bad option value, said as the parser says its errors."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpumem", description=(
        "Tools for GPU-memory snapshots and traces saved by jupyter_gpumem or PyTorch, and a "
        "demo. A file that cannot be read ends the command with one line, "
        f"'{PROG}: FILE: what is wrong', and exit status 1."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo_help = ("run a training-like workload through our allocator and tell where its memory "
                 "went")
    demo = sub.add_parser("demo", help=demo_help, description=(
        f"{demo_help[0].upper()}{demo_help[1:]}: the device, what the workload allocated step "
        "by step, a summary, the lines behind the peak, what is still live and which variable "
        "holds it, and what to try next. It runs on the GPU through CuPy where there is one, "
        "else on a simulated GPU of 16 GiB (no CUDA device or CuPy needed), where every run "
        "prints the same."))
    demo.add_argument("--device", choices=("auto", "sim", "cuda"), default="auto",
                      help="cuda: the current GPU through CuPy (exit status 1 where there is "
                           "none); sim: the simulated GPU; auto (default): cuda where there is "
                           "a GPU, else sim")
    demo.add_argument("--full", action="store_true",
                      help="also print PyTorch's full memory_summary table")
    demo.add_argument("--save", metavar="PATH",
                      help="write the run's trace there (e.g. trace.json.gz, or .pickle for "
                           "PyTorch's viewer) for the render and summary commands")
    render_help = ("draw a saved snapshot/trace (ours or a PyTorch pickle) as an offline HTML "
                   "page or a picture")
    render = sub.add_parser("render", help=render_help, epilog=_LIMITS_HELP, description=(
        f"{render_help[0].upper()}{render_help[1:]}. The page works without a network; a "
        "picture shows the timeline of a trace, or the segment layout."))
    render.add_argument("file", help=_INPUT_HELP)
    render.add_argument("-o", "--output", required=True,
                        help="out.html (interactive page), or out.png, .svg or .pdf (picture)")
    render.add_argument("--plot", choices=("auto", "timeline", "segments"), default="auto",
                        help="for pictures: the timeline (default with a trace) or the layout")
    summary_help = "print segments, blocks, stats and top sites of a saved snapshot/trace"
    summary = sub.add_parser("summary", help=summary_help, epilog=_LIMITS_HELP, description=(
        f"{summary_help[0].upper()}{summary_help[1:]}: reserved and allocated bytes, and for "
        "each device's trace the peak and the lines holding the most memory there."))
    summary.add_argument("file", help=_INPUT_HELP)
    replay_help = "replay a saved trace under other allocator configs, side by side"
    replay = sub.add_parser("replay", help=replay_help, epilog=_LIMITS_HELP, description=(
        f"{replay_help[0].upper()}{replay_help[1:]} (what %%gpumem replay FILE shows): peak "
        "reserved and allocated, segments, retries, out-of-memory errors; --suggest searches "
        "a small grid for the config that fits with the least reserved."))
    replay.add_argument("file", help=_INPUT_HELP)
    replay.add_argument("--config", action="append", default=[], metavar="KEY:VALUE,...",
                        help="a config to compare (repeat it); 'recorded' or 'defaults' too")
    replay.add_argument("--suggest", action="store_true",
                        help="search a small grid for the config with the least reserved")
    replay.add_argument("--capacity", metavar="SIZE", default=None,
                        help="the device's size, e.g. 16GiB (default: the recorded one)")
    return parser


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 1


def _demo(device: str, full: bool, save: str | None) -> int:
    from jupyter_gpumem.demo import main as demo
    from jupyter_gpumem.devices.cupy_device import NoDeviceError

    try:
        sys.stdout.write(demo(device, full=full, save=save))  # type: ignore[arg-type]
    except NoDeviceError as exc:
        return _fail(f"demo --device {device}: {exc}")
    except OSError as exc:  # writing --save
        return _fail(f"{save}: cannot write it: {exc.strerror or exc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args.device, args.full, args.save)
    from jupyter_gpumem.data.files import SnapshotFileError
    from jupyter_gpumem.data.schema import LoadLimits

    try:
        LoadLimits.from_env()
    except ValueError as exc:
        return _fail(str(exc))
    if args.command == "render" and not args.output.lower().endswith(
            (".html", ".htm", ".png", ".svg", ".pdf")):
        parser.error(f"cannot tell the output format of {args.output!r} "
                     "(use .html, .png, .svg or .pdf)")
    try:
        if args.command == "render":
            _render(args.file, args.output, args.plot)
            print(f"wrote {args.output}")
        elif args.command == "replay":
            if args.suggest and args.config:
                parser.error("replay: --suggest searches its own grid; give it no --config")
            try:
                sys.stdout.write(_replay(args.file, args.config, args.suggest, args.capacity))
            except _UsageProblem as exc:
                parser.error(f"replay: {exc}")
            except ValueError as exc:  # a layout the replay cannot rebuild
                if isinstance(exc, SnapshotFileError):
                    raise
                return _fail(f"{args.file}: {exc}")
        else:
            sys.stdout.write(_summary(args.file))
    except SnapshotFileError as exc:
        return _fail(str(exc))
    except OSError as exc:  # writing the output
        name = exc.filename if exc.filename is not None else args.output
        return _fail(f"{name}: cannot write it: {exc.strerror or exc}")
    return 0

