"""The ``%gpumem`` subcommands that show something and change nothing: the status line,
summary, stats, snapshot, plot, cells, diff, processes, info, and the snapshot files (dump, load).

Each ``do_<name>(host, args)`` gets the loaded extension (``Host``) and the parsed, checked
arguments (``subcommands`` checked the arity and flags); each is a plain call underneath (``api``,
``CachingAllocator``, ``Ledger``, ``data.files``) plus its text or picture.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from jupyter_gpumem import sources
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.notebook.host import Host, no_gpu_message, require_allocator
from jupyter_gpumem.notebook.ledger import DEFAULT_SOURCE, source_label
from jupyter_gpumem.notebook.output import Picture, StatusLine, display, usage_error
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.runtime import registry
from jupyter_gpumem.sources.cupy import history_words
from jupyter_gpumem.sources.torch import TorchSource, selected_torch

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot

__all__ = ["do_cells", "do_diff", "do_dump", "do_info", "do_load", "do_plot", "do_processes",
           "do_snapshot", "do_stats", "do_status", "do_summary", "status_line"]


def _torch() -> TorchSource | None:
    return selected_torch()


def _cupy_on() -> bool:
    return "cupy" in sources.selected()


def do_status(host: Host, args: Namespace) -> None:
    """The status line (an output of its own: a frontend that draws our views still shows it),
    the block layout as the cell ran, when there are segments, and the live view."""
    allocator = registry.current_allocator() if _cupy_on() else None
    snapshot = None
    if allocator is not None:  # the layout now: segments only, no trace to carry
        snapshot = allocator.snapshot(mark=False)
    elif (torch := _torch()) is not None:
        snapshot = torch.snapshot()
    display(StatusLine(status_line(host)))
    if snapshot is not None and snapshot["segments"]:
        from jupyter_gpumem.render.display import SnapshotView

        snapshot["device_traces"] = [[] for _ in snapshot["device_traces"]]
        cell = host.ledger.running
        when = f"cell [{cell}]" if cell is not None else "this cell"
        display(SnapshotView(snapshot, title=f"block layout when {when} ran (%gpumem snapshot "
                             "shows it now)", cell_files=host.ledger.cell_files,
                             holders=_holders(host, snapshot)))
    _start_live(host)


def _holders(host: Host, snapshot: Snapshot) -> dict[int, list[str]]:
    """The variables of the user's namespace that hold each allocated block of ``snapshot``."""
    from jupyter_gpumem.data.holders import find_holders

    namespace = host.ledger.namespace
    if namespace is None:
        return {}
    live = [(b["address"], b["size"]) for s in snapshot["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"]
    return {a: list(h) for a, h in find_holders(namespace(), live,
                                                cell_files=host.ledger.cell_files).items()}


def torch_status_line(host: Host, torch: TorchSource) -> str:
    """The status line of PyTorch's allocator."""
    st = torch.memory_stats()
    free, total = torch.mem_get_info()
    history = "history on" if torch.history_on() else "history off"
    rows = host.ledger.recorded("torch")
    return (f"gpumem · torch device {torch.device_index} ({torch.device_name}) · allocated "
            f"{format_bytes(st.get('allocated_bytes.all.current', 0))} (peak "
            f"{format_bytes(st.get('allocated_bytes.all.peak', 0))}) · reserved "
            f"{format_bytes(st.get('reserved_bytes.all.current', 0))} · device free "
            f"{format_bytes(free)} of {format_bytes(total)} · {history} · {rows} cells recorded")


def status_line(host: Host) -> str:
    """What a bare ``%gpumem`` shows: backend, device, allocated, reserved, history, cells; one
    labelled row a source when two are on ("cupy: ...", "torch: ...")."""
    torch = _torch()
    if torch is None:
        return _cupy_status_line(host)
    try:
        line = torch_status_line(host, torch)
    except Exception as exc:  # PyTorch without a usable GPU
        line = f"gpumem · torch: cannot read PyTorch's allocator ({exc})"
    if not _cupy_on():
        return line
    return f"cupy: {_cupy_status_line(host)}\ntorch: {line}"


def _cupy_status_line(host: Host) -> str:
    allocator = registry.current_allocator()
    if allocator is None:
        return f"gpumem: {no_gpu_message(host)}; %gpumem device sim to try it on a simulated device"
    st = allocator.stats
    free, total = allocator.device.mem_get_info()
    hint = host.ledger.cache_hint_now()
    return (f"gpumem · {registry.backend()} device {allocator.device.index} "
            f"({allocator.device.name}) · allocated "
            f"{format_bytes(st.allocated_bytes.all.current)} "
            f"(peak {format_bytes(st.allocated_bytes.all.peak)}) · reserved "
            f"{format_bytes(allocator.memory_reserved())} · device free "
            f"{format_bytes(free)} of {format_bytes(total)} · "
            f"{history_words(allocator.history)} · "
            f"{host.ledger.recorded(every_source=True)} cells recorded"
            + (f" · {hint}" if hint else ""))


def _start_live(host: Host) -> None:
    if not host.settings.live_view:
        return
    from jupyter_gpumem.notebook.trace import live_session, source_live_session

    allocator = registry.current_allocator() if _cupy_on() else None
    torch = _torch()
    if allocator is None and torch is None:
        return
    host.stop_live()
    # The live view follows one source: our allocator, else PyTorch's.
    session = live_session(allocator) if allocator is not None else source_live_session(torch)
    if session is not None:  # without a widget the status line is enough
        host.live = session


def _labelled(host: Host) -> list[tuple[str, Any]]:
    """``(label, source)`` of the sources on: our allocator (as a ``MemorySource``) and/or the
    torch source; the label is "" when only one is on. A UsageError when none can be read."""
    from jupyter_gpumem.sources.cupy import CupySource

    torch = _torch()
    out: list[tuple[str, Any]] = []
    if _cupy_on():
        if torch is None:
            out.append(("", CupySource(require_allocator(host))))
        elif (allocator := registry.current_allocator()) is not None:
            out.append(("cupy", CupySource(allocator)))
    if torch is not None:
        out.append(("torch" if out else "", torch))
    if not out:
        require_allocator(host)
    return out


def do_summary(host: Host, args: Namespace) -> None:
    for label, src in _labelled(host):
        if label:
            print(f"{label}:")
        print(src.memory_summary(abbreviated=not args.full), end="")


def do_stats(host: Host, args: Namespace) -> None:
    for label, src in _labelled(host):
        if label:
            print(f"{label}:")
        _print_stats(src.memory_stats(), args.json)


def _print_stats(raw: dict[str, int], as_json: bool) -> None:
    from collections import defaultdict

    stats: dict[str, int] = defaultdict(int, raw)  # PyTorch leaves keys out before use
    if as_json:
        print(json.dumps(stats, indent=1, sort_keys=True))
        return
    keys = ("allocated_bytes", "reserved_bytes", "requested_bytes", "inactive_split_bytes")
    rows = [(key, *(format_bytes(stats[f"{key}.all.{f}"]) for f in ("current", "peak")))
            for key in keys]
    rows += [(key, *(str(stats[f"{key}.all.{f}"]) for f in ("current", "peak")))
             for key in ("allocation", "segment", "inactive_split")]
    lines = [Table(("", "current", "peak"), rows, "<>>").text()]
    lines.append(f"allocations made {stats['allocation.all.allocated']}, freed "
                 f"{stats['allocation.all.freed']} · segments from the device "
                 f"{stats['num_device_alloc']}, returned {stats['num_device_free']} · "
                 f"retries {stats['num_alloc_retries']} · OOMs {stats['num_ooms']}")
    print("\n".join(lines))


def do_snapshot(host: Host, args: Namespace) -> None:
    from jupyter_gpumem.render.display import SnapshotView

    for label, src in _labelled(host):
        snap = src.snapshot()
        segments = snap["segments"]
        head = f"{label}: " if label else ""
        if not segments:
            print(f"{head}{len(segments)} segment(s), {format_bytes(src.memory_reserved())} "
                  f"reserved, {format_bytes(src.memory_allocated())} allocated")
            continue
        if label:
            print(f"{label}:")
        display(SnapshotView(snap, cell_files=host.ledger.cell_files,
                             holders=_holders(host, snap)))


def do_plot(host: Host, args: Namespace) -> None:
    from jupyter_gpumem.notebook.session_trace import session_timeline
    from jupyter_gpumem.render import plots

    torch = _torch()
    if torch is not None and not _cupy_on():
        _plot_torch(torch)
        return
    found = session_timeline(require_allocator(host))  # history and what traced cells recorded
    if isinstance(found, str):
        print(found)
        return
    snap, text = found
    display(Picture(plots.plot_timeline(snap, color_by="cell").figure, text,
                    alt=f"Plot of allocated and reserved GPU memory over the {text}; the "
                        "allocated area is split in bands by the cell that allocated it."))


def _plot_torch(torch: TorchSource) -> None:
    from jupyter_gpumem.render import plots

    snap = torch.snapshot()
    events = snap["device_traces"][torch.device_index] if snap["device_traces"] else []
    if not events:
        print("gpumem: PyTorch records no event history (torch.cuda.memory."
              "_record_memory_history); run it, or a %%gpumem_trace cell, then the cells to look "
              "at.")
        return
    text = f"timeline of {len(events)} events of PyTorch's allocator"
    display(Picture(plots.plot_timeline(snap, device=torch.device_index).figure, text,
                    alt=f"Plot of allocated and reserved GPU memory over the {text}."))


def do_cells(host: Host, args: Namespace) -> None:
    display(host.ledger.table())


def do_diff(host: Host, args: Namespace) -> None:
    try:
        a, b = (int(v) for v in args.values)
    except ValueError:
        raise usage_error(f"diff takes two cell numbers, got {' '.join(args.values)!r}"
                          ) from None
    # the sources read now (our allocator's states when none is: "kept: none")
    whose = [src.name for src in sources.current_sources()] or [DEFAULT_SOURCE]
    for name in whose:
        states = host.ledger.states_of(name)
        for cell in (a, b):
            if cell not in states:
                kept = ", ".join(str(c) for c in states) or "none"
                raise usage_error(f"no state recorded after cell {cell} (cells kept: {kept})")
    for name in whose:  # each says whose beside another's (Note [Whose row] in ledger)
        display(replace(host.ledger.diff(a, b, name), memory_source=source_label(name, whose)))


def do_processes(host: Host, args: Namespace) -> None:
    from jupyter_gpumem import api

    require_allocator(host)
    print(api.list_gpu_processes())
    b = api.memory_breakdown()
    parts = [f"{key.replace('_', ' ')} {format_bytes(value)}" for key, value in b.items()
             if isinstance(value, int) and key != "total"]
    print(f"of {format_bytes(int(b['total'] or 0))}: " + " · ".join(parts))


def do_info(host: Host, args: Namespace) -> None:
    from jupyter_gpumem import __version__
    from jupyter_gpumem.runtime import binding

    s = host.settings
    lines = [f"jupyter_gpumem {__version__} · backend {registry.backend()} · CuPy allocator "
             f"{'installed' if binding.installed() else 'not installed'}"]
    if host.gpu_reason:
        lines.append(f"GPU: none ({host.gpu_reason})")
    allocator = registry.current_allocator()
    if allocator is not None:
        free, total = allocator.device.mem_get_info()
        lines.append(f"device {allocator.device.index}: {allocator.device.name}, "
                     f"{format_bytes(total)} total, {format_bytes(free)} free")
        lines.append(f"allocator config: {allocator.config.as_text() or '(defaults)'}")
    lines.append(
        f"settings: record_history={s.record_history} stacks={s.stacks} "
        f"max_entries={s.max_entries} auto_footer={s.auto_footer} "
        f"keep_states={s.keep_states} keep_rows={s.keep_rows} live_view={s.live_view} "
        f"oom_panel={s.oom_panel}")
    lines.append(f"cells recorded: {host.ledger.recorded(every_source=True)}")
    print("\n".join(lines))


def do_dump(host: Host, args: Namespace) -> None:
    from jupyter_gpumem import api
    from jupyter_gpumem.data.files import save_snapshot
    from jupyter_gpumem.data.sites import with_cell_files
    from jupyter_gpumem.notebook.arguments import writable_path

    require_allocator(host)
    path = writable_path(args.values[0], "%gpumem", "dump", ("pickle", "json"),
                         "a .pickle/.pkl or .json path (.gz too)")
    # dump_snapshot's: the user's own save marks the trace, as PyTorch's; with the cells that
    # its frames name, so the file read elsewhere says "cell [5] line 2"
    snap = with_cell_files(api.snapshot(), host.ledger.cell_files)
    try:
        save_snapshot(snap, path)
    except OSError as exc:
        raise usage_error(f"dump: cannot write {path!r}: {exc.strerror or exc}") from None
    print(f"gpumem: snapshot saved to {path}")


def do_load(host: Host, args: Namespace) -> Any:
    from jupyter_gpumem.data.files import load_snapshot
    from jupyter_gpumem.render.trace_result import analyze

    path = os.path.expanduser(args.values[0])
    try:
        snap = load_snapshot(path)
    except ValueError as exc:  # SnapshotFileError ("FILE: what is wrong"), or a bad
        raise UsageError(f"%gpumem load: {exc}") from None  # JUPYTER_GPUMEM_LOAD_LIMITS
    # load_snapshot checked the fields and filled the keys older PyTorch versions leave out.
    try:
        return analyze(snap, cell_files=host.ledger.cell_files)
    except ValueError as exc:  # a trace its snapshot contradicts: the message names the field
        raise UsageError(f"%gpumem load: {path}: {exc}") from None
