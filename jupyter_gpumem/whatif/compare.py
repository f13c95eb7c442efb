"""What if, side by side: one trace replayed under several configs, and a search for one that fits.

``compare(trace, configs)`` reads the trace once (``replay.prepare``) and replays it under each
config; the ``ReplayComparison`` shows a table (peak reserved and allocated, segments, retries,
OOMs, the first failed request, whether it fits) and one picture of reserved bytes over the trace,
one line per config (``render.replay_table``).

``suggest_config(trace)`` searches a small grid around the recorded config, single changes first:

- ``max_split_size_mb`` in {unset, 64, 128, 256, 512};
- ``roundup_power2_divisions`` in {unset, 4, 8, 16};
- ``garbage_collection_threshold`` in {unset, 0.6, 0.8}, only when the config sets a memory
  fraction (the threshold does nothing without one);
- ``expandable_segments`` switched (on, or off when the recording had it on): alone, after the
  other single changes (so a tie goes to a change of the policy's rounding or splitting), then
  combined with each ``roundup_power2_divisions`` value only (the rounding still decides block
  sizes inside a growing segment; the other keys' products would double the grid);

and proposes the config with the lowest peak reserved among those with no out-of-memory error;
ties go to the one that changes fewer keys of the recorded config, then to the first tried.
``budget_s`` bounds the search in time: the recorded config is always replayed, then the grid
until the next replay would end past the budget (``complete`` says whether all of it was tried).
"""

from __future__ import annotations

import html
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.units import check_seconds, format_bytes
from jupyter_gpumem.engine.config import ENV_VAR, AllocatorConfig
from jupyter_gpumem.render.replay_table import (
    ReplayRow,
    device_words,
    plot_replays,
    replay_alt,
    replay_table,
)
from jupyter_gpumem.whatif.replay import (
    UNLIMITED,
    Prepared,
    ReplayResult,
    as_config,
    prepare,
    run,
)

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot
    from jupyter_gpumem.render.table import Table

__all__ = ["DEFAULT_GRID", "SUGGEST_GRID", "ReplayComparison", "Suggestion", "compare",
           "config_label", "default_configs", "suggest_config", "suggestion_grid"]

ConfigLike = AllocatorConfig | str | dict[str, Any] | None

#: The values ``suggest_config`` tries per key (None: unset).
SUGGEST_GRID: dict[str, tuple[Any, ...]] = {
    "max_split_size_mb": (None, 64, 128, 256, 512),
    "roundup_power2_divisions": (None, 4, 8, 16),
    "garbage_collection_threshold": (None, 0.6, 0.8),  # only with a memory fraction
    "expandable_segments": (None, True),  # switched alone, and with each rounding
}
#: What ``compare`` shows beside the recorded config when given no configs: one key changed at
#: a time.
DEFAULT_GRID: tuple[dict[str, Any], ...] = (
    {"max_split_size_mb": 64}, {"max_split_size_mb": 128}, {"max_split_size_mb": 256},
    {"max_split_size_mb": 512}, {"roundup_power2_divisions": 4},
    {"roundup_power2_divisions": 8}, {"roundup_power2_divisions": 16},
    {"expandable_segments": True},
)
#: Said under a table with a config that has expandable segments on.
EXPANDABLE_NOTE = ("segments count classic segments only: an expandable segment is not counted "
                   "(as in PyTorch's segment.* stats); its mapped pages are in reserved")
#: The PyTorch variable takes the same ``key:value`` text, except the memory fraction (a call
#: there: ``torch.cuda.set_per_process_memory_fraction``).
TORCH_ENV_VAR = "PYTORCH_CUDA_ALLOC_CONF"


def config_label(config: AllocatorConfig) -> str:
    """``key:value,...``, or ``defaults`` (as ``--config defaults`` spells it)."""
    return config.as_text() or "defaults"


def _prepared(trace: Snapshot | str | os.PathLike[str] | Prepared, capacity: int | None,
              device: int | None) -> Prepared:
    if isinstance(trace, Prepared):
        return trace
    return prepare(trace, capacity, device=device)


# -- the comparison ------------------------------------------------------------------------------

