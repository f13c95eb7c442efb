"""``python -m jupyter_gpumem demo``: a training-like workload run through our allocator, told as
a short story: the device, what the workload did, the summary, where the peak came from, what
is still live and who holds it, and the next command to try.

On a machine with a GPU the workload allocates CuPy arrays under our allocator
(``runtime.binding.using_allocator``); elsewhere, or with ``device="sim"``, it runs on a
simulated 16 GiB device (``registry.use_simulated_device``) with a manual clock, so its output is
the same on every run. Both paths go through the same ``api`` calls.

The workload's source (``WORKLOAD``) is compiled under its own file name, ``WORKLOAD_FILE``:
the recorder leaves out frames of jupyter_gpumem itself, so the workload has to live outside the
package for its lines to be the allocation sites that the story names.
"""

from __future__ import annotations

import linecache
import re
import shlex
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from jupyter_gpumem import api
from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.ranking import top_sites
from jupyter_gpumem.data.schema import Snapshot
from jupyter_gpumem.data.sites import site_of
from jupyter_gpumem.data.sizes import GiB, KiB, MiB
from jupyter_gpumem.data.timeline import build_timeline, peak_index
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.devices.cupy_device import NoDeviceError, cuda_unavailable_reason
from jupyter_gpumem.devices.simulated import ManualClock, SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.render.trace_result import surviving_blocks
from jupyter_gpumem.runtime import registry

__all__ = ["SIM_CAPACITY", "WORKLOAD", "WORKLOAD_FILE", "DemoRun", "Phase", "demo_allocator",
           "main", "run_demo", "run_workload", "story"]

DeviceChoice = Literal["auto", "sim", "cuda"]

#: The simulated device's size.
SIM_CAPACITY = 16 * GiB
#: The file name the workload's code runs under: the allocation sites are its lines.
WORKLOAD_FILE = "demo_workload.py"
#: A training-like loop. ``empty(nbytes)`` makes a buffer (a CuPy array on a GPU) that goes back
#: to the allocator when its last reference goes; ``note(label, what)`` ends a phase of the story.
WORKLOAD = """\
LAYERS, STEPS, GROW_EVERY = 4, 20, 5
weights = [empty(128 * MiB) for _ in range(LAYERS)]  # the model, kept all run
note("weights", f"{LAYERS} × 128 MiB, kept all run")
losses = []  # keeps every step's loss: a small leak
for step in range(STEPS):
    width = 24 * MiB * (1 + step // GROW_EVERY)  # longer sequences every few steps
    activations = [empty(width) for _ in range(LAYERS)]  # kept for the backward pass
    workspace = empty(64 * MiB)  # a temporary buffer
    del workspace
    loss = empty(4 * MiB)  # per-sample losses of the batch
    losses.append(loss)
    del activations, loss
    if step % GROW_EVERY == GROW_EVERY - 1:
        note(f"steps {step + 2 - GROW_EVERY}-{step + 1}",
             f"each: {LAYERS} × {width // MiB} MiB activations, a 64 MiB workspace, a 4 MiB loss")
"""


# -- buffers on the simulated device -------------------------------------------------------------

class _SimBuffer:
    """A block of a simulated device that looks like a CuPy array to ``data.holders``
    (``.data.ptr``, ``.nbytes``) and, like one, is freed when its last reference goes."""

    __slots__ = ("_free", "nbytes", "ptr")

    def __init__(self, ptr: int, nbytes: int, free: Callable[[int], None]) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self._free = free

    @property
    def data(self) -> _SimBuffer:  # ``buf.data.ptr``, as for a CuPy array
        return self

    def __del__(self) -> None:
        self._free(self.ptr)

    def __repr__(self) -> str:
        return f"<buffer {format_bytes(self.nbytes)} at {self.ptr:#x}>"


def _run_workload(empty: Callable[[int], Any], note: Callable[[str, str], None]
                  ) -> dict[str, Any]:
    """Run ``WORKLOAD``; returns its namespace (the variables it leaves behind)."""
    lines = WORKLOAD.splitlines(keepends=True)
    linecache.cache[WORKLOAD_FILE] = (len(WORKLOAD), None, lines, WORKLOAD_FILE)  # tracebacks
    namespace: dict[str, Any] = {"empty": empty, "note": note, "MiB": MiB}
    exec(compile(WORKLOAD, WORKLOAD_FILE, "exec"), namespace)
    del namespace["__builtins__"], namespace["empty"], namespace["note"], namespace["MiB"]
    return namespace


