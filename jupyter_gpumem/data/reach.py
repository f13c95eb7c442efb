"""Who keeps a block alive: a bounded search for the reference chains from the roots a user can
act on down to the objects that own GPU blocks. See Note [Holders by reference chain].

``search(roots, blocks)`` walks breadth-first from ``roots`` (``Root``: a variable of the user's
namespace, a global of one of the user's own modules, a local of a frame that the last
exception's traceback keeps, IPython's output cache) through what a user can name:

- the items of lists, tuples and dicts (``xs[3]``, ``d['w']``, ``plans[(1024, 16)]``);
- the attributes of objects (``model.cache``; ``__dict__`` and ``__slots__``, never a property);
- a function's closure cells and defaults (``hooks[3].<closure>.buf``), a bound method's
  ``__self__``, a ``functools.partial``'s arguments, a ``functools.lru_cache``'s entries;
- the locals of a suspended generator or coroutine (``gen.<frame>.buf``);
- the globals of a user module, and a user class's attributes (``Cache.store['k']``);
- PyTorch's objects, recognised by their surface (torch is never imported): a module's
  parameters, gradients and buffers by attribute path (``model.0.weight.grad``), an optimizer's
  state by the parameter's path (``opt.state[model.0.weight].exp_avg``), a tensor's ``.grad``,
  and the tensors its autograd graph saved for backward (``running.<autograd graph>``: every
  ``grad_fn._saved_*``, through ``next_functions``).

An object owns a block when its memory lies in it, as an ``Owner`` of ``data.owners`` says: a
CuPy array (``.data.ptr``, ``.nbytes``), a CuPy ``MemoryPointer`` (``.ptr`` and ``.mem``), a
tensor (``untyped_storage()``), or an array of any owner registered there (a JAX array, by
``unsafe_buffer_pointer()``; ``sources.registry`` registers every source's owners); so does the
very int that ``caching_allocator_alloc`` returned, until it is deleted (``data.handles``). Any
other int never does: it keeps nothing alive, even when it equals a block's address.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import os
import site
import sys
import time
import types
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jupyter_gpumem.data import handles, owners
from jupyter_gpumem.data.owners import TORCH_TENSOR, Owner
from jupyter_gpumem.data.units import MAX_SECONDS, check_seconds

__all__ = ["DEFAULT_BUDGET", "MAX_CONTAINER_ITEMS", "MODULE", "OUTPUT", "TRACEBACK", "VARIABLE",
           "Budget", "Chain", "Root", "Search", "frame_locals", "is_optimizer", "search",
           "user_file", "user_module", "user_modules"]

#: Elements of one container (or attributes of one object) the search looks at.
MAX_CONTAINER_ITEMS = 10_000
#: Autograd nodes looked at below one tensor.
MAX_GRAPH_NODES = 10_000
#: How deep a chain may be, in steps from its root.
MAX_DEPTH = 12

#: The kinds of root.
VARIABLE = "variable"  # a name of the user's namespace
MODULE = "module"  # a global of one of the user's own modules
TRACEBACK = "traceback"  # a local of a frame the last exception keeps
OUTPUT = "output"  # IPython's output cache (``Out[2]``)


@dataclass(frozen=True)
class Budget:
    """How much one search may do: objects looked at and milliseconds; past either, it stops
    and says so (``Search.cut``)."""

    max_objects: int = 200_000
    max_ms: float = 50.0

    def __post_init__(self) -> None:
        if self.max_objects < 1:
            raise ValueError(f"a budget needs max_objects >= 1, got {self}")
        check_seconds("max_ms", self.max_ms, most=MAX_SECONDS * 1000, unit="milliseconds")


DEFAULT_BUDGET = Budget()


class Root(NamedTuple):
    """Where a chain starts: ``path`` is how the user writes the object (``hooks``,
    ``helpers._CACHE``, ``prepare's local tmp``); ``group`` is what the user acts on, the line a
    holder is summed under (``hooks``, ``helpers``, ``the traceback of the error in cell [4]``).
    (A tuple: a namespace of 1,000 names makes 1,000 of them a cell.)"""

    group: str
    path: str
    value: Any
    kind: str = VARIABLE


@dataclass(frozen=True)
class Chain:
    """One way a block is kept alive: from ``root`` along ``path`` to an owning object."""

    address: int  # the block
    path: str  # as the user would write it: ``hooks[3].<closure>.buf``
    root: Root
    depth: int  # steps from the root
    #: what the root's element on the path is, in words ("closure", "dict", "Hook"); None when
    #: the root itself, or its element, owns the block
    element: str | None = None
    graph: bool = False  # through an autograd graph's saved tensors
    handle: bool = False  # ends at an int from ``caching_allocator_alloc`` (``data.handles``)

    @property
    def target(self) -> str:
        """What ``del`` (or ``caching_allocator_delete``) takes to drop this chain: the path up to
        its first step that no code can write (``hooks[3]`` for ``hooks[3].<closure>.buf``)."""
        cut = self.path.find(".<")
        return self.path if cut < 0 else self.path[:cut]


@dataclass
class Search:
    """What a search found: every block's chains, shortest first, and whether it was cut."""

    chains: dict[int, list[Chain]]
    objects: int  # objects looked at
    elapsed_ms: float
    cut: str | None = None  # "search stopped at 50 ms"; None when it looked at everything


# -- what an object can be to the search -----------------------------------------------------------

# Decided once a type, so that a list of 10,000 floats costs one ``set(map(type, ...))``.
(_SKIP, _SEQUENCE, _MAPPING, _SET, _FUNCTION, _METHOD, _PARTIAL, _GENERATOR, _CELL, _MODULE,
 _CLASS, _LRU, _OWNER, _TORCH_MODULE, _OBJECT, _INT, _TENSOR) = range(17)
#: The kinds of owner: a tensor (its ``.grad`` and autograd graph are looked into), and every
#: other (``_OWNER``: an array, nothing in it holds more); which ``Owner`` is cached by type.
_OWNERS = (_OWNER, _TENSOR)

_ATOMIC: set[type] = {int, float, complex, str, bytes, bytearray, bool, type(None), range, slice,
                      type(Ellipsis), type(NotImplemented), memoryview, types.BuiltinFunctionType,
                      types.WrapperDescriptorType, types.MethodWrapperType, types.CodeType,
                      types.GetSetDescriptorType, types.MemberDescriptorType, property,
                      staticmethod, classmethod}
_LRU_TYPE = type(functools.lru_cache(None)(lambda: None))


def _kind_of(t: type) -> tuple[int, Owner | None]:
    """What objects of type ``t`` are to the search, and the ``Owner`` whose memory they own."""
    kind = _container_kind(t)
    if kind != _OBJECT:
        return kind, None
    for owner in owners.search_owners():  # Note [The order owners are asked in]
        try:
            mine = owner.matches(t)
        except Exception:  # a third party's test that fails: not its type
            mine = False
        if mine:
            return (_TENSOR if owner is TORCH_TENSOR else _OWNER), owner
    if callable(getattr(t, "named_parameters", None)) and callable(
            getattr(t, "named_buffers", None)):
        return _TORCH_MODULE, None
    return _OBJECT, None


def _container_kind(t: type) -> int:
    """What ``t`` is when it is one of Python's own kinds (``_OBJECT`` when it is none)."""
    if t is int:
        return _INT  # a handle from caching_allocator_alloc, or nothing (``data.handles``)
    if t in _ATOMIC or issubclass(t, (int, float, str, bytes)):
        return _SKIP
    if t is list or t is tuple or t is deque or issubclass(t, (list, tuple)):
        return _SEQUENCE
    if issubclass(t, dict):
        return _MAPPING
    if t is set or t is frozenset:
        return _SET
    if t is types.FunctionType:
        return _FUNCTION
    if t is types.MethodType:
        return _METHOD
    if t is functools.partial:
        return _PARTIAL
    if t in (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType):
        return _GENERATOR
    if t is types.CellType:
        return _CELL
    if issubclass(t, types.ModuleType):
        return _MODULE
    if issubclass(t, type):
        return _CLASS
    if t is _LRU_TYPE:
        return _LRU
    if t.__module__.split(".")[0] == "numpy":  # host memory: nothing of ours inside
        return _SKIP
    return _OBJECT


def is_optimizer(obj: Any) -> bool:
    """An optimizer's surface: ``state`` (parameter -> dict) and ``param_groups`` among its
    attributes (read from ``__dict__``, so no property runs)."""
    attrs = getattr(obj, "__dict__", None)
    return (isinstance(attrs, dict) and isinstance(attrs.get("state"), Mapping)
            and isinstance(attrs.get("param_groups"), list))


#: What each type seen is to the search (and the ``Owner`` of its objects' memory), by id and
#: held weakly: a strong reference to a class of the user's would keep its class attributes
#: (and the arrays in them) alive. Worked out again once an owner is registered (``_sync``).
_kinds: dict[int, tuple[weakref.ref[type], int, Owner | None]] = {}
_kinds_generation = owners.generation()


def _sync() -> None:
    """Forget what was decided of each type when owners were registered since."""
    global _kinds_generation
    now = owners.generation()
    if now != _kinds_generation:
        _kinds.clear()
        _kinds_generation = now


def _entry(t: type) -> tuple[weakref.ref[type], int, Owner | None]:
    entry = _kinds.get(id(t))
    if entry is not None and entry[0]() is t:
        return entry
    kind, owner = _kind_of(t)
    if len(_kinds) > 4096:  # classes redefined cell after cell: start again
        _kinds.clear()
    entry = _kinds[id(t)] = (weakref.ref(t), kind, owner)
    return entry


def _kind_cached(t: type) -> int:
    entry = _kinds.get(id(t))
    if entry is not None and entry[0]() is t:
        return entry[1]
    return _entry(t)[1]


def _kind(obj: Any) -> int:
    return _kind_cached(type(obj))


# -- which modules are the user's own --------------------------------------------------------------

_folders: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


def _library_folders() -> tuple[str, ...]:
    """Where installed code lives: the interpreter's prefixes, the site folders, any folder of
    ``sys.path`` that pip installed into (it holds a ``*.dist-info``: ``pip install --target``
    folders on ``PYTHONPATH`` too), and this package. Worked out again when ``sys.path``
    changes."""
    global _folders
    key = tuple(sys.path)
    if _folders[0] == key:
        return _folders[1]
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    with _suppress():
        folders.update(site.getsitepackages())
    with _suppress():
        folders.add(site.getusersitepackages())
    for entry in key:
        with _suppress():
            if entry and any(name.endswith((".dist-info", ".egg-info"))
                             for name in os.listdir(entry)):
                folders.add(entry)
    folders.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # our own package
    found = tuple(sorted(os.path.join(os.path.abspath(f), "") for f in folders if f))
    _folders = (key, found)
    _user_modules.clear()
    return found


def _suppress() -> contextlib.suppress:
    """Nothing a library object raises while it is looked at stops the search."""
    return contextlib.suppress(Exception)


_user_modules: dict[str, bool] = {}


def user_module(module: types.ModuleType) -> bool:
    """Whether ``module`` is one of the user's own: a ``.py`` file outside the interpreter's and
    the installed packages' folders (and not this package)."""
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or name == "__main__":
        return False
    libraries = _library_folders()  # first: a new sys.path forgets what was decided
    known = _user_modules.get(name)
    if known is not None:
        return known
    path = getattr(module, "__file__", None)
    mine = (isinstance(path, str) and path.endswith(".py")
            and not os.path.abspath(path).startswith(libraries))
    _user_modules[name] = mine
    return mine


def user_modules() -> list[types.ModuleType]:
    """The user's own modules among ``sys.modules``, in import order."""
    _library_folders()  # a new sys.path forgets what was decided
    known = _user_modules
    out = []
    for name, module in list(sys.modules.items()):
        mine = known.get(name)
        if mine is None:
            mine = isinstance(module, types.ModuleType) and user_module(module)
        if mine and isinstance(module, types.ModuleType):
            out.append(module)
    return out


def user_file(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: a notebook cell (``<ipython-input-...>``, a
    temporary file of IPython's), or a file outside the interpreter's and the installed
    packages' folders (and not this package)."""
    if filename.startswith("<"):
        return filename.startswith("<ipython-input")
    return not os.path.abspath(filename).startswith(_library_folders())


def _user_class(cls: type) -> bool:
    module = sys.modules.get(getattr(cls, "__module__", "") or "")
    return cls.__module__ == "__main__" or (module is not None and user_module(module))


# -- owners ---------------------------------------------------------------------------------------

def _pointer(obj: Any, kind: int | None = None) -> tuple[int, int] | None:
    """``(ptr, nbytes)`` of the device memory ``obj`` owns, None when it owns none."""
    if kind is None:
        kind = _kind(obj)
    try:
        if kind == _INT:
            address = handles.handle_address(obj)
            return None if address is None else (address, 1)
        if kind != _OWNER and kind != _TENSOR:
            return None
        # ``kind`` was just read for this type: its entry is this type's
        entry = _kinds.get(id(type(obj))) or _entry(type(obj))
        owner = entry[2]
        found = owner.memory(obj) if owner is not None else None
        if found is None:
            return None
        ptr, nbytes = found
        ptr = int(ptr)
        nbytes = int(nbytes)
    except Exception:
        return None
    return (ptr, nbytes) if ptr > 0 else None


class _Blocks:
    """The blocks looked for, in address order, for a bisect per owner."""

    def __init__(self, blocks: Sequence[tuple[int, int]]) -> None:
        self.ordered = sorted(blocks)
        self.starts = [a for a, _ in self.ordered]
        self.end = max((a + s for a, s in self.ordered), default=0)

    def block_of(self, ptr: int, nbytes: int) -> int | None:
        if not self.starts or ptr < self.starts[0] or ptr >= self.end:
            return None
        i = bisect.bisect_right(self.starts, ptr) - 1
        addr, size = self.ordered[i]
        return addr if ptr + max(nbytes, 1) <= addr + max(size, 1) else None


# -- the edges a user can name ---------------------------------------------------------------------

_Edge = tuple[str, Any]  # (what to add to the path, the object it leads to)


def _key_text(key: Any, names: Mapping[int, str]) -> str:
    if id(key) in names:
        return names[id(key)]
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _items(obj: Any, names: Mapping[int, str]) -> Iterator[_Edge]:
    kind = _kind(obj)
    if kind == _SEQUENCE:
        seq = list(obj)[:MAX_CONTAINER_ITEMS] if type(obj) is deque else obj[:MAX_CONTAINER_ITEMS]
        if _may_hold(seq):
            yield from ((f"[{i}]", v) for i, v in enumerate(seq))
    elif kind == _MAPPING:
        pairs = list(obj.items())[:MAX_CONTAINER_ITEMS]
        if _may_hold([v for _k, v in pairs]):
            yield from ((f"[{_key_text(k, names)}]", v) for k, v in pairs)
    elif kind == _SET:
        seq = list(obj)[:MAX_CONTAINER_ITEMS]
        if _may_hold(seq):
            yield from (("{…}", v) for v in seq)
    elif kind == _FUNCTION:
        yield from _function_edges(obj)
    elif kind == _METHOD:
        yield ".__self__", obj.__self__
    elif kind == _PARTIAL:
        yield ".func", obj.func
        yield from ((f".args[{i}]", v) for i, v in enumerate(obj.args))
        yield from ((f".keywords[{k!r}]", v) for k, v in obj.keywords.items())
    elif kind == _GENERATOR:
        frame = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None) or getattr(
            obj, "ag_frame", None)
        if frame is not None:
            yield from ((f".<frame>.{k}", v) for k, v in frame_locals(frame))
    elif kind == _CELL:
        with _suppress():
            yield ".cell_contents", obj.cell_contents
    elif kind == _MODULE:
        if user_module(obj):
            yield from _attributes(vars(obj), dunder=False)
    elif kind == _CLASS:
        if _user_class(obj):
            yield from _attributes(dict(vars(obj)), dunder=False)
    elif kind == _LRU:
        yield from _lru_edges(obj)
    elif kind == _TORCH_MODULE:
        yield from _module_edges(obj)
    elif kind == _TENSOR:
        grad = getattr(obj, "grad", None)
        if grad is not None:
            yield ".grad", grad
    elif is_optimizer(obj):
        yield from _optimizer_edges(obj, names)
    elif kind in _OWNERS or kind == _OBJECT:  # an object, or one with a ``data`` that owns none
        yield from _object_edges(obj)


def _may_hold(items: Sequence[Any]) -> bool:
    """False when every element is of a type that holds nothing: skip the loop over them."""
    kinds = {_kind_cached(t) for t in set(map(type, items))}
    if _INT in kinds:  # ints: only live handles hold anything
        kinds.discard(_INT)
        if handles.any_handles() and not handles.handle_ids().isdisjoint(map(id, items)):
            return True
    return bool(kinds - {_SKIP})


def _attributes(attrs: Mapping[str, Any], *, dunder: bool = True) -> Iterator[_Edge]:
    for name, value in list(attrs.items())[:MAX_CONTAINER_ITEMS]:
        if not isinstance(name, str) or (not dunder and name.startswith("__")):
            continue
        if _kind(value) != _SKIP:
            yield f".{name}", value


def _object_edges(obj: Any) -> Iterator[_Edge]:
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        yield from _attributes(attrs)
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                value = object.__getattribute__(obj, name)
            except AttributeError:
                continue
            if _kind(value) != _SKIP:
                yield f".{name.lstrip('_') if name.startswith('__') else name}", value


def _function_edges(fn: types.FunctionType) -> Iterator[_Edge]:
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__, strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield f".<closure>.{name}", value
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f".__defaults__[{i}]", value
    for name, value in (fn.__kwdefaults__ or {}).items():
        yield f".__kwdefaults__[{name!r}]", value
    if fn.__dict__:
        yield from _attributes(fn.__dict__)


def frame_locals(frame: types.FrameType) -> list[tuple[str, Any]]:
    """The locals of ``frame`` (a suspended generator's, or one a traceback keeps)."""
    try:
        return [(k, v) for k, v in frame.f_locals.items() if isinstance(k, str)]
    except Exception:
        return []


def _lru_edges(fn: Any) -> Iterator[_Edge]:
    """The results a ``functools.lru_cache`` keeps (its cache dict is reachable only through
    the garbage collector)."""
    for ref in gc.get_referents(fn):
        if type(ref) is dict and ref is not getattr(fn, "__dict__", None):
            for key, value in list(ref.items())[:MAX_CONTAINER_ITEMS]:
                args = tuple(key) if isinstance(key, list) else key
                yield f".<lru_cache>[{_key_text(args, {})}]", value
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        yield ".__wrapped__", wrapped


def _module_edges(module: Any) -> Iterator[_Edge]:
    """A PyTorch module's parameters (and their gradients) and buffers by attribute path, then
    what its modules keep in plain attributes (``model.0.cache``)."""
    with _suppress():
        for name, p in module.named_parameters():
            yield f".{name}", p
        for name, b in module.named_buffers():
            if b is not None:
                yield f".{name}", b
    named = getattr(module, "named_modules", None)
    subs = list(named()) if callable(named) else [("", module)]
    for name, sub in subs[:MAX_CONTAINER_ITEMS]:
        attrs = getattr(sub, "__dict__", None)
        if not isinstance(attrs, dict):
            continue
        prefix = f".{name}" if name else ""
        for key, value in _attributes({k: v for k, v in attrs.items()
                                       if not k.startswith("_")}):
            if _kind(value) != _TORCH_MODULE:
                yield prefix + key, value


def _optimizer_edges(opt: Any, names: Mapping[int, str]) -> Iterator[_Edge]:
    """An optimizer's state tensors, by the parameter's path where a module of the roots has it
    (``opt.state[model.0.weight].exp_avg``), else by its place in ``param_groups``."""
    where: dict[int, str] = {}
    with _suppress():
        for g, group in enumerate(opt.param_groups):
            params = group.get("params", ()) if isinstance(group, dict) else ()
            for i, p in enumerate(params):
                where.setdefault(id(p), names.get(id(p), f"param_groups[{g}][{i}]"))
    state = getattr(opt, "state", None)
    if isinstance(state, Mapping):
        for p, entry in list(state.items())[:MAX_CONTAINER_ITEMS]:
            pname = where.get(id(p)) or names.get(id(p), "?")
            if isinstance(entry, Mapping):
                for k, v in entry.items():
                    yield f".state[{pname}].{k}", v


# -- autograd graphs -----------------------------------------------------------------------------

_saved: dict[type, tuple[str, ...]] = {}


def _saved_names(t: type) -> tuple[str, ...]:
    """The ``_saved_*`` attributes of an autograd node's type (PyTorch's are its descriptors)."""
    names = _saved.get(t)
    if names is None:
        names = _saved[t] = tuple(n for n in dir(t) if n.startswith("_saved_"))
    return names


def _graph_tensors(tensor: Any, limit: int) -> Iterator[Any]:
    """The tensors the autograd graph below ``tensor`` saved for backward, at most ``limit``
    nodes looked at."""
    root = getattr(tensor, "grad_fn", None)
    if root is None:
        return
    seen = {id(root)}
    nodes = deque([root])
    keep = [root]  # each node stays alive while the search may still compare its id
    while nodes and len(seen) <= limit:
        node = nodes.popleft()
        for name in _saved_names(type(node)):
            try:
                value = getattr(node, name)
            except Exception:  # freed by a backward pass, or not a tensor
                continue
            if isinstance(value, (tuple, list)):
                yield from value
            else:
                yield value
        try:
            following = node.next_functions
        except Exception:
            continue
        for pair in following or ():
            nxt = pair[0] if isinstance(pair, tuple) and pair else None
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                keep.append(nxt)
                nodes.append(nxt)


# -- the search ----------------------------------------------------------------------------------

def _element_word(obj: Any) -> str | None:
    """What an element of a root is, in words, for ``hooks (list of 8 closures, ...)``."""
    kind = _kind(obj)
    if kind in _OWNERS or kind == _INT:
        return None
    if kind == _FUNCTION:
        return "closure" if obj.__closure__ else "function"
    return {_SEQUENCE: "list" if isinstance(obj, list) else "tuple", _MAPPING: "dict",
            _SET: "set", _METHOD: "method", _PARTIAL: "partial", _GENERATOR: "generator",
            _CELL: "cell", _MODULE: "module", _CLASS: "class", _LRU: "cached function",
            _TORCH_MODULE: "module"}.get(kind, type(obj).__name__)


def _tensor_names(roots: Sequence[Root]) -> dict[int, str]:
    """id -> path of every parameter of the PyTorch modules among ``roots`` (for an optimizer's
    state, keyed by its parameters)."""
    names: dict[int, str] = {}
    for root in roots:
        if _kind(root.value) == _TORCH_MODULE:
            with _suppress():
                for name, p in root.value.named_parameters():
                    names.setdefault(id(p), f"{root.path}.{name}")
    return names


class _Node:
    """An object reached by the search, and how: its parent and the step from it, so a path is
    spelled out only for the chains that reach a block."""

    __slots__ = ("element", "graph", "obj", "parent", "root", "step")

    def __init__(self, obj: Any, parent: _Node | None, step: str, root: Root,
                 element: str | None, graph: bool = False) -> None:
        self.obj = obj
        self.parent = parent
        self.step = step
        self.root = root
        self.element = element
        self.graph = graph

    def path(self) -> str:
        steps = []
        node: _Node | None = self
        while node is not None:
            steps.append(node.step)
            node = node.parent
        return "".join(reversed(steps))


def search(roots: Sequence[Root], blocks: Sequence[tuple[int, int]],
           budget: Budget = DEFAULT_BUDGET, *, clock: Any = time.perf_counter) -> Search:
    """Every chain from ``roots`` to an owner of one of ``blocks`` ``(address, size)``, breadth
    first, so each block's chains come shortest first (roots in order among equal lengths); an
    object reached twice is named once, by its first chain. Stops when the budget is spent, or
    after the depth at which every block was found."""
    start = clock()
    chains: dict[int, list[Chain]] = {}
    if not blocks or not roots:
        return Search(chains, 0, 0.0)
    _sync()
    wanted = _Blocks(blocks)
    names = _tensor_names(roots)
    ints = handles.any_handles()  # else an int holds nothing: never looked at
    deadline = start + budget.max_ms / 1000.0
    seen: set[int] = set()
    level: list[_Node] = []
    for root in roots:
        if id(root.value) not in seen and _worth(root.value, ints):
            seen.add(id(root.value))
            level.append(_Node(root.value, None, root.path, root, None))
    graphs: list[tuple[_Node, int]] = []  # tensors with autograd history: looked at last
    looked = 0
    cut: str | None = None

    def owned(node: _Node, depth: int, obj: Any, kind: int, path: str | None = None) -> bool:
        ptr = _pointer(obj, kind)
        if ptr is None:
            return False
        addr = wanted.block_of(*ptr)
        if addr is not None:
            chains.setdefault(addr, []).append(Chain(
                addr, path or node.path(), node.root, depth, node.element, node.graph,
                type(obj) is int))
        return True

    depth = 0
    while level and cut is None:
        following: list[_Node] = []
        for node in level:
            looked += 1
            if looked & 255 == 0 and clock() > deadline:
                cut = f"search stopped at {budget.max_ms:g} ms"
                break
            if looked > budget.max_objects:
                cut = f"search stopped after {budget.max_objects:,} objects"
                break
            obj = node.obj
            kind = _kind(obj)
            if kind == _INT:
                owned(node, depth, obj, kind)
                continue
            if kind in _OWNERS and owned(node, depth, obj, kind):
                if kind != _TENSOR:
                    continue  # an array: nothing in it holds more
                if getattr(obj, "grad_fn", None) is not None:
                    graphs.append((node, depth))
            if depth >= MAX_DEPTH:
                continue
            try:
                edges = list(_items(obj, names))
            except Exception:  # an object that cannot be looked into: nothing found in it
                continue
            for step, child in edges:
                if id(child) in seen or not _worth(child, ints):
                    continue
                seen.add(id(child))
                element = (_element_word(child) if depth == 0 and node.root.kind != TRACEBACK
                           else node.element)
                following.append(_Node(child, node, step, node.root, element, node.graph))
        if cut is None and len(chains) == len(wanted.starts):
            break  # every block has a chain: the longer ones are not wanted
        level = following
        depth += 1
    keep: list[Any] = []  # each saved tensor stays alive while its id is compared
    for node, at in graphs:  # the autograd graphs' saved tensors, once every name was tried
        if cut is not None:
            break
        path = node.path() + ".<autograd graph>"
        graph = _Node(None, node, ".<autograd graph>", node.root, node.element, True)
        for saved in _graph_tensors(node.obj, MAX_GRAPH_NODES):
            if id(saved) not in seen:
                seen.add(id(saved))
                keep.append(saved)
                looked += 1
                owned(graph, at + 1, saved, _kind(saved), path)
    for found in chains.values():
        found.sort(key=lambda c: (c.graph, c.depth))
    return Search(chains, looked, (clock() - start) * 1000.0, cut)


def _worth(obj: Any, ints: bool) -> bool:
    """Whether the search should look at ``obj`` at all: not a number or a string (nor an int
    when no handle is live)."""
    kind = _kind(obj)
    return kind != _SKIP and (ints or kind != _INT)


# Note [Holders by reference chain]: a block is held by whoever keeps an object that owns it
# alive. The search goes down from roots, breadth first, along the edges a user can write (an
# item, an attribute, a closure cell, a frame's local), so the first chain found to a block is
# a shortest one and prints as code the user can act on (``del hooks[3]``). Every object is
# looked at once: one reached from two roots is named by the first (the namespace comes first,
# then the user's modules, then the last traceback, then IPython's output cache). The search
# stops at the first depth by which every block has a chain (so every chain of that length is
# still found), and when the budget is spent (``Budget``: 200,000 objects or 50 ms), saying so.
# The tensors an autograd graph saved are looked at last, once every name has been tried, so a
# parameter that the graph also saved keeps its module's name. ``gc.get_referrers`` would find
# holders that no name reaches (a C extension's internals), but costs a pass over every object
# the collector tracks for each step up; the search goes down instead, and what no chain reaches
# is reported as held "by no variable".
