"""Which user variables hold a block: for the blocks that survive a trace, the OOM panel and the
per-cell ledger.

A variable holds a block when it is a CuPy array (anything with ``.data.ptr`` and ``.nbytes``)
whose bytes fall in the block. On the simulated device addresses are plain ints, so an int that
equals a live block's address also counts as holding it, unless ``addresses=False``: an int
keeps nothing alive (``del`` on it frees nothing), so the OOM panel does not count it. Lists,
tuples and dicts are looked into one level deep (``xs[3]``, ``d['w']``), at most
``MAX_CONTAINER_ITEMS`` elements of each.

``find_holders`` names every holder (``losses[3]``); ``holder_groups`` sums them by variable, so
a list that grew in a loop reads as one line: ``losses (list of 20 × 64 MiB)``.

PyTorch's objects are recognised by their surface, never by importing torch: a tensor (its type
has ``untyped_storage``) holds the block of ``untyped_storage().data_ptr()`` and ``nbytes()``; a
module (``named_parameters`` and ``named_buffers``) holds its parameters, their ``.grad`` and its
buffers, named by attribute path (``model.0.weight``, ``model.0.weight.grad``); an optimizer
(``state`` and ``param_groups``) holds its state tensors, named by the parameter's path where a
module in the namespace has it (``opt.state[model.0.weight].exp_avg``), else by its place in
``param_groups`` (``opt.state[param_groups[0][3]].exp_avg``).

``holder_role`` reads a holder's name back into its role (``HOLDER_ROLES``): a module's
parameter or buffer, a gradient, optimizer state or any other variable; ``HOLDER_BANDS`` are
the timeline's bands by holder, those four then ``NO_HOLDER`` and ``FREED``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.data.units import BINARY_UNITS, format_bytes

__all__ = ["FREED", "GRADIENTS", "HOLDER_BANDS", "HOLDER_ROLES", "MAX_CONTAINER_ITEMS",
           "NO_HOLDER", "OPTIMIZER_STATE", "OTHER_VARIABLES", "PARAMETERS", "HolderGroup",
           "find_holders", "holder_groups", "holder_role"]

#: Elements of one list/tuple/dict looked at when searching for holders.
MAX_CONTAINER_ITEMS = 1000


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

# ``opt.state[<param>].<key>``; ``<module path>.grad``; ``<variable>.<module path>``.
_OPTIMIZER_NAME = re.compile(r"[^.\[]+\.state\[.*\]\.[^.\[\]]+")
_GRADIENT_NAME = re.compile(r"[^.\[]+\..*\.grad")
_MODULE_NAME = re.compile(r"[^.\[]+\..+")


def holder_role(name: str) -> str:
    """The role (one of ``HOLDER_ROLES``) of a holder named as ``find_holders`` names it:
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


def _pointer_range(obj: Any) -> tuple[int, int] | None:
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return (obj, 0) if obj > 0 else None
    if getattr(type(obj), "untyped_storage", None) is not None:  # a torch.Tensor
        try:
            storage = obj.untyped_storage()
            ptr, nbytes = int(storage.data_ptr()), int(storage.nbytes())
        except Exception:
            return None
        return (ptr, nbytes) if ptr else None
    data = getattr(type(obj), "data", None)  # avoid triggering properties on arbitrary objects
    if data is None or not hasattr(obj, "nbytes"):
        return None
    try:
        ptr = int(obj.data.ptr)
        nbytes = int(obj.nbytes)
    except Exception:
        return None
    return (ptr, nbytes) if ptr else None


# What an object of a type can be, to the search: never a holder, a plain address (an int on the
# simulated device), or array-like (its type has ``data``: look at ``.data.ptr``). Decided once a
# type, so that a list of 10,000 floats costs one ``set(map(type, ...))`` and no loop.
_NEVER, _ADDRESS, _ARRAY_LIKE = 0, 1, 2


def _kind_of(t: type) -> int:
    if t is bool:
        return _NEVER
    if issubclass(t, int):
        return _ADDRESS
    if getattr(t, "untyped_storage", None) is not None:  # a torch.Tensor
        return _ARRAY_LIKE
    return _ARRAY_LIKE if getattr(t, "data", None) is not None else _NEVER