def run_workload(allocator: CachingAllocator, steps: int = 4) -> None:
    """A small fixed workload on a bare allocator, for a sample snapshot (the widget's tests use
    ``demo_allocator``): weights that stay, activations that come and go, a leak. The demo
    itself runs ``WORKLOAD``."""
    weights = [allocator.malloc(n) for n in (64 * MiB, 64 * MiB, 16 * MiB, 4 * KiB)]
    leaked = []
    for step in range(steps):
        activations = [allocator.malloc((8 + step) * MiB) for _ in range(6)]
        scratch = [allocator.malloc(256 * KiB) for _ in range(20)]
        for ptr in scratch[::2]:
            allocator.free(ptr)
        leaked.append(scratch[1])  # one scratch buffer per step is never freed
        for ptr in activations + scratch[3::2]:
            allocator.free(ptr)
    del weights, leaked


def demo_allocator(capacity: int = SIM_CAPACITY, *, stacks: bool = True) -> CachingAllocator:
    """An allocator on a simulated device that has run ``run_workload`` with history on."""
    device = SimulatedDevice(capacity, clock=ManualClock(tick_ns=1_000), name="Simulated GPU")
    allocator = CachingAllocator(device, AllocatorConfig.from_env())
    allocator.record_history(True, stacks=stacks)
    run_workload(allocator)
    return allocator


# -- running the demo ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One part of the workload, and what the allocator's counters did during it."""

    label: str  # "weights", "steps 1-5"
    what: str  # what it allocates, in words
    allocs: int  # allocations made
    allocated_bytes: int  # bytes of those allocations (rounded block sizes)
    freed_bytes: int  # bytes freed
    new_segments: int  # segments obtained from the device
    new_segment_bytes: int
    allocated: int  # allocated bytes at its end
    reserved: int  # reserved bytes at its end


@dataclass
class DemoRun:
    """Everything the story tells, as plain data."""

    device_line: str  # which device, and why
    simulated: bool
    phases: list[Phase]
    snapshot: Snapshot  # at the end of the workload, before its leftovers are freed
    stats: dict[str, int]  # the allocator's memory_stats at the same moment
    summary_table: str  # and its memory_summary table
    holders: dict[int, tuple[str, ...]] = field(default_factory=dict)  # address -> variables
    kinds: dict[str, str] = field(default_factory=dict)  # variable left behind -> its type


def _phase(label: str, what: str, before: dict[str, int], after: dict[str, int]) -> Phase:
    def delta(key: str) -> int:
        return after.get(key, 0) - before.get(key, 0)

    return Phase(label, what, delta("allocation.all.allocated"),
                 delta("allocated_bytes.all.allocated"), delta("allocated_bytes.all.freed"),
                 delta("segment.all.allocated"), delta("reserved_bytes.all.allocated"),
                 after.get("allocated_bytes.all.current", 0),
                 after.get("reserved_bytes.all.current", 0))


def _record(device_line: str, simulated: bool, empty: Callable[[int], Any]) -> DemoRun:
    """Run the workload on the runtime's current device with history on; take the snapshot,
    stats and holders at its end, then stop recording and free what it left behind."""
    phases: list[Phase] = []
    last = [api.memory_stats()]

    def note(label: str, what: str) -> None:
        now = api.memory_stats()
        phases.append(_phase(label, what, last[0], now))
        last[0] = now

    api.record_memory_history("all", context="all", stacks="python")
    try:
        left = _run_workload(empty, note)
        # the demo's own read, as a view's: no "snapshot" event at the end of the trace it shows
        snap = registry.get_allocator().snapshot(mark=False)
        stats = api.memory_stats()
        table = api.memory_summary()
        segments = snap["segments"]
        trace = [e for t in snap["device_traces"] for e in t]
        holders = {b.address: b.holders for b in surviving_blocks(trace, segments, left)}
        kinds = {name: type(value).__name__ for name, value in left.items()}
        left.clear()  # the workload's leftovers go back to the allocator
    finally:
        api.record_memory_history(None)
    return DemoRun(device_line, simulated, phases, snap, stats, table, holders, kinds)


@contextmanager
def _on_simulated_device(capacity: int) -> Iterator[None]:
    before = registry.backend()
    (allocator,) = registry.use_simulated_device(capacity, fresh=True)
    allocator.device.clock = ManualClock(tick_ns=1_000)  # deterministic trace times
    try:
        yield
    finally:
        if before == "cuda":
            registry.use_cuda()


