"""``%gpumem replay [FILE|last|cupy|torch] [--config A ...] [--suggest] [--capacity SIZE]
[-o NAME]``, and the OOM explainer's offer of a config that would have fit.

A thin shell over ``whatif.compare``: ``compare`` shows the configs side by side (with no
``--config``, the recorded one and ``DEFAULT_GRID``), ``suggest_config`` searches the grid and
says how to use the config it found: the ``%gpumem config`` line and the environment variables
for our allocator, ``PYTORCH_CUDA_ALLOC_CONF`` for a PyTorch trace.

``cupy`` is what the session recorded on the current device: the allocator's own history when
it records every event, and the events of ``%%gpumem_trace`` cells (``session_trace``), as
``%gpumem plot`` shows them. ``torch`` is PyTorch's recorded history (``%gpumem history on``
turns it on under ``%gpumem source torch``), else the last ``%%gpumem_trace`` cell's. ``last``
is the source the views read; with both, the one whose out-of-memory error was explained last.
A FILE is a saved snapshot, ours or a PyTorch pickle. Every argument is checked before anything
runs; a replay changes nothing outside itself.
"""

from __future__ import annotations

import os
import time
from argparse import Namespace
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from jupyter_gpumem.data.sizes import MAX_ALLOC_SIZE
from jupyter_gpumem.data.units import format_bytes, parse_bytes
from jupyter_gpumem.engine.config import AllocatorConfig
from jupyter_gpumem.notebook.arguments import variable_name
from jupyter_gpumem.notebook.host import Host, require_allocator
from jupyter_gpumem.notebook.output import usage_error
from jupyter_gpumem.sources.cupy import CupySource, selected_allocator
from jupyter_gpumem.sources.torch import TorchSource, selected_torch

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.sources.protocol import MemorySource

__all__ = ["OFFER_BUDGET_S", "do_replay", "recorded_trace", "replay_offer"]

#: How long the OOM explainer may spend replaying (replay runs ~1.5 M events/s on the C core).
OFFER_BUDGET_S = 1.0


def recorded_trace(allocator: CachingAllocator) -> tuple[Snapshot, int] | str:
    """``(snapshot, events)`` of what the session recorded on ``allocator``'s device (as
    ``%gpumem plot`` shows it), or one line saying why there is nothing to replay. ``events``
    counts the trace as the replay does (the user's snapshot marks too, replayed as nothing);
    a trace of marks only is nothing to replay."""
    from jupyter_gpumem.notebook.session_trace import kept_cells, session_timeline

    history = allocator.history
    if history is not None and history.max_entries > 0 and not kept_cells(allocator):
        # the fast way for the usual case: no timeline to build; reading it logs no event, so
        # the panel's offer and every later replay count the same trace
        snapshot = allocator.snapshot(mark=False)
    else:
        found = session_timeline(allocator)
        if isinstance(found, str):
            return found.replace("no event history is recorded", "nothing to replay: no event "
                                 "history is recorded")
        snapshot, _caption = found
    trace = snapshot["device_traces"][allocator.device.index]
    if all(e["action"] == "snapshot" for e in trace):
        return "gpumem: nothing to replay: the history holds no events yet."
    return snapshot, len(trace)


def torch_recorded_trace(source: TorchSource) -> tuple[Snapshot, int] | str:
    """``(snapshot, events)`` of what PyTorch recorded: its history when it records, else the
    last ``%%gpumem_trace`` cell's; or one line saying why there is nothing to replay.

    PyTorch logs a "snapshot" entry at every read, ours too (``TorchSource.snapshot``). They
    replay as nothing, so they are left out: the panel's offer and every later replay count the
    same events, as the trace views of ``%%gpumem_trace`` do."""
    found = [source.snapshot()] if source.history_on() else []
    if source.last_trace is not None:
        found.append(source.last_trace)
    index = source.device_index
    for snapshot in found:
        traces = snapshot["device_traces"]
        kept = [e for e in (traces[index] if index < len(traces) else [])
                if e["action"] != "snapshot"]
        if kept:
            cut = [list(t) for t in traces]
            cut[index] = kept
            return {**snapshot, "device_traces": cut}, len(kept)
    return ("gpumem: nothing to replay: PyTorch has recorded no events; `%gpumem history on` "
            "records them, or trace a cell with `%%gpumem_trace`.")


