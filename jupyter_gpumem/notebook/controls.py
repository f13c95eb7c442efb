"""The ``%gpumem`` subcommands that change something: reset-peak, empty-cache, config, limit,
history, auto and device.

Each ``do_<name>(host, args)`` checks every value before it changes anything, so a bad one
raises a one-line ``UsageError`` and leaves the allocators, the settings and the backend alone.
"""

from __future__ import annotations

from argparse import Namespace

from IPython.core.error import UsageError

from jupyter_gpumem import sources
from jupyter_gpumem.data.sizes import MAX_DEVICE_SIZE
from jupyter_gpumem.data.units import format_bytes, parse_bytes
from jupyter_gpumem.notebook.host import Host, require_allocator
from jupyter_gpumem.notebook.output import usage_error
from jupyter_gpumem.runtime import registry
from jupyter_gpumem.sources.torch import selected_torch

__all__ = ["do_auto", "do_config", "do_device", "do_empty_cache", "do_history", "do_limit",
           "do_reset_peak", "do_source"]

#: The largest byte count (or count) the allocator cores hold: a signed 64-bit integer.
_LARGEST_BYTES = (1 << 63) - 1


def do_reset_peak(host: Host, args: Namespace) -> None:
    require_allocator(host).reset_peak_memory_stats()
    print("gpumem: peak stats reset")


def do_empty_cache(host: Host, args: Namespace) -> None:
    require_allocator(host)
    allocators = registry.allocators().values()
    released = sum(a.empty_cache() for a in allocators)
    line = f"gpumem: released {format_bytes(released)} of cached segments to the device"
    kept = [(seg["total_size"] - seg["allocated_size"]) for a in allocators
            for seg in a.snapshot(mark=False)["segments"]
            if seg["total_size"] > seg["allocated_size"]]
    if sum(kept):  # empty_cache gives back only segments with no live block
        segments = "1 segment that still holds" if len(kept) == 1 else (
            f"{len(kept)} segments that still hold")
        line += (f"; {format_bytes(sum(kept))} stays cached in {segments} live blocks (a "
                 "segment goes back only when all its blocks are free)")
    print(line)


def do_config(host: Host, args: Namespace) -> None:
    allocator = require_allocator(host)
    if not args.values:
        print(f"gpumem config: {allocator.config.as_text() or '(defaults)'}")
        return
    if not all(v.strip(" ,") for v in args.values):
        raise usage_error(f"config: expected key:value, got {' '.join(args.values)!r}")
    text = ",".join(args.values)
    try:
        config = allocator.config.updated(text)
    except (ValueError, TypeError) as exc:
        raise usage_error(f"config: {exc}") from None
    for key, value, most in (
            ("max_split_size_mb", config.max_split_size_mb, _LARGEST_BYTES >> 20),
            ("roundup_power2_divisions", config.roundup_power2_divisions, _LARGEST_BYTES)):
        if value is not None and value > most:
            raise usage_error(f"config: {key} must be at most {most}, got {value}")
    targets = list({id(a): a for a in (allocator, *registry.allocators().values())}.values())
    before = [a.config for a in targets]
    try:
        for other in targets:
            other.set_config(config)
    except (ValueError, TypeError, OverflowError) as exc:
        for other, old in zip(targets, before, strict=True):  # all or nothing
            other.set_config(old)
        raise usage_error(f"config: {exc}") from None
    registry.set_default_config(config)
    print(f"gpumem config: {config.as_text() or '(defaults)'}")


def do_limit(host: Host, args: Namespace) -> None:
    allocator = require_allocator(host)
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
                raise usage_error(f"limit: {exc}") from None
            if size <= 0 or size > total:
                raise usage_error(f"limit: {text} is not between 0 and the device's "
                                  f"{format_bytes(total)}") from None
            fraction = size / total
        else:
            if not 0.0 <= fraction <= 1.0:
                raise usage_error(f"limit: a fraction must be in [0, 1], got {text}")
    allocator.set_memory_fraction(fraction)
    if fraction is None:
        print("gpumem: no limit on reserved memory")
    else:
        print(f"gpumem: reserved memory capped at {format_bytes(int(fraction * total))} "
              f"({fraction:.3g} of {format_bytes(total)})")