def _is_module(value: Any) -> bool:
    t = type(value)
    return callable(getattr(t, "named_parameters", None)) and callable(
        getattr(t, "named_buffers", None))


def _is_optimizer(value: Any) -> bool:
    return (not isinstance(value, type) and isinstance(getattr(value, "state", None), Mapping)
            and isinstance(getattr(value, "param_groups", None), list))


def _module_tensors(name: str, module: Any) -> list[tuple[str, Any]]:
    """``(path, tensor)`` of a module's parameters, their gradients and its buffers."""
    out: list[tuple[str, Any]] = []
    try:
        for pname, p in module.named_parameters():
            out.append((f"{name}.{pname}", p))
            grad = getattr(p, "grad", None)
            if grad is not None:
                out.append((f"{name}.{pname}.grad", grad))
            if len(out) >= MAX_CONTAINER_ITEMS:
                return out
        for bname, b in module.named_buffers():
            if b is not None:
                out.append((f"{name}.{bname}", b))
            if len(out) >= MAX_CONTAINER_ITEMS:
                break
    except Exception:  # a module that cannot list itself: nothing found in it
        return out
    return out


def _optimizer_tensors(name: str, opt: Any, paths: Mapping[int, str]) -> list[tuple[str, Any]]:
    """``(path, tensor)`` of an optimizer's state, by the parameter's path."""
    where: dict[int, str] = {}
    try:
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group.get("params", ()) if isinstance(group, dict) else ()):
                where.setdefault(id(p), paths.get(id(p), f"param_groups[{g}][{i}]"))
        out: list[tuple[str, Any]] = []
        for p, state in list(opt.state.items())[:MAX_CONTAINER_ITEMS]:
            pname = where.get(id(p)) or paths.get(id(p), "?")
            if isinstance(state, Mapping):
                out += [(f"{name}.state[{pname}].{k}", v) for k, v in state.items()]
        return out
    except Exception:
        return []


class _Matcher:
    """Which block of ``blocks`` an object holds, with the cheap rejections done first."""

    def __init__(self, blocks: Sequence[tuple[int, int]], addresses: bool = True) -> None:
        self.addresses = addresses  # whether an int equal to a block's address counts
        self.ordered = sorted(blocks)
        self.starts = [a for a, _ in self.ordered]
        self.exact = set(self.starts)
        self.end = max(a + size for a, size in self.ordered)
        self.kinds: dict[type, int] = {}

    def kind(self, t: type) -> int:
        k = self.kinds.get(t)
        if k is None:
            k = self.kinds[t] = _kind_of(t)
        return k

    def block_of(self, obj: Any) -> int | None:
        k = self.kind(type(obj))
        if k == _NEVER:
            return None
        if k == _ADDRESS:
            return int(obj) if self.addresses and obj in self.exact else None
        rng = _pointer_range(obj)
        if rng is None:
            return None
        ptr, nbytes = rng
        if ptr < self.starts[0] or ptr >= self.end:
            return None
        i = bisect.bisect_right(self.starts, ptr) - 1
        addr, size = self.ordered[i]
        if addr <= ptr and ptr + max(nbytes, 1) <= addr + size:
            return addr
        return None

    def may_hold(self, items: list[Any]) -> bool:
        """False when no element of ``items`` can hold a block: skip the loop over them."""
        kinds = {self.kind(t) for t in set(map(type, items))}
        if _ARRAY_LIKE in kinds:
            return True
        if _ADDRESS not in kinds or not self.addresses:
            return False
        try:
            return not self.exact.isdisjoint(items)
        except TypeError:  # an unhashable element: look at each
            return True


