"""The ``memory_summary()`` table, in PyTorch's layout. A pure function of the stats dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping

WIDTH = 75

_POOLED = (
    ("allocated_bytes", "Allocated memory", "size"),
    ("active_bytes", "Active memory", "size"),
    ("requested_bytes", "Requested memory", "size"),
    ("reserved_bytes", "GPU reserved memory", "size"),
    ("inactive_split_bytes", "Non-releasable memory", "size"),
    ("allocation", "Allocations", "count"),
    ("active", "Active allocs", "count"),
    ("segment", "GPU reserved segments", "count"),
    ("inactive_split", "Non-releasable allocs", "count"),
)
_OVERSIZE = (
    ("oversize_allocations", "Oversize allocations"),
    ("oversize_segments", "Oversize GPU segments"),
)
_FIELDS = ("current", "peak", "allocated", "freed")


def _format_size(value: int, scale_by: float) -> str:
    # The unit is chosen by the pool total (scale_by), so rows of one metric line up.
    unit = "B  "
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if scale_by < 768 * 1024:
            break
        unit = bigger
        value //= 1024
        scale_by /= 1024
    return f"{value:6d} {unit}"


def _format_count(value: int, scale_by: float) -> str:
    unit = " "
    for bigger in ("K", "M"):
        if scale_by < 750 * 1000:
            break
        unit = bigger
        value //= 1000
        scale_by /= 1000
    return f"{value:7d} {unit} "


_FORMATTERS: dict[str, Callable[[int, float], str]] = {"size": _format_size, "count": _format_count}


def format_summary(stats: Mapping[str, int], device: int, *, abbreviated: bool = False) -> str:
    """The table PyTorch's ``torch.cuda.memory_summary`` prints, for our stats dict."""
    title = "jupyter_gpumem memory summary, device ID"
    lines = [
        "=" * WIDTH,
        f" {title:>55} {device:<17d} ",
        "-" * WIDTH,
        f"  {'':9} CUDA OOMs: {stats['num_ooms']:<12d} | {'':6} cudaMalloc retries: "
        f"{stats['num_alloc_retries']:<8d}  ",
        "=" * WIDTH,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    rows: list[tuple[str, str | None]] = [("all", None)]
    if not abbreviated:
        rows += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    for key, name, kind in _POOLED:
        fmt = _FORMATTERS[kind]
        lines.append("-" * WIDTH)
        scale = [stats[f"{key}.all.{f}"] for f in _FIELDS]
        for pool, label in rows:
            values = [stats[f"{key}.{pool}.{f}"] for f in _FIELDS]
            cells = [fmt(v, s) for v, s in zip(values, scale, strict=True)]
            lines.append(f" {label or name:<21} | " + " | ".join(cells) + " ")
    for key, name in _OVERSIZE:
        lines.append("-" * WIDTH)
        cells = [_format_count(stats[f"{key}.{f}"], stats[f"{key}.{f}"]) for f in _FIELDS]
        lines.append(f" {name:<21} | " + " | ".join(cells) + " ")
    lines.append("=" * WIDTH)
    return "|" + "|\n|".join(lines) + "|\n"