@dataclass
class ReplayComparison:
    """Replays of one trace under several configs: plain data, a table and one picture."""

    results: list[ReplayResult]
    recorded: AllocatorConfig  # the config the trace was recorded under (or taken as)
    capacity: int  # bytes of the simulated device
    events: int
    notes: tuple[str, ...] = ()
    recorded_ooms: int = 0  # out-of-memory events in the trace
    outside: int = 0  # bytes of the device held outside the allocator
    _png: bytes | None = field(default=None, repr=False)

    def label(self, result: ReplayResult) -> str:
        text = config_label(result.config)
        return text + " (recorded)" if result.config == self.recorded else text

    def rows(self) -> list[ReplayRow]:
        """One plain row per replay, in order."""
        return [ReplayRow(self.label(r), r.peak_reserved, r.peak_allocated, r.num_segments,
                          r.peak_segments, r.num_alloc_retries, r.num_ooms, r.first_oom,
                          r.reserved) for r in self.results]

    def table(self) -> Table:
        return replay_table(self.rows())

    @property
    def device_bytes(self) -> int | None:
        """The simulated device's size, or None when unlimited (the trace did not say)."""
        return None if self.capacity >= UNLIMITED else self.capacity

    def heading(self) -> str:
        device = device_words(self.device_bytes, self.outside) or " on an unlimited device"
        n = len(self.results)
        return (f"gpumem replay: {self.events} events under {n} config{'s' if n != 1 else ''},"
                f"{device}")

    def all_notes(self) -> list[str]:
        """The trace's notes, and what the segment counts mean under expandable segments."""
        notes = list(self.notes)
        lost = unreproduced(self.recorded_ooms, self.results, self.recorded)
        if lost:
            notes.append(lost)
        if any(r.config.expandable_segments for r in self.results):
            notes.append(EXPANDABLE_NOTE)
        return notes

    def text(self) -> str:
        lines = [self.heading(), self.table().text(indent="  ")]
        lines += [f"note: {n}" for n in self.all_notes()]
        return "\n".join(lines)

    def alt(self) -> str:
        return replay_alt(self.rows(), self.events, self.device_bytes, self.outside)

    def figure(self) -> Any:
        """A matplotlib Figure of reserved bytes over the trace, one line per config."""
        return plot_replays(self.rows(), self.device_bytes, outside=self.outside,
                            caps=self.caps()).figure

    def caps(self) -> list[int | None]:
        """Each replay's cap on reserved bytes (its ``per_process_memory_fraction`` of the
        device), None where it has none or the device is unlimited."""
        return [None if r.config.per_process_memory_fraction is None or self.device_bytes is None
                else int(r.config.per_process_memory_fraction * self.capacity)
                for r in self.results]

    def png(self) -> bytes:
        """The picture as PNG bytes, drawn once."""
        if self._png is None:
            from jupyter_gpumem.render.display import figure_png

            self._png = figure_png(self.figure(), bbox_inches="tight")
        return self._png

    def shown_png(self) -> bytes | None:
        """The picture the display shows; None without matplotlib (the table says it all)."""
        try:
            return self.png()
        except ImportError:
            return None

    def html(self) -> str:
        from jupyter_gpumem.render.display import img_tag

        parts = [f"<p>{html.escape(self.heading())}</p>", self.table().html()]
        png = self.shown_png()
        if png is not None:
            parts.append(img_tag(png, self.alt()))
        parts += [f"<p>note: {html.escape(n)}</p>" for n in self.all_notes()]
        return "\n".join(parts)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from jupyter_gpumem.render.display import png_data

        return {"text/plain": self.text(), "text/html": self.html(),
                **png_data(self.shown_png())}


def unreproduced(recorded_ooms: int, results: Sequence[ReplayResult],
                 recorded: AllocatorConfig) -> str:
    """What to say when the trace records out-of-memory errors that its own config's replay
    does not meet (a limit the trace does not say), or ""."""
    own = next((r for r in results if r.config == recorded), None)
    if not recorded_ooms or own is None or not own.fits:
        return ""
    errors = "error" if recorded_ooms == 1 else "errors"
    return (f"the trace records {recorded_ooms} out-of-memory {errors} that its own config "
            "does not meet in this replay: the allocator had less room than the replayed "
            "device (give --capacity / capacity=) or a memory fraction the trace does not say "
            "(memory_fraction=)")


def default_configs(recorded: AllocatorConfig) -> list[AllocatorConfig]:
    """The recorded config, then ``DEFAULT_GRID``'s changes applied to it (each once)."""
    out = [recorded]
    for change in DEFAULT_GRID:
        config = recorded.with_values(**change)
        if config not in out:
            out.append(config)
    return out


def compare(trace: Snapshot | str | os.PathLike[str] | Prepared,
            configs: Sequence[ConfigLike] | None = None, capacity: int | None = None, *,
            device: int | None = None) -> ReplayComparison:
    """Replay ``trace`` (a snapshot dict, ours or PyTorch's, or a file) under each of
    ``configs`` (``AllocatorConfig``, ``"key:value,..."``, a dict, or None for the recorded
    one); with no configs, the recorded one and ``DEFAULT_GRID``. ``capacity``: the device's
    bytes (default: the recorded device's)."""
    if isinstance(configs, (str, dict, AllocatorConfig)):
        raise TypeError("configs must be a list of configs, not one config")
    prepared = _prepared(trace, capacity, device)
    if configs is None or len(configs) == 0:
        chosen = default_configs(prepared.recorded)
    else:
        chosen = [prepared.recorded if c is None else as_config(c) for c in configs]
    results = [prepared.run(c) for c in chosen]
    return ReplayComparison(results, prepared.recorded, prepared.capacity,
                            len(prepared.program), tuple(prepared.notes),
                            prepared.program.recorded_ooms, prepared.program.outside)