def session_trace(host: Host, which: str = "last") -> Snapshot:
    """What ``which`` names: ``cupy`` (our allocator's session), ``torch`` (PyTorch's), or
    ``last``: the source the views read; with both, the one whose out-of-memory error was
    explained last, or the only one that recorded events. UsageError saying why otherwise."""
    torch = selected_torch()
    if which == "last":
        if torch is None:
            which = "cupy"
        elif selected_allocator() is None:
            which = "torch"
        elif getattr(host.last_oom, "source", None) in ("cupy", "torch"):
            which = host.last_oom.source
    if which == "torch":
        if torch is None:
            raise UsageError("gpumem: replay torch reads PyTorch's history: run "
                             "`%gpumem source torch` (or both) first.")
        found = torch_recorded_trace(torch)
    elif which == "cupy":
        found = recorded_trace(require_allocator(host))
    else:  # both sources, no error explained yet: the one that recorded something
        allocator = require_allocator(host)
        assert torch is not None
        both = [f for f in (recorded_trace(allocator), torch_recorded_trace(torch))
                if not isinstance(f, str)]
        if len(both) != 1:
            raise UsageError("gpumem: " + ("both CuPy and PyTorch recorded events: say which, "
                                          "`%gpumem replay cupy` or `%gpumem replay torch`."
                                          if both else "nothing to replay: neither CuPy nor "
                                          "PyTorch has recorded events; `%gpumem history on` "
                                          "records them."))
        found = both[0]
    if isinstance(found, str):
        raise UsageError(found)
    return found[0]


def _config(text: str) -> AllocatorConfig | None:
    """A ``--config`` value: ``recorded`` (None), ``defaults``, or ``key:value,...``."""
    if text.strip().lower() == "recorded":
        return None
    if text.strip().lower() in ("defaults", "default"):
        return AllocatorConfig()
    if not text.strip(" ,"):
        raise usage_error(f"replay: --config expects key:value,..., got {text!r}")
    try:
        return AllocatorConfig.parse(text)
    except (ValueError, TypeError) as exc:
        raise usage_error(f"replay: --config {text}: {exc}") from None


def do_replay(host: Host, args: Namespace) -> Any:
    """The checks, then ``compare`` or ``suggest_config``; returns what it shows."""
    from jupyter_gpumem.whatif.compare import compare, suggest_config
    from jupyter_gpumem.whatif.replay import prepare

    source = args.values[0] if args.values else "last"
    configs = [_config(text) for text in args.config or []]
    if args.suggest and configs:
        raise usage_error("replay: --suggest searches its own grid; give it no --config")
    capacity = None
    if args.capacity is not None:
        try:
            capacity = parse_bytes(args.capacity)
        except ValueError as exc:
            raise usage_error(f"replay: --capacity: {exc}") from None
        if not 0 < capacity <= MAX_ALLOC_SIZE:  # the largest device a replay simulates
            raise usage_error(f"replay: --capacity must be between 1 B and "
                              f"{format_bytes(MAX_ALLOC_SIZE)}, got {args.capacity!r}")
    from IPython.core import getipython

    current: Any = getipython.get_ipython
    shell = current()
    if args.output is not None:
        variable_name(args.output, "%gpumem", getattr(shell, "user_ns_hidden", ()))
    trace: Snapshot | str
    if source.lower() in ("last", "cupy", "torch"):
        trace = session_trace(host, source.lower())
    else:
        path = os.path.expanduser(source)
        if not os.path.exists(path):  # a folder or a pipe: the loader says what it is
            raise usage_error(f"replay: no such file {source!r} (or last, cupy, torch)")
        trace = path
    try:
        prepared = prepare(trace, capacity)
        result: Any = (suggest_config(prepared) if args.suggest
                       else compare(prepared, configs or None))
    except ValueError as exc:  # SnapshotFileError ("FILE: what is wrong") or a bad layout
        raise UsageError(f"%gpumem replay: {exc}") from None
    if args.output is not None and shell is not None:
        shell.user_ns[args.output] = result
    return result


def replay_offer(source: MemorySource | None, budget_s: float = OFFER_BUDGET_S) -> str | None:
    """What the OOM explainer says about replay: a config of the grid that would have fit
    the session's recorded trace of ``source`` (ours, or PyTorch's), with its peak reserved,
    the command that shows it and how to set it; None when nothing is recorded, the recorded
    config fits, no config tried fits, or the source's traces cannot be replayed."""
    if isinstance(source, TorchSource):
        found = torch_recorded_trace(source)
    elif isinstance(source, CupySource):
        found = recorded_trace(source.allocator)
    else:
        return None
    if isinstance(found, str):
        return None
    snapshot, events = found
    from jupyter_gpumem.whatif.compare import suggest_config
    from jupyter_gpumem.whatif.replay import prepare

    start = time.perf_counter()
    try:
        prepared = prepare(snapshot)
        spent = time.perf_counter() - start
        found_fit = suggest_config(prepared, budget_s=max(0.0, budget_s - spent))
    except (ValueError, TypeError, KeyError):
        return None  # a trace the replay cannot rebuild: say nothing about replay
    if not found_fit.improves or not found_fit.changes:
        return None
    best = found_fit.best
    assert best is not None
    sets = (f", `{found_fit.config_line}` sets it" if not found_fit.pytorch
            else f"; to use it, {found_fit.torch_setting()}")
    return (f"replaying this trace ({events} events) with `{found_fit.change_text}` would have "
            f"fit (peak reserved {format_bytes(best.peak_reserved)} instead of "
            f"{found_fit.instead()}): `%gpumem replay last --suggest` shows it{sets}.")
