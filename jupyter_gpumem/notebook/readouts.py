"""The ``%gpumem`` subcommands that show something and change nothing: the status line,
summary, stats, snapshot, plot, cells, diff, processes, info, and the snapshot files (dump, load).

Each ``do_<name>(host, args)`` gets the loaded extension (``Host``) and the parsed, checked
arguments (``subcommands`` checked the arity and flags); each is a plain call underneath (``api``,
a ``MemorySource``, ``Ledger``, ``data.files``) plus its text or picture. The views loop over the
sources picked (``%gpumem source``) that can be read now, one labelled part a source
("cupy: ...", "torch: ...") when there are several.
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
from jupyter_gpumem.notebook.host import (
    Host,
    no_gpu_message,
    require_allocator,
    require_sources,
    unreadable_sources,
)
from jupyter_gpumem.notebook.ledger import DEFAULT_SOURCE, source_label
from jupyter_gpumem.notebook.output import Picture, StatusLine, display, usage_error
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.runtime import registry

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.sources import MemorySource, Status

__all__ = ["do_cells", "do_diff", "do_dump", "do_info", "do_load", "do_plot", "do_processes",
           "do_snapshot", "do_stats", "do_status", "do_summary", "status_line"]


def do_status(host: Host, args: Namespace) -> None:
    """The status line (an output of its own: a frontend that draws our views still shows it),
    the block layout as the cell ran of the first source that has segments, and the live
    view."""
    display(StatusLine(status_line(host)))
    several = len(sources.selected()) > 1
    for src in sources.current_sources():
        snapshot = src.snapshot()  # the layout now: segments only, no trace to carry
        if not snapshot["segments"]:
            continue
        from jupyter_gpumem.render.display import SnapshotView

        snapshot["device_traces"] = [[] for _ in snapshot["device_traces"]]
        cell = host.ledger.running
        when = f"cell [{cell}]" if cell is not None else "this cell"
        title = f"block layout when {when} ran (%gpumem snapshot shows it now)"
        display(SnapshotView(snapshot, title=f"{src.name}: {title}" if several else title,
                             cell_files=host.ledger.cell_files,
                             holders=_holders(host, snapshot)))
        break
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


# -- the status line ---------------------------------------------------------------------------

def status_line(host: Host) -> str:
    """What a bare ``%gpumem`` shows: for each source picked, its backend, device, allocated,
    reserved, device free, history, cells recorded and notes; one labelled row a source when
    several are picked ("cupy: ...", "torch: ..."). A source that cannot be read says why."""
    picked = sources.selected()
    readable = {src.name: src for src in sources.current_sources()}
    if not readable and _no_gpu(host):  # the machine's reason, not a source's
        return f"gpumem: {no_gpu_message(host)}; %gpumem device sim to try it on a simulated device"
    why = dict(unreadable_sources(picked))
    lines = []
    for name in picked:
        src = readable.get(name)
        line = f"gpumem: {why.get(name, 'not readable now')}" if src is None else (
            _source_line(host, src, alone=len(picked) == 1))
        lines.append(line if len(picked) == 1 else f"{name}: {line}")
    return "\n".join(lines)


def _source_line(host: Host, src: MemorySource, *, alone: bool) -> str:
    """One source's status line; "cannot read" with the error when the source raises."""
    try:
        status = src.status()
    except Exception as exc:  # a library that cannot be read now (PyTorch without a GPU)
        return f"gpumem · {src.name}: cannot read {src.title} ({exc})"
    # a line alone counts the whole ledger (as %gpumem info); labelled rows their own rows
    cells = host.ledger.recorded(every_source=True) if alone else _rows_of(host, src)
    parts = [_numbers(status), status.history, f"{cells} cells recorded", *status.notes]
    if hasattr(src, "releasable_bytes"):  # a source that can say what empty_cache gives back
        hint = host.ledger.cache_hint_now()
        if hint:
            parts.append(hint)
    return " · ".join(parts)


def _numbers(st: Status) -> str:
    text = (f"gpumem · {st.backend} device {st.device} ({st.device_name}) · allocated "
            f"{format_bytes(st.allocated)} (peak {format_bytes(st.peak)}) · reserved "
            f"{format_bytes(st.reserved)}")
    if st.device_free is not None and st.device_total is not None:
        text += f" · device free {format_bytes(st.device_free)} of {format_bytes(st.device_total)}"
    return text


def _rows_of(host: Host, src: MemorySource) -> int:
    """The ledger's rows of ``src``."""
    return host.ledger.recorded(src.name)


def _no_gpu(host: Host) -> bool:
    """Whether the host found no GPU and no simulated device is in use."""
    return host.gpu_reason is not None and registry.no_gpu()


# -- the live view -----------------------------------------------------------------------------

def _start_live(host: Host) -> None:
    """Note [One live view]: a bare ``%gpumem`` samples the first source that can be read."""
    if not host.settings.live_view:
        return
    from jupyter_gpumem.notebook.live_view import live_session

    src = next(sources.current_sources(), None)
    if src is None:
        return
    host.stop_live()
    several = len(sources.selected()) > 1
    session = live_session(src, title=f"({src.name})" if several else "")
    if session is not None:  # without a widget the status line is enough
        host.live = session


# Note [One live view]: with several sources picked, a bare ``%gpumem`` shows one live widget,
# of the first source that can be read (titled "gpumem live view (cupy)"), not one a source:
# ``Host.live`` is one session, each widget has a sampler thread of its own, and two curves of
# the same device side by side say less than the status line above them, which gives every
# source's numbers. ``%gpumem source torch`` picks the one to follow.


# -- summary, stats, snapshot, plot ------------------------------------------------------------

def _labelled(host: Host) -> list[tuple[str, MemorySource]]:
    """``(label, source)`` of the sources picked that can be read now, in order; the label is
    "" when there is one. A UsageError when none can be read."""
    found = require_sources(host)
    return [("" if len(found) == 1 else src.name, src) for src in found]


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
    """The session's timeline of each source: what its history and its traced cells recorded
    (``session_trace``), bands by cell where the events carry their cell."""
    from jupyter_gpumem.notebook.session_trace import session_timeline
    from jupyter_gpumem.render import plots

    for label, src in _labelled(host):
        head = f"{label}: " if label else ""
        found = session_timeline(src)
        if isinstance(found, str):
            print(f"{head}{found}")
            continue
        snap, text = found
        device = src.device_index
        traces = snap["device_traces"]
        by_cell = any("cell" in e for e in (traces[device] if device < len(traces) else []))
        figure = plots.plot_timeline(snap, device=device,
                                     color_by="cell" if by_cell else "site").figure
        alt = f"Plot of allocated and reserved GPU memory over the {text}"
        display(Picture(figure, f"{head}{text}",
                        alt=alt + ("; the allocated area is split in bands by the cell that "
                                   "allocated it." if by_cell else ".")))


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
    from jupyter_gpumem._version import __version__
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
    path = writable_path(args.values[0], "%gpumem", "dump", ("gpumem", "pickle", "json"),
                         "a .gpumem, .pickle/.pkl or .json path (.gz too)")
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
        result = analyze(snap, cell_files=host.ledger.cell_files)
    except ValueError as exc:  # a trace its snapshot contradicts: the message names the field
        raise UsageError(f"%gpumem load: {path}: {exc}") from None
    result.full_trace = args.values[0]  # every event is there: its views name the file
    return result