# -- the search ----------------------------------------------------------------------------------

def _changes(config: AllocatorConfig, base: AllocatorConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)
            if getattr(config, f.name) != getattr(base, f.name)}


def suggestion_grid(recorded: AllocatorConfig) -> list[AllocatorConfig]:
    """The configs ``suggest_config`` tries, the recorded one first, then by how many keys they
    change (one key at a time first)."""
    keys = ["max_split_size_mb", "roundup_power2_divisions"]
    if recorded.per_process_memory_fraction is not None:
        keys.append("garbage_collection_threshold")
    grid: list[AllocatorConfig] = [recorded]
    for values in itertools.product(*(SUGGEST_GRID[k] for k in keys)):
        config = recorded.with_values(**dict(zip(keys, values, strict=True)))
        if config not in grid:
            grid.append(config)
    switched = recorded.with_values(expandable_segments=None if recorded.expandable_segments
                                    else True)
    for divisions in SUGGEST_GRID["roundup_power2_divisions"]:
        config = switched.with_values(roundup_power2_divisions=divisions)
        if config not in grid:
            grid.append(config)
    keys.append("expandable_segments")

    def order(config: AllocatorConfig) -> tuple[int, list[int]]:
        changed = _changes(config, recorded)
        return len(changed), sorted(keys.index(k) for k in changed)

    return [grid[0], *sorted(grid[1:], key=order)]