def _walk(namespace: Mapping[str, Any], matcher: _Matcher
          ) -> dict[str, tuple[str | None, int, list[tuple[str, int]]]]:
    """variable -> (container kind or None, its length, [(holder name, block address)])."""
    out: dict[str, tuple[str | None, int, list[tuple[str, int]]]] = {}
    block_of = matcher.block_of
    items_of = [(n, v) for n, v in list(namespace.items())
                if not n.startswith("_") and not isinstance(v, type)]
    modules = {n: _module_tensors(n, v) for n, v in items_of if _is_module(v)}
    paths = {id(t): path for tensors in modules.values() for path, t in tensors
             if not path.endswith(".grad")}
    for name, value in items_of:
        found: list[tuple[str, int]] = []
        kind: str | None = None
        length = 1
        tensors = (modules.get(name) if name in modules
                   else _optimizer_tensors(name, value, paths) if _is_optimizer(value) else None)
        if tensors is not None:
            kind = "module" if name in modules else "optimizer"
            length = len(tensors)
            for path, tensor in tensors:
                addr = block_of(tensor)
                if addr is not None:
                    found.append((path, addr))
        elif isinstance(value, (list, tuple)):
            kind, length = ("list" if isinstance(value, list) else "tuple"), len(value)
            items = list(value[:MAX_CONTAINER_ITEMS])
            if matcher.may_hold(items):
                for i, item in enumerate(items):
                    addr = block_of(item)
                    if addr is not None:
                        found.append((f"{name}[{i}]", addr))
        elif isinstance(value, dict):
            kind, length = "dict", len(value)
            pairs = list(value.items())[:MAX_CONTAINER_ITEMS]
            if matcher.may_hold([item for _k, item in pairs]):
                for k, item in pairs:
                    addr = block_of(item)
                    if addr is not None:
                        found.append((f"{name}[{k!r}]", addr))
        else:
            addr = block_of(value)
            if addr is not None:
                found.append((name, addr))
        if found:
            out[name] = (kind, length, found)
    return out


def find_holders(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]], *,
                 addresses: bool = True) -> dict[int, list[str]]:
    """Which names of ``namespace`` hold each block ``(address, size)``: address -> names.

    See the module docstring for what counts as holding a block."""
    if not blocks:
        return {}
    out: dict[int, list[str]] = {}
    for _kind, _length, found in _walk(namespace, _Matcher(blocks, addresses)).values():
        for name, addr in found:
            names = out.setdefault(addr, [])
            if name not in names:
                names.append(name)
    return out


@dataclass(frozen=True)
class HolderGroup:
    """One variable and the blocks it holds, directly or through its elements."""

    name: str  # the variable
    container: str | None  # "list", "tuple", "dict", "module" or "optimizer": held through items
    items: int  # elements holding one of the blocks (1 for a variable that holds one itself)
    length: int  # elements in the container (1 for a direct holder)
    addresses: tuple[int, ...]  # the distinct blocks held, in address order
    bytes: int  # their total size
    item_size: int | None  # the block size of every holding element, when they all agree

    def describe(self) -> str:
        """``x (64.0 MiB)``, ``losses (list of 20 × 64 MiB)``, ``cache (dict of 3, 96.0 MiB)``;
        a container longer than ``MAX_CONTAINER_ITEMS`` says how many elements were looked at."""
        if self.container is None:
            return f"{self.name} ({format_bytes(self.bytes)})"
        if self.item_size is not None:
            what = f"{self.items} × {_size(self.item_size)}"
        else:
            what = f"{self.items}, {format_bytes(self.bytes)}"
        if self.length > MAX_CONTAINER_ITEMS:
            return (f"{self.name} ({self.container} of {self.length}, the first "
                    f"{MAX_CONTAINER_ITEMS} looked at: {what})")
        return f"{self.name} ({self.container} of {what})"


def holder_groups(namespace: Mapping[str, Any], blocks: Sequence[tuple[int, int]]
                  ) -> list[HolderGroup]:
    """The variables of ``namespace`` that hold any of ``blocks`` ``(address, size)``, one group
    a variable, most bytes first (then by name)."""
    if not blocks:
        return []
    sizes = dict(blocks)
    groups = []
    for name, (kind, length, found) in _walk(namespace, _Matcher(blocks)).items():
        addresses = tuple(sorted({addr for _n, addr in found}))
        item_sizes = {sizes[addr] for _n, addr in found}
        groups.append(HolderGroup(
            name=name, container=kind, items=len(found), length=length, addresses=addresses,
            bytes=sum(sizes[a] for a in addresses),
            item_size=item_sizes.pop() if len(item_sizes) == 1 else None))
    groups.sort(key=lambda g: (-g.bytes, g.name))
    return groups
