"""Which user variables hold a block, in the words every view uses: for the blocks that survive a
trace, the OOM panel, the per-cell ledger and the footer.

``find(namespace, blocks)`` runs the reference-chain search (``data.reach``: Note [Holders by
reference chain]) from the roots a user can act on:

- the names of ``namespace`` (the shell's ``user_ns``), ``_``-prefixed ones too, but none of
  IPython's own (``IPYTHON_NAMES``: ``_``, ``_N``, ``In``, ``exit`` ...);
- the globals of the user's own modules (``reach.user_module``: outside the installed packages);
- the locals of the frames that the last exception's traceback keeps (``sys.last_traceback``,
  ``sys.last_exc``), named ``prepare's local tmp`` and summed under ``the traceback of the error
  in cell [4]``;
- IPython's output cache, ``Out[2]``.

It returns ``Holders``: every block's chains as code the user could write
(``hooks[3].<closure>.buf``, ``_plans[(1024, 1024, 16)]``, ``model.0.weight.grad``,
``opt.state[model.0.weight].exp_avg``, ``running.<autograd graph>``), and ``groups``, one
``HolderGroup`` a root that the user acts on, most bytes first: ``losses (list of 20 × 64 MiB)``,
``hooks (list of 8 closures, 1.0 GiB)``. A plain int never holds a block, even one equal to its
address: it keeps nothing alive.

``holder_role`` reads a holder's name back into its role (``HOLDER_ROLES``): a module's
parameter or buffer, a gradient, optimizer state or any other variable; ``HOLDER_BANDS`` are
the timeline's bands by holder, those four then ``NO_HOLDER`` and ``FREED``.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.data import reach
from jupyter_gpumem.data.reach import DEFAULT_BUDGET, MAX_CONTAINER_ITEMS, Budget, Chain, Root
from jupyter_gpumem.data.units import BINARY_UNITS, format_bytes

__all__ = [
    "FORGET_ERROR_CODE",
    "FREED",
    "GRADIENTS",
    "HOLDER_BANDS",
    "HOLDER_ROLES",
    "IPYTHON_NAMES",
    "MAX_CONTAINER_ITEMS",
    "NO_HOLDER",
    "OPTIMIZER_STATE",
    "OTHER_VARIABLES",
    "PARAMETERS",
    "HolderGroup",
    "Holders",
    "find",
    "find_holders",
    "holder_groups",
    "holder_role",
    "roots_of",
]


#: The roles of a holder, in the order a block with several holders takes the first of.
PARAMETERS = "parameters & buffers"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer state"
OTHER_VARIABLES = "other variables"
HOLDER_ROLES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, OTHER_VARIABLES)
#: The bands by holder past the roles: live at the end with no holder, and freed before the end.
NO_HOLDER = "held by no variable"
FREED = "freed during the trace (activations, temporaries)"
HOLDER_BANDS = (*HOLDER_ROLES, NO_HOLDER, FREED)

#: IPython's own names in a shell's namespace: never roots (``Out`` is, as the output cache).
IPYTHON_NAMES = frozenset({"_", "__", "___", "_ih", "_oh", "_dh", "In", "Out", "exit", "quit",
                           "get_ipython", "_i", "_ii", "_iii"})
_IPYTHON_NUMBERED = re.compile(r"_i?\d+")

#: What ``%gpumem forget-error`` does, in plain Python (the footer and the OOM panel offer it).
#: Clearing a frame drops its fast locals; reading ``f_locals`` after it also empties the
#: snapshot of them that Python 3.11 and 3.12 keep once anything (IPython's traceback printer)
#: has read them.
FORGET_ERROR_CODE = ("import sys, traceback; [(f.clear(), f.f_locals) for f, _ in "
                     "traceback.walk_tb(sys.last_traceback)]; "
                     "sys.last_type = sys.last_value = sys.last_traceback = None")

# ``opt.state[<param>].<key>``; ``<module path>.grad``; ``<variable>.<module path>``: paths of
# attributes only (a chain through an item or a closure, ``[`` or ``<``, is another variable's).
_OPTIMIZER_NAME = re.compile(r"[^.\[<]+\.state\[.*\]\.[^.\[\]<]+")
_GRADIENT_NAME = re.compile(r"[^.\[<]+\.[^\[<]*\.grad")
_MODULE_NAME = re.compile(r"[^.\[<]+\.[^\[<]+")


def holder_role(name: str) -> str:
    """The role (one of ``HOLDER_ROLES``) of a holder named as ``find`` names it:
    ``opt.state[model.0.weight].exp_avg`` is optimizer state, ``model.0.weight.grad`` a
    gradient, ``model.0.weight`` a parameter (or buffer), ``x`` and ``losses[3]`` other
    variables."""
    if _OPTIMIZER_NAME.fullmatch(name):
        return OPTIMIZER_STATE
    if _GRADIENT_NAME.fullmatch(name):
        return GRADIENTS
    if _MODULE_NAME.fullmatch(name):
        return PARAMETERS
    return OTHER_VARIABLES


def _size(n: int) -> str:
    """``format_bytes`` without a ``.0`` on a whole number of units: ``64 MiB``, ``1.5 GiB``."""
    text = format_bytes(n)
    number, _, unit = text.partition(" ")
    if number.endswith(".0") and n % dict(BINARY_UNITS)[unit] == 0:
        return f"{number[:-2]} {unit}"
    return text



# -- roots ----------------------------------------------------------------------------------------

def _ipython_name(name: str) -> bool:
    return name in IPYTHON_NAMES or (name[:1] == "_" and bool(_IPYTHON_NUMBERED.fullmatch(name)))


def _error_roots(cell_files: Mapping[str, int]) -> list[Root]:
    """The locals of the user's frames that the last exception's traceback keeps, one root a
    local, summed under ``the traceback of the error in cell [N]``."""
    value = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(value, "__traceback__", None) or getattr(sys, "last_traceback", None)
    tracebacks: list[types.TracebackType] = []
    seen: set[int] = set()
    while tb is not None and id(tb) not in seen and len(tracebacks) < 16:
        seen.add(id(tb))
        tracebacks.append(tb)
        value = value.__cause__ or value.__context__ if value is not None else None
        tb = getattr(value, "__traceback__", None)
    cell: int | None = None
    frames: list[types.FrameType] = []
    for chain in tracebacks:
        step: types.TracebackType | None = chain
        while step is not None:
            frame = step.tb_frame
            filename = frame.f_code.co_filename
            if cell is None and filename in cell_files:
                cell = cell_files[filename]
            # a function's frame (a cell's own is the namespace), of user code
            if frame.f_code.co_flags & 0x1 and reach.user_file(filename):
                frames.append(frame)
            step = step.tb_next
    group = ("the traceback of the last error" if cell is None
             else f"the traceback of the error in cell [{cell}]")
    roots = []
    for frame in frames:
        owner = frame.f_code.co_name
        for name, value in reach.frame_locals(frame):
            roots.append(Root(group, f"{owner}'s local {name}", value, reach.TRACEBACK))
    return roots


def roots_of(namespace: Mapping[str, Any], cell_files: Mapping[str, int] | None = None, *,
             modules: bool = True, last_error: bool = True) -> list[Root]:
    """The roots of the search, in the order a holder reached from several is named by: the
    names of ``namespace``, the user's own modules (``modules``), the frames of the last
    exception (``last_error``), IPython's output cache."""
    roots = []
    values: set[int] = set()
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or _ipython_name(name) or (
                name.startswith("__") and name.endswith("__")):
            continue
        roots.append(Root(name, name, value))
        values.add(id(value))
    if modules:
        for module in reach.user_modules():
            if id(module) not in values:
                roots.append(Root(module.__name__, module.__name__, module, reach.MODULE))
    if last_error:
        roots += _error_roots(cell_files or {})
    out = namespace.get("Out")
    if isinstance(out, dict) and out:
        roots.append(Root("Out", "Out", out, reach.OUTPUT))
    return roots