@dataclass
class Suggestion:
    """What ``suggest_config`` found: the recorded config's replay, the best, all it tried."""

    baseline: ReplayResult  # under the recorded config
    best: ReplayResult | None  # the lowest peak reserved with no OOM; None: none fits
    tried: list[ReplayResult]
    grid_size: int
    recorded: AllocatorConfig
    capacity: int
    events: int
    notes: tuple[str, ...] = ()
    #: peak reserved of the recorded config on a device with no limit, when it fails on this
    #: one: what the program needs under it
    baseline_need: int | None = None
    recorded_ooms: int = 0  # out-of-memory events in the trace
    pytorch: bool = False  # a PyTorch trace: its config is set through PyTorch's variable

    @property
    def complete(self) -> bool:
        """Whether the whole grid was tried (the time budget may stop it early)."""
        return len(self.tried) >= self.grid_size

    @property
    def improves(self) -> bool:
        """Whether the best config avoids an OOM the recorded one hit."""
        return self.best is not None and not self.baseline.fits

    @property
    def changes(self) -> dict[str, Any]:
        """The keys the best config changes, from the recorded one."""
        return {} if self.best is None else _changes(self.best.config, self.recorded)

    @property
    def change_text(self) -> str:
        """``max_split_size_mb:64`` (``none`` for a key it unsets)."""
        return ",".join(f"{k}:{'none' if v is None else v}" for k, v in self.changes.items())

    @property
    def config_line(self) -> str:
        """The ``%gpumem config ...`` line that sets the best config, or ""."""
        return f"%gpumem config {self.change_text}" if self.changes else ""

    def env_values(self) -> list[tuple[str, str]]:
        """``(variable, value)`` that give the best config to a new process."""
        if self.best is None:
            return []
        config = self.best.config
        torch = config.with_values(per_process_memory_fraction=None).as_text()
        return [(TORCH_ENV_VAR, torch), (ENV_VAR, config.as_text())]

    def comparison(self) -> ReplayComparison:
        """The recorded config and the best side by side (the recorded one alone if none
        fits)."""
        shown = [self.baseline] + ([self.best] if self.best is not None
                                   and self.best is not self.baseline else [])
        return ReplayComparison(shown, self.recorded, self.capacity, self.events, self.notes,
                                self.recorded_ooms, self.baseline.outside)

    def lines(self) -> list[str]:
        """The verdict in words, then how to use it."""
        b = self.baseline
        tried = (f"{len(self.tried)} of {self.grid_size} configs tried"
                 + ("" if self.complete else " (stopped by the time budget)"))
        fitting = sum(r.fits for r in self.tried)
        if self.best is None:
            more = ""
            if self.baseline_need is not None and self.baseline_need > self.capacity:
                more = (f" The recorded config needs {format_bytes(self.baseline_need)}: it "
                        f"would fit with {format_bytes(self.baseline_need - self.capacity)} "
                        f"more memory than the {format_bytes(self.capacity)} the replay had.")
            return [f"gpumem replay --suggest: no config tried avoids the out-of-memory error "
                    f"({tried}); the request at event {b.first_oom} fails under each.{more}"]
        best = self.best
        if best is b or not self.changes:
            if unreproduced(self.recorded_ooms, [b], self.recorded):
                return [f"gpumem replay --suggest: the recorded config ({config_label(b.config)}) "
                        f"does not meet the trace's out-of-memory error in this replay, so "
                        f"there is nothing to compare against ({tried}); see the note below."]
            return [f"gpumem replay --suggest: the recorded config ({config_label(b.config)}) "
                    f"fits with the lowest peak reserved, {format_bytes(b.peak_reserved)} "
                    f"({tried}, {fitting} fit)."]
        if b.fits:
            verdict = (f"fits with peak reserved {format_bytes(best.peak_reserved)} instead of "
                       f"{format_bytes(b.peak_reserved)}")
        else:
            verdict = (f"would have fit: peak reserved {format_bytes(best.peak_reserved)} "
                       f"instead of {self.instead()} (the recorded config fails at event "
                       f"{b.first_oom})")
        lines = [f"gpumem replay --suggest: {self.change_text} {verdict}; {tried}, "
                 f"{fitting} fit."]
        if self.pytorch:
            return lines + self.torch_lines()
        lines.append(f"  in this session:  {self.config_line}")
        for name, value in self.env_values():
            lines.append(f"  a new process:    {name}={value}" if value else
                         f"  a new process:    leave {name} unset")
        return lines

    def torch_setting(self) -> str:
        """How PyTorch gets the best config: its variable, set before it first allocates."""
        value = dict(self.env_values()).get(TORCH_ENV_VAR, "")
        if not value:
            return f"leave {TORCH_ENV_VAR} unset when PyTorch starts"
        return (f"restart the kernel and run `%env {TORCH_ENV_VAR}={value}` before "
                "`import torch` (PyTorch reads it once, when it first allocates)")

    def torch_lines(self) -> list[str]:
        """How to use the best config, for a PyTorch trace."""
        name, value = TORCH_ENV_VAR, dict(self.env_values()).get(TORCH_ENV_VAR, "")
        return [f"  PyTorch, in a notebook: {self.torch_setting()}",
                f"  PyTorch, a new process: {name}={value}" if value else
                f"  PyTorch, a new process: leave {name} unset"]

    def instead(self) -> str:
        """What the recorded config reserves, in words: what it needs on an unlimited device
        when it fails here, else its peak."""
        if self.baseline_need is not None and self.baseline_need > self.baseline.peak_reserved:
            return f"the {format_bytes(self.baseline_need)} it needs"
        return format_bytes(self.baseline.peak_reserved)

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n" + self.comparison().text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from jupyter_gpumem.render.display import png_data

        head = "".join(f"<p>{html.escape(line)}</p>" if not line.startswith("  ") else
                       f"<pre>{html.escape(line.strip())}</pre>" for line in self.lines())
        shown = self.comparison()  # one comparison: its picture drawn once, for both
        return {"text/plain": self.text(), "text/html": head + "\n" + shown.html(),
                **png_data(shown.shown_png())}


def suggest_config(trace: Snapshot | str | os.PathLike[str] | Prepared,
                   capacity: int | None = None, *, device: int | None = None,
                   budget_s: float | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> Suggestion:
    """Search ``suggestion_grid`` for the config with the lowest peak reserved that has no
    out-of-memory error; ``budget_s`` bounds the time spent replaying (None: no bound)."""
    if budget_s is not None:
        budget_s = check_seconds("budget_s", budget_s, least_ok=True)
    prepared = _prepared(trace, capacity, device)
    grid = suggestion_grid(prepared.recorded)
    start = clock()
    tried: list[ReplayResult] = []
    slowest = 0.0
    for config in grid:
        now = clock()
        if tried and budget_s is not None and now - start + slowest > budget_s:
            break
        tried.append(prepared.run(config))
        slowest = max(slowest, clock() - now)
    baseline = tried[0]
    fitting = [(r.peak_reserved, len(_changes(r.config, prepared.recorded)), i)
               for i, r in enumerate(tried) if r.fits]
    best = tried[min(fitting)[2]] if fitting else None
    need = None
    if not baseline.fits and prepared.capacity < UNLIMITED:
        need = run(prepared.program, prepared.recorded, UNLIMITED).peak_reserved
    return Suggestion(baseline, best, tried, len(grid), prepared.recorded, prepared.capacity,
                      len(prepared.program), tuple(prepared.notes), need,
                      prepared.program.recorded_ooms, prepared.program.inferred_empty_cache)
