"""Words for an out-of-memory failure: a pure function of an ``OomReport``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.data.sizes import MiB
from jupyter_gpumem.data.units import format_bytes


@dataclass
class OomReport:
    """Everything known when a request failed after the whole retry ladder. Plain data."""

    requested: int  # bytes the user asked for
    rounded: int  # bytes after rounding
    segment_size: int  # bytes of the segment the allocator tried to get
    stream: int
    device: int
    device_name: str
    device_free: int
    device_total: int
    allocated: int  # bytes held by live blocks
    reserved: int  # bytes in segments
    largest_free_block: int  # the biggest cached free block in any pool and stream
    free_cached: int  # bytes cached free (reserved - allocated)
    cap: int | None  # reserved-bytes cap from per_process_memory_fraction
    fraction: float | None
    max_split_size: int | None
    processes: list[tuple[int, str, int]] = field(default_factory=list)  # other processes


class OutOfMemoryError(MemoryError):
    """A request failed after the whole retry ladder. ``report`` holds the facts.

    It pickles with its report, its message and any attribute set on it (a Dask worker names
    itself and its task so: ``jupyter_gpumem.dask.plugin``), so it reaches another process
    whole."""

    def __init__(self, report: OomReport) -> None:
        self.report = report
        super().__init__(explain_oom(report))

    def __reduce__(self) -> Any:
        return rebuild_oom, (type(self), self.report, self.args, dict(self.__dict__))


def rebuild_oom(cls: Callable[[OomReport], BaseException], report: OomReport,
                args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    """An out-of-memory error of ``cls`` as it was pickled: its report, args and attributes."""
    exc = cls(report)
    exc.args = args
    exc.__dict__.update(state)
    return exc


#: How our out-of-memory message starts, whichever exception carries it (ours, CuPy's, or
#: PyTorch's when it allocates from our cache: ``runtime.torch_share``).
OOM_HEAD = "jupyter_gpumem: out of memory on device "


def explain_oom(r: OomReport) -> str:
    """The OOM message: the request, the device, this process, the cap, others, one next step."""
    lines = [
        f"{OOM_HEAD}{r.device} ({r.device_name}): tried to allocate "
        f"{format_bytes(r.requested)} ({r.requested} B) on stream {r.stream:#x}.",
        f"Device: {format_bytes(r.device_free)} free of {format_bytes(r.device_total)} total.",
        f"This process: {format_bytes(r.allocated)} allocated by live arrays, "
        f"{format_bytes(r.free_cached)} reserved but unallocated "
        f"(largest free cached block {format_bytes(r.largest_free_block)}).",
    ]
    if r.cap is not None:
        lines.append(
            f"Cap: per_process_memory_fraction={r.fraction:g} limits reserved memory to "
            f"{format_bytes(r.cap)}; {format_bytes(r.reserved)} is reserved now."
        )
    others = sum(size for _, _, size in r.processes)
    if r.processes:
        listed = ", ".join(f"pid {pid} ({name}) {format_bytes(size)}"
                           for pid, name, size in r.processes[:5])
        more = f" and {len(r.processes) - 5} more" if len(r.processes) > 5 else ""
        lines.append(f"Other processes on this GPU: {listed}{more}.")
    lines.append("Next step: " + suggest(r, others))
    return "\n".join(lines)


def suggest(r: OomReport, others: int) -> str:
    """The first of ``advice``: one concrete next step for the situation in ``r``."""
    return advice(r, others)[0]


def advice(r: OomReport, others: int) -> list[str]:
    """Every next step that is true of ``r``, the most specific first; never empty.

    ``others`` is the bytes other processes hold on the device. Each step is given only when its
    condition holds. ``empty_cache()`` is never among them: before raising, the retry ladder has
    already released every cached block that is a whole segment, so it would release nothing.
    Code is written between backticks."""
    out: list[str] = []
    capped = r.cap is not None and r.reserved + r.segment_size > r.cap
    if capped and r.device_free >= r.segment_size:
        fraction = min(1.0, (r.reserved + r.segment_size) / r.device_total + 0.05)
        out.append(
            "the cap, not the device, refused this request: raise it (e.g. "
            f"`%gpumem limit {fraction:.2f}`).")
        return out  # the device had room: nothing else is true of this request
    fragmented = r.free_cached >= r.rounded and r.largest_free_block < r.rounded
    if fragmented and r.max_split_size is None and r.rounded > MiB:
        mb = max(32, 1 << max(0, (r.rounded // MiB).bit_length() - 1))
        out.append(
            f"{format_bytes(r.free_cached)} is cached but split into blocks of at most "
            f"{format_bytes(r.largest_free_block)}: set "
            f"`JUPYTER_GPUMEM_ALLOC_CONF=max_split_size_mb:{mb}` (or "
            f"`%gpumem config max_split_size_mb:{mb}`) so large blocks are not split.")
    if others and not capped and r.device_free + others >= r.segment_size:
        out.append(
            f"other processes hold {format_bytes(others)} of this GPU: stop the ones you do not "
            "need (see `%gpumem processes`).")
    if r.allocated and r.device_free + r.reserved >= r.segment_size:
        out.append("free memory you no longer need: `del` the arrays holding it "
                   "(`caching_allocator_delete(ptr)` for `caching_allocator_alloc`).")
    # how far off the request is, against what it could have had: the device's free memory,
    # or what the cap leaves when the cap is the tighter limit
    room, what = r.device_free, "what the device has free"
    if r.cap is not None and r.cap - r.reserved < room:
        room, what = max(0, r.cap - r.reserved), "what the cap leaves"
    ratio = (f", about {r.rounded / room:.1f}× {what}" if 0 < room < r.rounded
             else f", and {what} is nothing" if room <= 0 else "")
    out.append(
        f"shrink the work: this request needs {format_bytes(r.rounded)}{ratio} — a smaller "
        "batch or chunked processing may fit.")
    return out