# -- the groups -----------------------------------------------------------------------------------

def _plural(word: str) -> str:
    if word[:1].isupper():  # a class's name
        return f"{word} objects"
    return word + ("es" if word.endswith("s") else "s")


@dataclass(frozen=True)
class HolderGroup:
    """One root the user acts on and the blocks held through it."""

    name: str  # the root: a variable, a module, ``the traceback of the error in cell [4]``, Out
    #: "list", "tuple", "dict", "module" or "optimizer" when held through its items; else None
    container: str | None
    items: int  # chains holding one of the blocks (1 for a variable that holds one itself)
    length: int  # elements in the container (1 otherwise)
    addresses: tuple[int, ...]  # the distinct blocks held, in address order
    bytes: int  # their total size
    item_size: int | None  # the block size of every holding chain, when they all agree
    kind: str = reach.VARIABLE  # what the root is (``reach.VARIABLE``, ``TRACEBACK``, ...)
    paths: tuple[str, ...] = ()  # the chains, shortest first (``hooks[3].<closure>.buf``)
    element: str | None = None  # what the root's holding elements are ("closure"), if not arrays
    graph_bytes: int = 0  # bytes held through autograd graphs' saved tensors

    def describe(self) -> str:
        """``x (64.0 MiB)``, ``losses (list of 20 × 64 MiB)``, ``cache (dict of 3, 96.0 MiB)``,
        ``hooks (list of 8 closures, 1.0 GiB)``, ``_plans[(1024, 16)] (64.0 MiB)``,
        ``the traceback of the error in cell [4]: prepare's local tmp (2.0 GiB)``, and what an
        autograd graph keeps (``running (512 B; autograd graph: 993 MiB of saved tensors;
        running.detach() or .item() drops it)``); a container longer than
        ``MAX_CONTAINER_ITEMS`` says how many elements were looked at."""
        if not self.graph_bytes:
            return f"{self._what()})"
        whose = self.name if self.container is None else f"each of {self.name}"
        graph = (f"autograd graph: {format_bytes(self.graph_bytes)} of saved tensors; "
                 f"{whose}.detach() or .item() drops it)")
        if not self.paths:
            return f"{self.name} ({graph}"
        return f"{self._what()}; {graph}"

    def _what(self) -> str:
        """The description without its closing parenthesis."""
        size = format_bytes(self.bytes - self.graph_bytes)
        if self.kind == reach.TRACEBACK:
            locals_ = self.paths[0] + (f" and {len(self.paths) - 1} more"
                                       if len(self.paths) > 1 else "")
            return f"{self.name}: {locals_} ({size}"
        if self.kind == reach.OUTPUT:
            return f"{', '.join(self.paths[:3])} ({size}, IPython's output cache"
        if self.items == 1:
            return f"{self.paths[0] if self.paths else self.name} ({size}"
        if self.container is None:
            return (f"{self.name} ({self.items} blocks, {size}: "
                    f"{', '.join(self.paths[:2])}{', …' if self.items > 2 else ''}")
        each = "" if self.element is None else f" {_plural(self.element)}"
        if self.item_size is not None and self.element is None:
            what = f"{self.items} × {_size(self.item_size)}"
        else:
            what = f"{self.items}{each}, {size}"
        if self.length > MAX_CONTAINER_ITEMS:
            return (f"{self.name} ({self.container} of {self.length}, the first "
                    f"{MAX_CONTAINER_ITEMS} looked at: {what}")
        if self.container in ("module", "optimizer"):  # its tensors by name, as in the trace
            what += f": {self.paths[0]}{', …' if self.items > 1 else ''}"
        return f"{self.name} ({self.container} of {what}"