def do_history(host: Host, args: Namespace) -> None:
    mode = args.values[0].lower()
    modes = {"on": "all", "all": "all", "state": "state", "off": "off"}
    if mode not in modes:
        raise usage_error(f"history takes on, state or off, got {args.values[0]!r}")
    if args.max_entries is not None and args.max_entries < 1:
        raise usage_error(f"--max-entries must be >= 1, got {args.max_entries}")
    torch = selected_torch()
    current = registry.current_allocator() if torch is not None else require_allocator(host)
    s = host.settings
    # Everything is checked (the parser bounds --max-entries): now change all of it at once.
    with s.hold_trait_notifications():
        s.record_history = modes[mode]
        if args.stacks is not None:
            s.stacks = args.stacks
        if args.max_entries is not None:
            s.max_entries = args.max_entries
    ours = [current] if current is not None else []
    for other in {id(a): a for a in (*ours, *registry.allocators().values())}.values():
        host.apply_history(other)
    words = _history_words(s.record_history, s.stacks, s.max_entries)
    if torch is None:
        print(f"gpumem: {words}")
        return
    # PyTorch records every event or none: "state" leaves its recording as it is
    if s.record_history == "state":
        theirs = "PyTorch's history as it was"
    else:
        torch.record_history("all" if s.record_history == "all" else "off", stacks=s.stacks,
                             max_entries=s.max_entries)
        theirs = "PyTorch's " + _history_words(s.record_history, s.stacks, s.max_entries)
    print(f"gpumem: {words}; {theirs}" if ours else f"gpumem: {theirs}")


def _history_words(mode: str, stacks: bool, max_entries: int) -> str:
    """What ``%gpumem history`` now records, in the words the user typed (on, state, off)."""
    if mode == "off":
        return "history off"
    if mode == "state":
        kept = "the lines of live blocks" if stacks else "live blocks, without their lines"
        return f"history state: {kept} only, no events (no timeline, no replay)"
    return f"history on (stacks {'on' if stacks else 'off'}, up to {max_entries} events)"


def do_auto(host: Host, args: Namespace) -> None:
    value = args.values[0].lower()
    if value not in ("on", "off"):
        raise usage_error(f"auto takes on or off, got {args.values[0]!r}")
    host.settings.auto_footer = value == "on"
    print(f"gpumem: per-cell footer {value}")


def do_device(host: Host, args: Namespace) -> None:
    from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason

    which = args.values[0].lower()
    if which not in ("sim", "cuda"):
        raise usage_error(f"device takes sim or cuda, got {args.values[0]!r}")
    if which == "cuda":
        if args.capacity is not None:
            raise usage_error("--capacity applies to 'device sim' only")
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise UsageError(f"jupyter_gpumem: no GPU here: {reason}; staying on the "
                             f"{registry.backend()} backend.")
        registry.use_cuda()
        host.install_binding()
        print("gpumem: using the CUDA devices")
        return
    text = args.capacity if args.capacity is not None else host.settings.sim_capacity
    try:
        capacity = parse_bytes(text)
    except ValueError as exc:
        raise usage_error(f"--capacity: {exc}") from None
    if not 0 < capacity <= MAX_DEVICE_SIZE:
        raise usage_error(f"--capacity must be between 1 B and {format_bytes(MAX_DEVICE_SIZE)}"
                          f", got {text!r}")
    existing = registry.simulated_allocators().get(0)
    fresh = args.capacity is not None and (
        existing is None or existing.device.mem_get_info()[1] != capacity)
    try:
        allocators = registry.use_simulated_device(capacity, fresh=fresh)
    except ValueError as exc:
        raise usage_error(f"device sim: {exc}") from None
    total = allocators[0].device.mem_get_info()[1]
    print(f"gpumem: using a simulated device of {format_bytes(total)}; no memory is behind it, "
          "so allocate with jupyter_gpumem.caching_allocator_alloc(nbytes) (CuPy arrays need "
          "a GPU)")


_SOURCES = {"cupy": ("cupy",), "torch": ("torch",), "both": ("cupy", "torch")}


def do_source(host: Host, args: Namespace) -> None:
    """``%gpumem source torch|cupy|both``: which allocator every view reads."""

    which = args.values[0].lower()
    if which not in _SOURCES:
        raise usage_error(f"source takes torch, cupy or both, got {args.values[0]!r}")
    try:
        sources.use_sources(_SOURCES[which])
    except ImportError as exc:
        raise UsageError(f"jupyter_gpumem: cannot read PyTorch's allocator: {exc}; the views "
                         f"stay on {'+'.join(sources.selected())}.") from None
    names = {"cupy": "our allocator (CuPy)", "torch": "PyTorch's allocator (torch.cuda.memory)"}
    print("gpumem: the views read " + " and ".join(names[s] for s in sources.selected()))
