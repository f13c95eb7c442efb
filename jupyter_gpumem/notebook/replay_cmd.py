"""``%gpumem replay [FILE|last|SOURCE] [--config A ...] [--suggest] [--capacity SIZE]
[-o NAME]``, and the OOM explainer's offer of a config that would have fit.

A thin shell over ``whatif.compare``: ``compare`` shows the configs side by side (with no
``--config``, the recorded one and ``DEFAULT_GRID``), ``suggest_config`` searches the grid and
says how to use the config it found: the ``%gpumem config`` line and the environment variables
for our allocator, ``PYTORCH_CUDA_ALLOC_CONF`` for a PyTorch trace.

The replay's input is one for every source (``recorded_trace``): what the session recorded on
it, as ``%gpumem plot`` shows it: its own history when it records every event, and the events
of ``%%gpumem_trace`` cells its history did not keep (``session_trace``). SOURCE is a source's
name (``cupy``, ``torch``, a third party's), selected or not; ``last`` is the source the views
read; with several, the one whose out-of-memory error was explained last, else the only one
that recorded events. A FILE is a saved snapshot, ours or a PyTorch pickle. Every argument is
checked before anything runs; a replay changes nothing outside itself.
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
from jupyter_gpumem.sources.registry import (
    SourceError,
    current_sources,
    get_source,
    selected,
    source,
    source_names,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.sources.protocol import MemorySource

__all__ = ["OFFER_BUDGET_S", "do_replay", "recorded_trace", "replay_offer"]

#: How long the OOM explainer may spend replaying (replay runs ~1.5 M events/s on the C core).
OFFER_BUDGET_S = 1.0


def recorded_trace(source: MemorySource) -> tuple[Snapshot, int] | str:
    """``(snapshot, events)`` of what the session recorded on ``source`` (as ``%gpumem plot``
    shows it: its history, and the events of ``%%gpumem_trace`` cells its history did not
    keep), or one line saying why there is nothing to replay. ``events`` counts the trace as
    the replay does: the user's own snapshot marks too (replayed as nothing), not those a
    source's reads log (``recorded_trace`` leaves them out: PyTorch logs one at every read, so
    the panel's offer and every later replay count the same events); a trace of marks only is
    nothing to replay."""
    from jupyter_gpumem.notebook.session_trace import history_mode, kept_cells, session_timeline

    index = source.device_index
    recording = history_mode(source) == "all"
    if recording and not kept_cells(source):
        # the usual case: the source's own history, no timeline to build
        found = source.recorded_trace()
        if isinstance(found, str):
            return "gpumem: nothing to replay: the history holds no events yet."
        snapshot = found
    elif not recording and not kept_cells(source):
        said = source.recorded_trace()
        if isinstance(said, str):  # what the source says, and how to record
            return "gpumem: nothing to replay: " + said.removeprefix("gpumem: ")
        snapshot = said
    else:
        timeline = session_timeline(source)
        if isinstance(timeline, str):
            return timeline.replace("no event history is recorded", "nothing to replay: no "
                                    "event history is recorded")
        snapshot, _caption = timeline
    traces = snapshot["device_traces"]
    trace = traces[index] if index < len(traces) else []
    if all(e["action"] == "snapshot" for e in trace):
        return "gpumem: nothing to replay: the history holds no events yet."
    return snapshot, len(trace)


def _replayable(host: Host, name: str) -> MemorySource:
    """The source ``name`` (selected or not: ``%gpumem replay cupy`` reads our allocator
    whatever the views read); UsageError saying why when it cannot be read."""
    if name == "cupy":
        require_allocator(host)  # no allocator: says how to get a simulated one
    try:
        found = source(name) or get_source(name)
        why = found.unavailable()
    except SourceError as exc:
        raise UsageError(f"gpumem: replay {name}: {exc}") from None
    if why is not None:
        raise UsageError(f"gpumem: replay {name}: {why}")
    return found


def _either(names: list[str]) -> str:
    said = [f"`%gpumem replay {n}`" for n in names]
    return ", ".join(said[:-1]) + f" or {said[-1]}" if len(said) > 1 else said[0]


def _neither(names: list[str]) -> str:
    return f"neither {names[0]} nor {names[1]}" if len(names) == 2 else (
        f"none of {', '.join(names)}")


def session_trace(host: Host, which: str = "last") -> Snapshot:
    """What ``which`` names: a source by its name (``cupy``, ``torch``, ``jax``, a third
    party's), or ``last``: the source the views read; with several, the one whose
    out-of-memory error was explained last, or the only one that recorded events. UsageError
    saying why otherwise."""
    if which != "last":
        found = recorded_trace(_replayable(host, which))
    else:
        picked = list(current_sources())
        if not picked:
            if "cupy" in selected():
                require_allocator(host)
            raise UsageError("gpumem: nothing to replay: none of the sources "
                             f"({', '.join(selected())}) can be read now.")
        last = getattr(host.last_oom, "source", None)
        named = [s for s in picked if s.name == last]
        if len(picked) == 1 or named:
            found = recorded_trace((named or picked)[0])
        else:  # several sources, no error of theirs explained yet: the one that recorded
            tried = [(s.name, recorded_trace(s)) for s in picked]
            both = [(n, f) for n, f in tried if not isinstance(f, str)]
            if len(both) != 1:
                names = [n for n, _ in tried]
                which_ones = (f"both {names[0]} and {names[1]}" if len(names) == 2
                              else ", ".join(names))
                raise UsageError(
                    f"gpumem: {which_ones} recorded events: say which, {_either(names)}."
                    if both else f"gpumem: nothing to replay: {_neither(names)} has recorded "
                    "events; `%gpumem history on` records them.")
            found = both[0][1]
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

    which = args.values[0] if args.values else "last"
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
    names = source_names()
    if which.lower() == "last" or which.lower() in names:
        trace = session_trace(host, which.lower())
    else:
        path = os.path.expanduser(which)
        if not os.path.exists(path):  # a folder or a pipe: the loader says what it is
            raise usage_error(f"replay: no such file {which!r} (or last, "
                              f"{', '.join(names)})")
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


def replay_offer(source: MemorySource | None,
                 budget_s: float = OFFER_BUDGET_S) -> str | None:
    """What the OOM explainer says about replay: a config of the grid that would have fit
    the session's recorded trace on ``source`` (``recorded_trace``), with its peak reserved,
    the command that shows it and how to set it (PyTorch's way for a PyTorch trace); None when
    nothing is recorded, the source's traces cannot be replayed (``replay_setting`` None), the
    recorded config fits, or no config tried fits."""
    if source is None or source.replay_setting() is None:
        return None
    found = recorded_trace(source)
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
