"""The ``%gpumem`` subcommands: one table, ``SUBCOMMANDS``, that everything else is read from.

Each ``Subcommand`` row names the subcommand, its usage and one line of help, how many values it
takes, which of the magic's flags apply to it, and the ``do_<name>`` function that does it
(``readouts`` for the ones that only show, ``controls`` for the ones that change something). From
the table come:

- ``check``: the arity and the allowed flags, as one-line ``UsageError``\\ s;
- ``find``: the "unknown subcommand ...; one of ..." error;
- the dispatch: ``sub.handler(host, args)``;
- ``description``: the list that ``%gpumem?`` shows.

A bare ``%gpumem`` is the ``STATUS`` row, which is not in the table (the user cannot type it).
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.notebook import cluster, controls, forget, readouts, replay_cmd, torch_cmd
from jupyter_gpumem.notebook.host import Host
from jupyter_gpumem.notebook.output import usage_error

__all__ = ["STATUS", "SUBCOMMANDS", "Handler", "Subcommand", "check", "description", "find"]

Handler = Callable[[Host, Namespace], Any]


@dataclass(frozen=True)
class Subcommand:
    """One ``%gpumem`` subcommand."""

    name: str  # what the user types after %gpumem
    usage: str  # what may follow the name: values and flags, as in "A B" for diff
    help: str  # what it does, in one line
    handler: Handler  # does it: handler(host, parsed arguments) -> what the magic returns
    arity: tuple[int, int | None] = (0, 0)  # fewest and most values; None: no most
    flags: tuple[str, ...] = ()  # the magic's options that apply, by argparse dest

    @property
    def synopsis(self) -> str:
        """The name and its usage, as ``%gpumem?`` lists it."""
        return f"{self.name} {self.usage}".rstrip()


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("summary", "[--full]", "PyTorch's memory_summary table", readouts.do_summary,
               flags=("full",)),
    Subcommand("stats", "[--json]", "the memory_stats counters", readouts.do_stats,
               flags=("json",)),
    Subcommand("snapshot", "", "block layout of every segment (a picture)", readouts.do_snapshot),
    Subcommand("plot", "", "timeline of the session so far (needs history)", readouts.do_plot),
    Subcommand("cells", "", "the per-cell ledger", readouts.do_cells),
    Subcommand("diff", "A B", "blocks new and freed between the ends of cells A and B",
               readouts.do_diff, arity=(2, 2)),
    Subcommand("reset-peak", "", "reset the peak counters", controls.do_reset_peak),
    Subcommand("empty-cache", "", "give cached whole segments back to the device",
               controls.do_empty_cache),
    Subcommand("forget-error", "", "free what the last error's traceback keeps alive "
               "(its frames' locals)", forget.do_forget_error),
    Subcommand("config", "[KEY:VALUE,...]", "show or change the allocator options",
               controls.do_config, arity=(0, None)),
    Subcommand("limit", "FRACTION|SIZE|none",
               "cap reserved memory: a fraction in [0, 1] or e.g. 40GiB", controls.do_limit,
               arity=(1, 1)),
    Subcommand("history", "[on|state|off] [--stacks/--no-stacks] [--max-entries N|SIZE]",
               "on: every event (timelines, replay); state: the lines of live blocks only; "
               "off: nothing; bare: what is recorded, and the ring's bytes",
               controls.do_history, arity=(0, 1),
               flags=("stacks", "max_entries")),
    Subcommand("processes", "", "processes using the GPU, and where memory is",
               readouts.do_processes),
    Subcommand("info", "", "backend, device, settings", readouts.do_info),
    Subcommand("dump", "PATH", "save a snapshot (.pickle for PyTorch's viewer, or .json)",
               readouts.do_dump, arity=(1, 1)),
    Subcommand("load", "PATH", "show a saved snapshot (ours or PyTorch's pickle)",
               readouts.do_load, arity=(1, 1)),
    Subcommand("replay",
               "[FILE|last|SOURCE] [--config A ...] [--suggest] [--capacity SIZE] "
               "[--output NAME]",
               "replay a recorded trace under other allocator configs, side by side; "
               "--suggest finds one that fits", replay_cmd.do_replay, arity=(0, 1),
               flags=("config", "suggest", "capacity", "output")),
    Subcommand("auto", "on|off", "a one-line footer after each cell", controls.do_auto,
               arity=(1, 1)),
    Subcommand("device", "sim|cuda [--capacity SIZE]", "a simulated device, or the GPUs",
               controls.do_device, arity=(1, 1), flags=("capacity",)),
    Subcommand("source", "[NAME...]",
               "which sources the views read: names (cupy, torch, jax, a package's), both "
               "(cupy and torch) or all (every one readable here); bare: each one and what it "
               "shows",
               controls.do_source, arity=(0, None)),
    Subcommand("torch", "[share]",
               "share: PyTorch allocates from the same cache as CuPy (before PyTorch's first "
               "CUDA call); bare: whether it does", torch_cmd.do_torch, arity=(0, 1)),
    Subcommand("cluster", "[--interval SECONDS] [--no-live] [--stop]",
               "the workers of the current Dask client: a table and a live heat strip",
               cluster.do_cluster, flags=("interval", "live", "stop")),
)

#: A bare ``%gpumem``: the one-line status, and the live view when ``live_view`` is on.
STATUS = Subcommand("status", "", "a one-line status, and the live view", readouts.do_status)

_BY_NAME = {sub.name: sub for sub in SUBCOMMANDS}
_WIDTH = 26  # of the synopsis column in the list


def find(name: str | None, values: list[str]) -> Subcommand:
    """The row of ``name`` (``STATUS`` for none); a UsageError for an unknown one."""
    if name is None:
        if values:
            raise usage_error("values given without a subcommand")
        return STATUS
    sub = _BY_NAME.get(name)
    if sub is None:
        raise usage_error(f"unknown subcommand {name!r}; one of {', '.join(_BY_NAME)}")
    return sub


def check(sub: Subcommand, args: Namespace, defaults: Mapping[str, Any]) -> None:
    """A UsageError unless ``args`` give ``sub`` only its own flags and a number of values in
    its arity. ``defaults`` are the parser's defaults by dest: a flag is given when its value
    differs from its default."""
    for dest, default in defaults.items():
        value = getattr(args, dest)
        if value != default and dest not in sub.flags:
            negated = value is False and default is None  # --no-x of a --x/--no-x pair
            option = ("--no-" if negated else "--") + dest.replace("_", "-")
            raise usage_error(f"{option} does not apply to {sub.name!r}")
    low, high = sub.arity
    n = len(args.values)
    if n < low or (high is not None and n > high):
        want = f"{low}" if low == high else f"{low} to {high if high is not None else 'any'}"
        raise usage_error(f"{sub.name} takes {want} argument(s), got {n}")


def description() -> str:
    """What ``%gpumem?`` says above the options: the subcommands, one a line, with their help."""
    lines = ["Where GPU memory goes: status, stats, pictures, the per-cell ledger and settings.",
             "", "Subcommands:"]
    for sub in SUBCOMMANDS:
        if len(sub.synopsis) <= _WIDTH - 2:
            lines.append(f"  {sub.synopsis:<{_WIDTH}}{sub.help}")
        else:  # too wide for its column: the help goes under it
            lines += [f"  {sub.synopsis}", " " * (_WIDTH + 2) + sub.help]
    lines += ["", "With no subcommand: " + STATUS.help + ".", "",
              "To trace one cell (its timeline, layout, top lines, what survives), start it",
              "with %%gpumem_trace (see %%gpumem_trace?).", "",
              "Every subcommand has a plain-Python form in ``jupyter_gpumem`` (memory_summary,",
              "memory_stats, empty_cache, set_per_process_memory_fraction, ...)."]
    return "\n".join(lines)
