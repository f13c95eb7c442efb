"""Which memory sources exist, and which the views read now.

Three are built in: "cupy" (our allocator), "torch" (PyTorch's) and "jax" (XLA's, through JAX);
each is made on first use, so ``torch`` and ``jax`` are imported only when picked. A package
adds one through the entry-point group ``jupyter_gpumem.sources`` (the entry point's name is
the source's name; it loads a ``MemorySource``, or a class or function that makes one), or at
run time with ``register_source(name, source)``. ``use_sources(names)`` (``%gpumem source NAME``,
``both``, ``all``) picks the sources; ``current_sources()`` gives those picked that can be read.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Any

from jupyter_gpumem.sources.protocol import MemorySource, missing_members

__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "SourceError", "current_sources", "get_source",
           "register_source", "selected", "shared_names", "source", "source_names",
           "unregister_source", "use_sources", "use_torch"]

#: The entry-point group a package registers its sources in.
ENTRY_POINT_GROUP = "jupyter_gpumem.sources"

#: The built-in sources, by name: where their class lives.
BUILT_IN: dict[str, str] = {
    "cupy": "jupyter_gpumem.sources.cupy:CupySource",
    "torch": "jupyter_gpumem.sources.torch:TorchSource",
    "jax": "jupyter_gpumem.sources.jax:JaxSource",
}

#: Names that pick several sources at once.
GROUPS = {"both": ("cupy", "torch")}  # and "all": every source that can be read now

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

Factory = Callable[[], Any]


class SourceError(ValueError):
    """A source that cannot be made: an unknown name, a broken entry point, a library missing.
    The message says which and what to do."""


_lock = threading.RLock()
_registered: dict[str, Any] = {}  # name -> a MemorySource or a factory (run time and entry points)
_made: dict[str, MemorySource] = {}
_selected: tuple[str, ...] = ("cupy",)
_entry_points_read = False


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or name in (*GROUPS, "all"):
        raise ValueError(f"a source name is a lowercase word (letters, digits, - or _; not "
                         f"{', '.join((*GROUPS, 'all'))}), got {name!r}")
    return name


def _is_source(obj: object) -> bool:
    return not missing_members(obj)


def register_source(name: str, source: Any) -> None:
    """Make ``source`` (a ``MemorySource``, or a class or function that makes one) available as
    ``name``: ``%gpumem source NAME`` then reads it in every view. A name registered again is
    replaced (a view reading it reads the new one); a built-in name cannot be taken."""
    _check_name(name)
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in source; register yours under another name")
    if not (_is_source(source) or callable(source)):
        raise TypeError(f"register_source({name!r}, ...) takes a MemorySource or a function "
                        f"that makes one, got {type(source).__name__}")
    with _lock:
        _read_entry_points()
        _registered[name] = source
        _made.pop(name, None)


def unregister_source(name: str) -> None:
    """Take back a source ``register_source`` added; the views stop reading it."""
    global _selected
    with _lock:
        if name not in _registered:
            raise ValueError(f"no source {name!r} was registered")
        del _registered[name]
        _made.pop(name, None)
        _selected = tuple(n for n in _selected if n != name) or ("cupy",)


class _Unloaded:
    """An entry point of the group, not loaded yet. (Held in a class of ours: the entry points
    may be another ``importlib.metadata``'s, a backport's, whose class is not the stdlib's.)"""

    def __init__(self, entry_point: Any) -> None:
        self.entry_point = entry_point


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILT_IN or not _NAME.match(ep.name) or ep.name in _registered:
            continue  # a built-in name stays ours; a run-time registration wins
        _registered[ep.name] = _Unloaded(ep)  # loaded on first use


def source_names() -> tuple[str, ...]:
    """Every source that can be picked: the built-in ones, then the others by name."""
    with _lock:
        _read_entry_points()
        return (*BUILT_IN, *sorted(_registered))


def _missing(name: str, exc: ImportError) -> SourceError:
    library = (exc.name or "").split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and library:
        return SourceError(f"source {name!r} needs {library}, which is not installed here")
    return SourceError(f"source {name!r} cannot import what it needs ({exc})")


def _load(name: str, spec: Any, **options: Any) -> MemorySource:
    if isinstance(spec, str):  # a built-in: "module:Class"
        module, _, attr = spec.partition(":")
        try:
            spec = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise _missing(name, exc) from exc
    elif isinstance(spec, _Unloaded):
        try:
            spec = spec.entry_point.load()
        except Exception as exc:
            raise SourceError(f"source {name!r}: its entry point {spec.entry_point.value!r} "
                              f"failed to load ({type(exc).__name__}: {exc})") from exc
    made = spec if _is_source(spec) else spec(**options)
    missing = missing_members(made)
    if missing:
        raise SourceError(f"source {name!r} is not a MemorySource (it lacks "
                          f"{', '.join(missing)})")
    made_source: MemorySource = made
    return made_source


def get_source(name: str, **options: Any) -> MemorySource:
    """The source called ``name``, made on first use (``options`` go to its maker and make it
    again: ``memory_module=`` for "torch", ``jax_module=`` for "jax"). SourceError when it
    cannot be made."""
    with _lock:
        names = source_names()
        if name not in names:
            raise SourceError(f"no source {name!r}: the sources are {', '.join(names)}")
        if name in _made and not options:
            return _made[name]
        spec = BUILT_IN.get(name) or _registered[name]
        try:
            made = _load(name, spec, **options)
        except SourceError:
            raise
        except ImportError as exc:
            raise _missing(name, exc) from exc
        _register_for_search(name, made)
        _made[name] = made
        return made


def _register_for_search(name: str, made: MemorySource) -> None:
    """Make the holder search know ``made``'s array types and the line naming its library's
    frames (``data.owners.register``, ``data.sites.register_library_files``); they stay known
    after the source is unregistered. SourceError when they are not what the protocol says."""
    from jupyter_gpumem.data import owners, sites

    try:
        owners.register(made.owners)
        sites.register_library_files(made.library_files)
    except Exception as exc:
        raise SourceError(f"source {name!r}: its owners or library_files are not what a "
                          f"MemorySource gives ({type(exc).__name__}: {exc})") from exc


def shared_names(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as the views read them: Note [One cache, one source]."""
    from jupyter_gpumem.runtime import torch_share

    names = tuple(names)
    if not torch_share.shared():
        return names
    return tuple(dict.fromkeys("cupy" if name == "torch" else name for name in names))


# Note [One cache, one source]: while PyTorch allocates from our cache (``runtime.torch_share``),
# PyTorch's books are ours: its memory functions answer from the allocator the "cupy" source
# reads. Reading both would count every byte twice, so "torch" names the "cupy" source then:
# picked ("%gpumem source torch", "both"), selected, or asked for by name, it is read once, as
# "cupy", whose title and status line say the cache is one for CuPy and PyTorch.


def _expand(names: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for name in names:
        if name == "all":
            for candidate in source_names():
                try:
                    made = get_source(candidate)
                except SourceError:
                    continue  # "all" is those that can be read here
                if made.unavailable() is None:
                    out.append(candidate)
        else:
            out.extend(GROUPS.get(name, (name,)))
    return shared_names(dict.fromkeys(out))


def use_sources(names: Iterable[str], **options: Any) -> tuple[str, ...]:
    """Point every view at the sources ``names`` (each a source's name, ``both`` for cupy and
    torch, ``all`` for every source readable now) and return them. Every one is made first;
    when one cannot be (SourceError, saying why), nothing changes. ``options`` go to the
    makers (``memory_module=`` makes "torch" read a fake ``torch.cuda.memory``)."""
    global _selected
    asked = tuple(names) if not isinstance(names, str) else (names,)
    for name in asked:
        if not isinstance(name, str):
            raise TypeError(f"source names are strings, got {name!r}")
    with _lock:
        wanted = _expand(asked)
        if not wanted:
            raise SourceError("no source can be read here" if "all" in asked
                              else "name at least one source")
        for name in wanted:
            get_source(name, **_options_for(name, options))
        _selected = wanted
        return wanted


def _options_for(name: str, options: dict[str, Any]) -> dict[str, Any]:
    keyword = {"torch": "memory_module", "jax": "jax_module"}.get(name)
    return {keyword: options[keyword]} if keyword in options else {}


def use_torch(memory_module: Any = None, *, also_cupy: bool = False) -> None:
    """Point every view at PyTorch's allocator (``%gpumem source torch``); with ``also_cupy``,
    at both (``%gpumem source both``)."""
    options = {} if memory_module is None else {"memory_module": memory_module}
    use_sources(("cupy", "torch") if also_cupy else ("torch",), **options)


def selected() -> tuple[str, ...]:
    """The names of the sources the views read, in order (``("cupy",)`` until told otherwise;
    Note [One cache, one source])."""
    return shared_names(_selected)


def source(name: str) -> MemorySource | None:
    """The source ``name`` when it is selected, else None."""
    with _lock:
        return _made.get(name) if name in selected() else None


def current_sources() -> Iterator[MemorySource]:
    """The selected sources that can be read now, in the order picked."""
    picked = []
    with _lock:
        for name in selected():
            try:
                picked.append(get_source(name))
            except SourceError:  # unregistered since, or its library gone: not readable
                continue
    for made in picked:
        try:
            if made.unavailable() is None:
                yield made
        except Exception:  # a source that cannot even say: not readable now
            continue


def reset() -> None:
    """Forget every source made and registered at run time, and read "cupy" again (tests)."""
    global _selected, _entry_points_read
    with _lock:
        _made.clear()
        _registered.clear()
        _entry_points_read = False
        _selected = ("cupy",)
