"""What each ``%gpumem`` subcommand does, and the small display objects it shows.

``magics`` parses and checks the arguments, then calls ``_do_<subcommand>(args)`` here. Each is a
plain call underneath (``api``, ``CachingAllocator``, ``Ledger``, ``data.files``) plus its text or
picture.
"""

from __future__ import annotations

import io
import json
import os
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from jupyter_gpumem.data.units import format_bytes, parse_bytes
from jupyter_gpumem.notebook.ledger import current_allocator
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.runtime import registry

if TYPE_CHECKING:
    from jupyter_gpumem.engine.allocator import CachingAllocator
    from jupyter_gpumem.notebook.extension import Extension

#: The largest byte count (or count) the allocator cores hold: a signed 64-bit integer.
_LARGEST_BYTES = (1 << 63) - 1


def display(obj: Any) -> None:
    """IPython's ``display`` (untyped), given a type once, here."""
    from IPython import display as ipython_display

    show: Any = ipython_display.display
    show(obj)


class _Picture:
    """A matplotlib figure as text/plain + image/png."""

    def __init__(self, fig: Any, text: str) -> None:
        self.fig = fig
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png", dpi=80)
        return {"text/plain": self.text, "image/png": buf.getvalue()}


class _Status:
    """The one-line status as text/plain."""

    def __init__(self, line: str) -> None:
        self.line = line

    def __repr__(self) -> str:
        return self.line

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.line}


