"""``python -m jupyter_gpumem``: the demo and tools for saved traces."""

from __future__ import annotations

import argparse
import os
import sys


def _summary(path: str) -> str:
    from jupyter_gpumem.data.files import load_snapshot
    from jupyter_gpumem.data.ranking import top_sites
    from jupyter_gpumem.data.sites import short_site
    from jupyter_gpumem.data.timeline import build_timeline, live_intervals
    from jupyter_gpumem.data.units import format_bytes

    snap = load_snapshot(path)
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
    if isinstance(stats, dict):
        lines.append(
            f"  stats:    peak allocated {format_bytes(stats['allocated_bytes.all.peak'])}, "
            f"peak reserved {format_bytes(stats['reserved_bytes.all.peak'])}, "
            f"{stats['num_ooms']} OOMs, {stats['num_alloc_retries']} retries")
    for dev, trace in enumerate(snap["device_traces"]):
        if not trace:
            continue
        tl = build_timeline(snap, dev)
        iv = live_intervals(tl)
        peak = int(tl.allocated.argmax())
        lines.append(f"  trace (device {dev}): {len(tl)} events, peak "
                     f"{format_bytes(int(tl.allocated[peak]))} allocated at event {peak}")
        lines.append("  top sites at the peak:")
        for use in top_sites(tl, iv, peak, 10):
            lines.append(f"    {format_bytes(use.bytes):>10}  {use.count:>6}×  "
                         f"{short_site(use.site)}")
    return "\n".join(lines) + "\n"


def _render(path: str, out: str, what: str) -> None:
    from jupyter_gpumem.data.files import load_snapshot

    snap = load_snapshot(path)
    if out.endswith((".html", ".htm")):
        from jupyter_gpumem.render.html import save_html

        save_html(snap, out, title=f"GPU memory · {os.path.basename(path)}")
    elif out.endswith((".png", ".svg", ".pdf")):
        from jupyter_gpumem.render.plots import plot_segments, plot_timeline

        if what == "auto":
            what = "timeline" if any(snap["device_traces"]) else "segments"
        ax = plot_timeline(snap) if what == "timeline" else plot_segments(snap)
        ax.figure.savefig(out, dpi=100, bbox_inches="tight")
    else:
        raise SystemExit(f"error: cannot tell the output format of {out!r} "
                         "(use .html, .png, .svg or .pdf)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpumem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run a scripted workload on a simulated device, print a summary")
    render = sub.add_parser("render", help="draw a saved snapshot/trace (ours or a PyTorch "
                            "pickle) as an offline HTML page or a picture")
    render.add_argument("file", help=".json, .json.gz or .pickle")
    render.add_argument("-o", "--output", required=True, help="out.html, out.png, .svg or .pdf")
    render.add_argument("--plot", choices=("auto", "timeline", "segments"), default="auto",
                        help="for pictures: the timeline (default with a trace) or the layout")
    summary = sub.add_parser("summary", help="print segments, blocks, stats and top sites")
    summary.add_argument("file", help=".json, .json.gz or .pickle")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from jupyter_gpumem.demo import main as demo

        demo()
    elif args.command in ("render", "summary"):
        from jupyter_gpumem.data.files import SnapshotFormatError, UnsafePickleError

        try:
            if args.command == "render":
                _render(args.file, args.output, args.plot)
                print(f"wrote {args.output}")
            else:
                sys.stdout.write(_summary(args.file))
        except (OSError, SnapshotFormatError, UnsafePickleError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