@contextmanager
def _on_cuda() -> Iterator[None]:
    from jupyter_gpumem.runtime.binding import using_allocator

    before = registry.backend()
    registry.use_cuda()
    try:
        with using_allocator():
            yield
    finally:
        if before == "sim":
            registry.use_simulated_device()


def run_demo(device: DeviceChoice = "auto") -> DemoRun:
    """Run the workload on a GPU through CuPy (``"cuda"``), on a simulated device (``"sim"``),
    or on a GPU where there is one (``"auto"``). Raises ``NoDeviceError`` for ``"cuda"`` with
    no GPU, with one line saying why. Sets the simulated device up afresh."""
    if device not in ("auto", "sim", "cuda"):
        raise ValueError(f"device must be 'auto', 'sim' or 'cuda', got {device!r}")
    reason = None if device == "sim" else cuda_unavailable_reason()
    if device == "cuda" and reason is not None:
        raise NoDeviceError(reason)
    if device == "sim" or reason is not None:
        line = (f"No GPU here: {reason}.\nRunning on a simulated "
                f"{format_bytes(SIM_CAPACITY)} device instead." if reason else
                f"Running on a simulated {format_bytes(SIM_CAPACITY)} device, as asked.")

        with _on_simulated_device(SIM_CAPACITY):
            free = registry.get_allocator().free  # a buffer outliving the run still goes back

            def empty(nbytes: int) -> _SimBuffer:
                return _SimBuffer(api.caching_allocator_alloc(nbytes), nbytes, free)

            return _record(line, True, empty)

    import cupy

    with _on_cuda():
        allocator = registry.get_allocator()
        _, total = api.mem_get_info()
        line = (f"{allocator.device.name} ({format_bytes(total)}), CuPy {cupy.__version__}: "
                "running the workload on it through our allocator.")

        def cupy_empty(nbytes: int) -> Any:
            return cupy.empty(nbytes, dtype=cupy.uint8)

        return _record(line, False, cupy_empty)


# -- the story -------------------------------------------------------------------------------------

def _code_of(site: str) -> str:
    """``"demo_workload.py:7"`` → ``"line 7: activations = [...]"`` for the workload's lines."""
    filename, _, line = site.rpartition(":")
    if filename.replace("\\", "/").rsplit("/", 1)[-1] != WORKLOAD_FILE or not line.isdigit():
        return site
    lines = WORKLOAD.splitlines()
    code = lines[int(line) - 1].split("  #", 1)[0].strip() if 0 < int(line) <= len(lines) else ""
    return f"line {line:>2}: {code}" if code else f"line {line}"


def _holders(names: tuple[str, ...]) -> tuple[tuple[str, bool], ...]:
    """``("losses[0]", "x")`` → ``(("losses", True), ("x", False))``: each variable once, and
    whether the block is inside it (an item of a list, tuple or dict) or is it."""
    out: dict[str, bool] = {}
    for name in names:
        base = re.sub(r"\[.*\]$", "", name)
        out[base] = out.get(base, False) or base != name
    return tuple(out.items())


def _held_by(holders: tuple[tuple[str, bool], ...], kinds: dict[str, str],
             sizes: list[int]) -> str:
    """``(("losses", True),)`` → ``"held by `losses` (list of 20 × 4.0 MiB)"``."""
    if not holders:
        return "held by no variable"
    text = "held by " + ", ".join(f"`{name}`" for name, _ in holders)
    if len(holders) == 1 and holders[0][1]:
        each = (f"{len(sizes)} × {format_bytes(sizes[0])}" if len(set(sizes)) == 1
                else f"{len(sizes)} blocks")
        text += f" ({kinds.get(holders[0][0], 'container')} of {each})"
    return text


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, 96, initial_indent="  ", subsequent_indent="  ")


def _workload_part(run: DemoRun) -> list[str]:
    out = [f"The workload ({WORKLOAD_FILE}), a training-like loop; after each part, "
           "allocated / reserved:"]
    width = max(len(p.label) for p in run.phases)
    for p in run.phases:
        segs = (f"{p.new_segments} new segment{'s' * (p.new_segments != 1)} "
                f"({format_bytes(p.new_segment_bytes)})" if p.new_segments else "no new segment")
        out.append(f"  {p.label:<{width}}  {p.what}")
        out.append(f"  {'':<{width}}  {p.allocs} allocs ({format_bytes(p.allocated_bytes)}), "
                   f"{format_bytes(p.freed_bytes)} freed, {segs}  →  "
                   f"{format_bytes(p.allocated)} / {format_bytes(p.reserved)}")
    return out