class Subcommands:
    """The ``_do_*`` methods of ``GpuMemMagics``, one per ``%gpumem`` subcommand."""

    ext: Extension

    def _usage(self, message: str) -> UsageError:
        """A UsageError with the usage text; ``GpuMemMagics`` builds it from its parser."""
        raise NotImplementedError

    def _allocator(self) -> CachingAllocator:
        allocator = current_allocator()
        if allocator is None:
            reason = self.ext.gpu_reason or "no CUDA device is visible"
            raise UsageError(f"jupyter_gpumem: no GPU here ({reason}); run %gpumem device sim "
                             "to use a simulated device.")
        return allocator

    def _do_status(self, args: Any) -> Any:
        display(_Status(self.status_line()))
        self._start_live()
        return None

    def status_line(self) -> str:
        allocator = current_allocator()
        if allocator is None:
            reason = self.ext.gpu_reason or "no CUDA device is visible"
            return (f"gpumem: no GPU here ({reason}); %gpumem device sim to try it on a "
                    "simulated device")
        st = allocator.stats
        free, total = allocator.device.mem_get_info()
        from jupyter_gpumem.notebook.advice import history_words

        hint = self.ext.ledger.cache_hint_now()
        return (f"gpumem · {registry.backend()} device {allocator.device.index} "
                f"({allocator.device.name}) · allocated "
                f"{format_bytes(st.allocated_bytes.all.current)} "
                f"(peak {format_bytes(st.allocated_bytes.all.peak)}) · reserved "
                f"{format_bytes(allocator.memory_reserved())} · device free "
                f"{format_bytes(free)} of {format_bytes(total)} · "
                f"{history_words(allocator.history)} · {len(self.ext.ledger.rows)} cells recorded"
                + (f" · {hint}" if hint else ""))

    def _start_live(self) -> None:
        if not self.ext.settings.live_view:
            return
        from jupyter_gpumem.notebook.trace import live_session

        allocator = current_allocator()
        if allocator is None:
            return
        self.ext.stop_live()
        session = live_session(allocator)
        if session is not None:  # without a widget the status line is enough
            self.ext.live = session

    def _do_summary(self, args: Any) -> None:
        print(self._allocator().memory_summary(abbreviated=not args.full), end="")

    def _do_stats(self, args: Any) -> None:
        stats = self._allocator().memory_stats()
        if args.json:
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

    def _do_snapshot(self, args: Any) -> Any:
        allocator = self._allocator()
        snap = allocator.snapshot()
        segments = snap["segments"]
        text = (f"{len(segments)} segment(s), {format_bytes(allocator.memory_reserved())} "
                f"reserved, {format_bytes(allocator.memory_allocated())} allocated")
        from jupyter_gpumem.render.display import SnapshotView

        if not segments:
            print(text)
            return None
        display(SnapshotView(snap))
        return None

    def _do_plot(self, args: Any) -> Any:
        from jupyter_gpumem.render import plots

        allocator = self._allocator()
        if allocator.history is None or allocator.history.max_entries == 0:
            print("gpumem: no event history is recorded; run %gpumem history on, then the "
                  "cells to look at.")
            return None
        snap = allocator.snapshot()
        trace = snap["device_traces"][allocator.device.index]
        text = f"timeline of {len(trace)} events"
        display(_Picture(plots.plot_timeline(snap, color_by="cell").figure, text))
        return None

    def _do_cells(self, args: Any) -> Any:
        display(self.ext.ledger.table())
        return None

    def _do_diff(self, args: Any) -> Any:
        try:
            a, b = (int(v) for v in args.values)
        except ValueError:
            raise self._usage(f"diff takes two cell numbers, got {' '.join(args.values)!r}"
                              ) from None
        for cell in (a, b):
            if cell not in self.ext.ledger.states:
                kept = ", ".join(str(c) for c in self.ext.ledger.states) or "none"
                raise self._usage(f"no state recorded after cell {cell} (cells kept: {kept})")
        display(self.ext.ledger.diff(a, b))
        return None

    def _do_reset_peak(self, args: Any) -> None:
        self._allocator().reset_peak_memory_stats()
        print("gpumem: peak stats reset")

    def _do_empty_cache(self, args: Any) -> None:
        self._allocator()
        released = sum(a.empty_cache() for a in registry.allocators().values())
        print(f"gpumem: released {format_bytes(released)} of cached segments to the device")

    def _do_config(self, args: Any) -> None:
        allocator = self._allocator()
        if not args.values:
            print(f"gpumem config: {allocator.config.as_text() or '(defaults)'}")
            return
        if not all(v.strip(" ,") for v in args.values):
            raise self._usage(f"config: expected key:value, got {' '.join(args.values)!r}")
        text = ",".join(args.values)
        try:
            config = allocator.config.updated(text)
        except (ValueError, TypeError) as exc:
            raise self._usage(f"config: {exc}") from None
        for key, value, most in (
                ("max_split_size_mb", config.max_split_size_mb, _LARGEST_BYTES >> 20),
                ("roundup_power2_divisions", config.roundup_power2_divisions, _LARGEST_BYTES)):
            if value is not None and value > most:
                raise self._usage(f"config: {key} must be at most {most}, got {value}")
        targets = list({id(a): a for a in (allocator, *registry.allocators().values())}.values())
        before = [a.config for a in targets]
        try:
            for other in targets:
                other.set_config(config)
        except (ValueError, TypeError, OverflowError) as exc:
            for other, old in zip(targets, before, strict=True):  # all or nothing
                other.set_config(old)
            raise self._usage(f"config: {exc}") from None
        registry.set_default_config(config)
        print(f"gpumem config: {config.as_text() or '(defaults)'}")

    def _do_limit(self, args: Any) -> None:
        allocator = self._allocator()
        text = args.values[0]
        total = allocator.device.mem_get_info()[1]
        fraction: float | None
        if text.lower() in ("none", "off"):
            fraction = None
        else:
            try:
                fraction = float(text)
            except ValueError:
                try:
                    size = parse_bytes(text)
                except ValueError as exc:
                    raise self._usage(f"limit: {exc}") from None
                if size <= 0 or size > total:
                    raise self._usage(f"limit: {text} is not between 0 and the device's "
                                      f"{format_bytes(total)}") from None
                fraction = size / total
            else:
                if not 0.0 <= fraction <= 1.0:
                    raise self._usage(f"limit: a fraction must be in [0, 1], got {text}")
        allocator.set_memory_fraction(fraction)
        if fraction is None:
            print("gpumem: no limit on reserved memory")
        else:
            print(f"gpumem: reserved memory capped at {format_bytes(int(fraction * total))} "
                  f"({fraction:.3g} of {format_bytes(total)})")

    def _do_history(self, args: Any) -> None:
        mode = args.values[0].lower()
        modes = {"on": "all", "all": "all", "state": "state", "off": "off"}
        if mode not in modes:
            raise self._usage(f"history takes on, state or off, got {args.values[0]!r}")
        if args.max_entries is not None and args.max_entries < 1:
            raise self._usage(f"--max-entries must be >= 1, got {args.max_entries}")
        allocator = self._allocator()
        s = self.ext.settings
        # Everything is checked (the parser bounds --max-entries): now change all of it at once.
        with s.hold_trait_notifications():
            s.record_history = modes[mode]
            if args.stacks is not None:
                s.stacks = args.stacks
            if args.max_entries is not None:
                s.max_entries = args.max_entries
        for other in {id(a): a for a in (allocator, *registry.allocators().values())}.values():
            self.ext.apply_history(other)
        detail = "" if s.record_history == "off" else (
            f" (stacks {'on' if s.stacks else 'off'}"
            + (f", up to {s.max_entries} events)" if s.record_history == "all" else ")"))
        print(f"gpumem: history {s.record_history}{detail}")

    def _do_processes(self, args: Any) -> None:
        from jupyter_gpumem import api

        self._allocator()
        print(api.list_gpu_processes())
        b = api.memory_breakdown()
        parts = [f"{key.replace('_', ' ')} {format_bytes(value)}" for key, value in b.items()
                 if isinstance(value, int) and key != "total"]
        print(f"of {format_bytes(int(b['total'] or 0))}: " + " · ".join(parts))

    def _do_info(self, args: Any) -> None:
        from jupyter_gpumem import __version__
        from jupyter_gpumem.runtime import binding

        s = self.ext.settings
        lines = [f"jupyter_gpumem {__version__} · backend {registry.backend()} · CuPy allocator "
                 f"{'installed' if binding.installed() else 'not installed'}"]
        if self.ext.gpu_reason:
            lines.append(f"GPU: none ({self.ext.gpu_reason})")
        allocator = current_allocator()
        if allocator is not None:
            free, total = allocator.device.mem_get_info()
            lines.append(f"device {allocator.device.index}: {allocator.device.name}, "
                         f"{format_bytes(total)} total, {format_bytes(free)} free")
            lines.append(f"allocator config: {allocator.config.as_text() or '(defaults)'}")
        lines.append(
            f"settings: record_history={s.record_history} stacks={s.stacks} "
            f"max_entries={s.max_entries} auto_footer={s.auto_footer} "
            f"keep_states={s.keep_states} live_view={s.live_view} oom_panel={s.oom_panel}")
        lines.append(f"cells recorded: {len(self.ext.ledger.rows)}")
        print("\n".join(lines))

    def _do_dump(self, args: Any) -> None:
        from jupyter_gpumem import api
        from jupyter_gpumem.data.files import save_format, save_snapshot

        self._allocator()
        path = os.path.expanduser(args.values[0])
        if save_format(path) not in ("pickle", "json"):
            raise self._usage(f"dump: use a .pickle/.pkl or .json path (.gz too), got {path!r}")
        snap = api.snapshot()
        try:
            save_snapshot(snap, path)
        except OSError as exc:
            raise self._usage(f"dump: cannot write {path!r}: {exc.strerror or exc}") from None
        print(f"gpumem: snapshot saved to {path}")

    def _do_load(self, args: Any) -> Any:
        from jupyter_gpumem.data.files import load_snapshot
        from jupyter_gpumem.render.trace_result import analyze

        path = os.path.expanduser(args.values[0])
        try:
            snap = load_snapshot(path)
        except ValueError as exc:  # SnapshotFileError ("FILE: what is wrong"), or a bad
            raise UsageError(f"%gpumem load: {exc}") from None  # JUPYTER_GPUMEM_LOAD_LIMITS
        # load_snapshot checked the fields and filled the keys older PyTorch versions leave out.
        return analyze(snap, cell_files=self.ext.ledger.cell_files)

    def _do_auto(self, args: Any) -> None:
        value = args.values[0].lower()
        if value not in ("on", "off"):
            raise self._usage(f"auto takes on or off, got {args.values[0]!r}")
        self.ext.settings.auto_footer = value == "on"
        print(f"gpumem: per-cell footer {value}")

    def _do_device(self, args: Any) -> None:
        from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason
        from jupyter_gpumem.runtime import binding

        which = args.values[0].lower()
        if which not in ("sim", "cuda"):
            raise self._usage(f"device takes sim or cuda, got {args.values[0]!r}")
        if which == "cuda":
            if args.capacity is not None:
                raise self._usage("--capacity applies to 'device sim' only")
            reason = cuda_unavailable_reason()
            if reason is not None:
                raise UsageError(f"jupyter_gpumem: no GPU here ({reason}); staying on the "
                                 f"{registry.backend()} backend.")
            registry.use_cuda()
            if self.ext.settings.install_allocator and not binding.installed():
                binding.install()
                self.ext.installed_binding = True
            print("gpumem: using the CUDA devices")
            return
        text = args.capacity if args.capacity is not None else self.ext.settings.sim_capacity
        try:
            capacity = parse_bytes(text)
        except ValueError as exc:
            raise self._usage(f"--capacity: {exc}") from None
        if not 0 < capacity <= _LARGEST_BYTES:
            raise self._usage(f"--capacity must be between 1 B and {format_bytes(_LARGEST_BYTES)}"
                              f", got {text!r}")
        existing = registry._sim.get(0)
        fresh = args.capacity is not None and (
            existing is None or existing.device.mem_get_info()[1] != capacity)
        try:
            allocators = registry.use_simulated_device(capacity, fresh=fresh)
        except ValueError as exc:
            raise self._usage(f"device sim: {exc}") from None
        total = allocators[0].device.mem_get_info()[1]
        print(f"gpumem: using a simulated device of {format_bytes(total)}")