def _container(value: Any) -> tuple[str | None, int]:
    if isinstance(value, list | tuple):
        return ("list" if isinstance(value, list) else "tuple"), len(value)
    if isinstance(value, dict):
        return "dict", len(value)
    t = type(value)
    if callable(getattr(t, "named_parameters", None)) and callable(
            getattr(t, "named_buffers", None)):
        return "module", 1
    if reach.is_optimizer(value):
        return "optimizer", 1
    return None, 1


def _group(root: Root, chains: list[Chain], sizes: Mapping[int, int]) -> HolderGroup:
    """The group of one root: ``chains`` are the first chain of each block it holds."""
    direct = [c for c in chains if not c.graph]
    graph = {c.address for c in chains if c.graph}
    addresses = tuple(sorted({c.address for c in chains}))
    kind, length = (_container(root.value) if root.kind == reach.VARIABLE else (None, 1))
    if all(c.path == root.path for c in direct):
        kind, length = None, 1
    item_sizes = {sizes[c.address] for c in direct}
    elements = {c.element for c in direct}
    return HolderGroup(
        name=root.group, container=kind, items=len(direct), length=length,
        addresses=addresses, bytes=sum(sizes[a] for a in addresses),
        item_size=item_sizes.pop() if len(item_sizes) == 1 else None, kind=root.kind,
        paths=tuple(dict.fromkeys(c.path for c in direct)),
        element=elements.pop() if len(elements) == 1 else "object",
        graph_bytes=sum(sizes[a] for a in graph))


