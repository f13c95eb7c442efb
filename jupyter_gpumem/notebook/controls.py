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
from jupyter_gpumem.notebook.host import (
    Host,
    require_allocator,
    require_sources,
    unreadable_sources,
)
from jupyter_gpumem.notebook.output import usage_error
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.runtime import registry
from jupyter_gpumem.sources.cupy import CupySource, our_sources
from jupyter_gpumem.sources.protocol import FEATURES, HistoryMode, MemorySource, shows_row

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
    """Note [History over the sources]."""
    if not args.values:
        _history_state(host)
        return
    mode = args.values[0].lower()
    modes: dict[str, HistoryMode] = {"on": "all", "all": "all", "state": "state", "off": "off"}
    if mode not in modes:
        raise usage_error(f"history takes on, state or off, got {args.values[0]!r}")
    if args.max_entries is not None and args.max_entries < 1:
        raise usage_error(f"--max-entries must be >= 1, got {args.max_entries}")
    ours = our_sources()
    theirs = [src for src in sources.current_sources() if not _reads_ours(src)]
    if not ours and not theirs:
        require_sources(host)  # says why nothing can be read
    s = host.settings
    # Everything is checked (the parser bounds --max-entries): now change all of it at once.
    with s.hold_trait_notifications():
        s.record_history = modes[mode]
        if args.stacks is not None:
            s.stacks = args.stacks
        if args.max_entries is not None:
            s.max_entries = args.max_entries
    for mine in ours:
        host.apply_history(mine)
    words = _history_words(s.record_history, s.stacks, s.max_entries)
    said = [words] if ours else []
    for src in theirs:
        said.append(_record(src, modes[mode], s.stacks, s.max_entries, words))
    said += [f"{name} cannot be read now: {why}" for name, why in unreadable_sources()]
    print("gpumem: " + "; ".join(said))


def _history_state(host: Host) -> None:
    """A bare ``%gpumem history``: what is recorded, and per device of ours its ring: events
    kept and dropped, bytes an event and in all (Note [A ring of 32-byte events])."""
    s = host.settings
    lines = ["gpumem: " + _history_words(s.record_history, s.stacks, s.max_entries)]
    for index, allocator in sorted(registry.allocators().items()):
        h = allocator.history
        if h is None:
            continue
        full = format_bytes(h.event_bytes * h.max_entries) if h.max_entries < 1 << 40 else "?"
        n = h.stacks_interned
        stacks = f"{n:,} distinct stack{'' if n == 1 else 's'}" if h.stacks else "no stacks"
        lines.append(f"  GPU {index}: {h.kept:,} events kept, {h.dropped:,} dropped; ring "
                     f"{format_bytes(h.ring_bytes)} now, {full} when full ({h.event_bytes} B "
                     f"an event, with stacks or without); {stacks}")
    print("\n".join(lines))


def _reads_ours(src: MemorySource) -> bool:
    """Whether ``src`` reads one of our allocators (whose history ``apply_history`` sets)."""
    return isinstance(src, CupySource)


def _record(src: MemorySource, mode: HistoryMode, stacks: bool, max_entries: int,
            words: str) -> str:
    """Set ``src``'s recording to ``mode`` and say what it records now, in the words of
    ``%gpumem history`` ("PyTorch's history on (...)", "PyTorch's history as it was")."""
    whose = _whose(src)
    was = src.history_on()
    try:
        src.record_history(mode, stacks=stacks, max_entries=max_entries)
    except (ValueError, TypeError, NotImplementedError) as exc:  # a mode it does not have
        return f"{whose} history as it was: {exc}"
    if mode == "state" and src.history_on() == was:  # it keeps no stacks without events
        return f"{whose} history as it was"
    return f"{whose} {words}"


def _whose(src: MemorySource) -> str:
    """Whose history, as a possessive: the first word of the source's title where it is one
    ("PyTorch's allocator ..."), else its name's."""
    first = src.title.split(" ", 1)[0]
    return first if first.endswith("'s") else f"{src.name}'s"


# Note [History over the sources]: ``%gpumem history on|state|off`` sets the settings' mode
# (``GpuMem.record_history``, ``stacks``, ``max_entries``); our allocators follow it on every
# device and backend (``Host.apply_history``, as each new one does when first seen), and every
# other source picked and readable is told the same (``record_history``). The line says what
# each records now: ours in the settings' words, each other source after its possessive
# ("PyTorch's history on (...)"); a source without the mode (PyTorch keeps no stacks of live
# blocks without events: "state") leaves its recording as it was, and says so.


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


def do_source(host: Host, args: Namespace) -> None:
    """``%gpumem source NAME [NAME ...]|both|all``: which sources every view reads; bare, what
    each one shows, or why it cannot be read."""
    names = sources.source_names()
    if not args.values:
        print(_sources_table(names))
        return
    asked = [value.lower() for value in args.values]
    for which, value in zip(asked, args.values, strict=True):
        if which not in (*names, "both", "all"):
            raise usage_error(f"source takes torch, cupy or both, all, or source names "
                              f"({', '.join(names)}), got {value!r}")
    try:
        picked = sources.use_sources(asked)
    except Exception as exc:  # SourceError says why; a maker that raised, what it raised
        why = (str(exc) if isinstance(exc, sources.SourceError)
               else f"source {' '.join(asked)!r} cannot be made ({_raised(exc)})")
        raise UsageError(f"jupyter_gpumem: {why}; the views stay on "
                         f"{'+'.join(sources.selected())}.") from None
    titles = [sources.get_source(name).title for name in picked]
    line = "gpumem: the views read " + _and(titles)
    cannot = unreadable_sources(picked)
    if cannot:
        line += "; " + "; ".join(f"{name} cannot be read now: {why}" for name, why in cannot)
    print(line)


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _sources_table(names: tuple[str, ...]) -> str:
    """A bare ``%gpumem source``: each source (* where the views read it), what it is, and
    what it shows (the keys of the README's source table) or why it cannot be read."""
    picked = sources.selected()
    rows = []
    for name in names:
        mark = "*" if name in picked else ""
        try:
            src = sources.get_source(name)
            why = src.unavailable()
        except Exception as exc:  # its library missing, a broken entry point, a maker raised
            why = str(exc) if isinstance(exc, sources.SourceError) else _raised(exc)
            rows.append((mark, name, "", f"cannot be made: {why}"))
            continue
        if why is not None:
            rows.append((mark, name, src.title, f"cannot be read now: {why}"))
            continue
        rows.append((mark, name, src.title, _shows(src)))
    head = (f"gpumem: the views read {'+'.join(picked)} (*); %gpumem source NAME|both|all "
            "picks others")
    return head + "\n" + Table(("", "source", "what", "shows"), rows).text()


def _shows(src: MemorySource) -> str:
    """What ``src`` shows, by the keys of ``FEATURES``: "stats, blocks, ...; not history"."""
    answers = zip((key.replace("_", " ") for key, _ in FEATURES), shows_row(src.shows),
                  strict=True)
    yes: list[str] = []
    no: list[str] = []
    for key, answer in answers:
        (yes if answer.startswith("yes") else no).append(key)
    return ", ".join(yes) + (f"; not {', '.join(no)}" if no else "") if yes else "nothing"