def _summary_part(run: DemoRun, full: bool) -> list[str]:
    s = run.stats
    out = [
        f"Summary at the end: {format_bytes(s['allocated_bytes.all.current'])} allocated "
        f"(peak {format_bytes(s['allocated_bytes.all.peak'])}), "
        f"{format_bytes(s['reserved_bytes.all.current'])} reserved "
        f"(peak {format_bytes(s['reserved_bytes.all.peak'])})",
        f"  in {s['segment.all.current']} segments; {s['num_alloc_retries']} alloc retries, "
        f"{s['num_ooms']} OOMs" + ("." if full else " (--full: PyTorch's whole memory_summary)."),
    ]
    cached = s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]
    segments = run.snapshot["segments"]
    free = [b["size"] for seg in segments for b in seg["blocks"] if b["state"] == "inactive"]
    idle = [seg["total_size"] for seg in segments if seg["allocated_size"] == 0]
    if cached and free:
        out.extend(_wrap(
            f"{format_bytes(cached)} of the reserved bytes are cached free, in {len(free)} "
            f"blocks (largest {format_bytes(max(free))}): the batches grew, so blocks freed by "
            "smaller ones were too small for the next, and the allocator asked the device for "
            f"{s['segment.all.allocated']} segments in all. {len(idle)} segments "
            f"({format_bytes(sum(idle))}) hold nothing live: empty_cache() would give them "
            "back."))
    if full:
        out += ["", run.summary_table.rstrip("\n")]
    return out


def _peak_part(run: DemoRun) -> list[str]:
    tl = build_timeline(run.snapshot)
    peak = peak_index(tl)
    if peak < 0:
        return ["No event was recorded."]
    out = [f"Where the peak came from: {format_bytes(int(tl.allocated[peak]))} allocated "
           f"after event {peak} of {len(tl)}, by these lines:"]
    for use in top_sites(tl, live_intervals(tl), peak, 5):
        out.append(f"  {format_bytes(use.bytes):>9} in {use.count:>2} block"
                   f"{'s' if use.count != 1 else ' '}  {_code_of(use.site)}")
    return out


def _left_part(run: DemoRun) -> list[str]:
    groups: dict[tuple[str, tuple[tuple[str, bool], ...]], list[int]] = defaultdict(list)
    for seg in run.snapshot["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                site = site_of(b["frames"]) or "(no stack)"
                groups[(site, _holders(run.holders.get(b["address"], ())))].append(b["size"])
    if not groups:
        return ["Nothing is still live at the end."]
    out = ["Still live at the end:"]
    for (site, holders), sizes in sorted(groups.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
        out.append(f"  {format_bytes(sum(sizes)):>9}  {_code_of(site)}")
        out.append(f"  {'':>9}  {_held_by(holders, run.kinds, sizes)}")
    return out


def _next_part(saved: str | None) -> list[str]:
    out = [
        "Next, in a notebook:",
        "  %load_ext jupyter_gpumem      our allocator under every CuPy array",
        "  %%gpumem_trace                at the top of a cell: this story for that cell",
        "  %gpumem cells                 what each cell allocated, kept and peaked at",
    ]
    if saved is None:
        out += ["Keep this run's trace with --save trace.json.gz, then:",
                "  python -m jupyter_gpumem render trace.json.gz -o trace.html"]
    else:
        q = shlex.quote(saved)
        out += [f"This run's trace is in {saved}; see it as an offline page, or in short:",
                f"  python -m jupyter_gpumem render {q} -o trace.html",
                f"  python -m jupyter_gpumem summary {q}"]
    return out


def story(run: DemoRun, *, full: bool = False, saved: str | None = None) -> str:
    """The demo's output: the device, what the workload did, the summary (with PyTorch's table
    if ``full``), where the peak came from, what is left and who holds it, what to try next."""
    parts = [[run.device_line], _workload_part(run), _summary_part(run, full), _peak_part(run),
             _left_part(run), _next_part(saved)]
    return "\n\n".join("\n".join(part) for part in parts) + "\n"


def main(device: DeviceChoice = "auto", *, full: bool = False, save: str | None = None) -> str:
    """Run the demo and return its story; with ``save``, write the trace there first."""
    run = run_demo(device)
    if save is not None:
        from jupyter_gpumem.data.files import save_snapshot

        save_snapshot(run.snapshot, save)
    return story(run, full=full, saved=save)