@dataclass
class Holders:
    """What the search found for some blocks: every block's chains and the groups by root."""

    names: dict[int, list[str]]  # address -> the chains' paths, shortest first
    groups: list[HolderGroup]  # one a root the user acts on, most bytes first
    cut: str | None = None  # "search stopped at 50 ms" when the budget ran out
    elapsed_ms: float = 0.0
    objects: int = 0  # objects looked at
    held: frozenset[int] = field(default_factory=frozenset)  # addresses with a holder
    chains: dict[int, list[Chain]] = field(default_factory=dict)  # address -> shortest first

    def chain(self, address: int) -> Chain:
        """The first (a shortest) chain that holds the block at ``address``; KeyError if none."""
        return self.chains[address][0]


def find(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]], *,
         cell_files: Mapping[str, int] | None = None, budget: Budget = DEFAULT_BUDGET,
         modules: bool = True, last_error: bool = True, clock: Any = None) -> Holders:
    """Who holds each of ``blocks`` ``(address, size)``: the chains from the roots of
    ``namespace`` (``roots_of``), and one group a root, each block in the group of its first
    chain. ``clock`` (seconds) times the budget; tests pass their own."""
    if not blocks:
        return Holders({}, [])
    roots = roots_of(namespace, cell_files, modules=modules, last_error=last_error)
    found = (reach.search(roots, blocks, budget) if clock is None
             else reach.search(roots, blocks, budget, clock=clock))
    sizes = dict(blocks)
    names = {addr: list(dict.fromkeys(c.path for c in chains))
             for addr, chains in found.chains.items()}
    return Holders(names, group([c[0] for c in found.chains.values()], sizes), found.cut,
                   found.elapsed_ms, found.objects, frozenset(found.chains), found.chains)


def group(chains: Sequence[Chain], sizes: Mapping[int, int]) -> list[HolderGroup]:
    """``chains`` (the first of each block) summed by the root the user acts on, most bytes
    first (then by name): the words of the footer, the ledger and the OOM panel's rows."""
    by_root: dict[str, tuple[Root, list[Chain]]] = {}
    for chain in chains:
        by_root.setdefault(chain.root.group, (chain.root, []))[1].append(chain)
    groups = []
    for root, mine in by_root.values():
        mine.sort(key=lambda c: c.depth)  # then as found: a module's own order
        groups.append(_group(root, mine, sizes))
    groups.sort(key=lambda g: (-g.bytes, g.name))
    return groups


def find_holders(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]], *,
                 cell_files: Mapping[str, int] | None = None) -> dict[int, list[str]]:
    """Which chains from ``namespace`` hold each block ``(address, size)``: address -> paths."""
    return find(namespace, blocks, cell_files=cell_files).names


def holder_groups(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]], *,
                  cell_files: Mapping[str, int] | None = None) -> list[HolderGroup]:
    """The roots of ``namespace`` that hold any of ``blocks`` ``(address, size)``, one group a
    root, most bytes first (then by name)."""
    return find(namespace, blocks, cell_files=cell_files).groups
