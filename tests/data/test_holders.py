"""Holders by reference chain: every kind of holder a notebook leaks through, named as the user
would write it, and summed by the root the user acts on (Note [Holders by reference chain])."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from cupy_like import Array

from jupyter_gpumem.data.holders import (
    MAX_CONTAINER_ITEMS,
    find,
    find_holders,
    holder_groups,
    roots_of,
)
from jupyter_gpumem.data.reach import Budget, user_module

MiB = 1 << 20
BLOCKS = [(0x10000000 + i * 64 * MiB, 64 * MiB) for i in range(40)] + [(0x90000000, 2 * MiB)]


def block(i: int) -> int:
    return BLOCKS[i][0]


def described(ns: dict[str, Any], **kwargs: Any) -> list[str]:
    return [g.describe() for g in find(ns, BLOCKS, modules=False, **kwargs).groups]


def test_groups_by_variable_most_bytes_first() -> None:
    ns = {
        "losses": [Array(block(i), 64 * MiB - 100) for i in range(20)],
        "w": Array(0x90000000 + 4096, 1024),  # a view inside the 2 MiB block
        "n": 3, "flag": True,
    }
    groups = holder_groups(ns, BLOCKS)
    assert [g.describe() for g in groups] == ["losses (list of 20 × 64 MiB)", "w (2.0 MiB)"]
    assert groups[0].addresses == tuple(block(i) for i in range(20))
    assert groups[0].bytes == 20 * 64 * MiB
    assert find_holders(ns, BLOCKS)[block(0)] == ["losses[0]"]


def test_a_plain_int_never_holds_a_block() -> None:
    # simulated handles of freed blocks whose addresses were reused: an int keeps nothing alive
    ns = {"acts": [block(0), block(1)], "p": block(2), "tmp2": (block(3),),
          "b": Array(block(4), 8)}
    assert find_holders(ns, BLOCKS) == {block(4): ["b"]}


def test_closures_in_a_list() -> None:
    def make_hook(n: int) -> Any:
        buf = Array(block(n), 1024)

        def hook() -> Any:
            return buf

        return hook

    hooks = [make_hook(n) for n in range(8)]
    found = find({"hooks": hooks}, BLOCKS, modules=False)
    assert found.names[block(3)] == ["hooks[3].<closure>.buf"]
    assert [g.describe() for g in found.groups] == ["hooks (list of 8 closures, 512 MiB)"]


def test_underscore_caches_nested_containers_and_attributes() -> None:
    class Model:
        def __init__(self) -> None:
            self.cache = {"k": Array(block(5), 64)}

    ns = {"_plans": {(1024, 1024, 16): Array(block(0), 64)},
          "_many": {i: Array(block(10 + i), 64) for i in range(3)},
          "state": {"a": {"b": [0, 1, Array(block(1), 64)]}},
          "model": Model()}
    assert sorted(described(ns)) == sorted([
        "_many (dict of 3 × 64 MiB)", "_plans[(1024, 1024, 16)] (64.0 MiB)",
        "model.cache['k'] (64.0 MiB)", "state['a']['b'][2] (64.0 MiB)"])


class Cache:
    """A user class whose class attribute keeps arrays."""

    store: ClassVar[dict[str, Any]] = {}


def test_a_class_attribute() -> None:
    Cache.store["k"] = Array(block(6), 64)
    try:
        assert find_holders({"Cache": Cache}, BLOCKS)[block(6)] == ["Cache.store['k']"]
    finally:
        Cache.store.clear()


def test_the_search_keeps_no_class_of_the_users_alive() -> None:
    import gc
    import weakref

    ns: dict[str, Any] = {"__name__": "__main__"}  # as a notebook's namespace
    exec("class Registry:\n    kept = []\nobj = Registry()", ns)
    ns["Registry"].kept.append(Array(block(6), 64))
    assert find_holders(ns, BLOCKS)[block(6)] == ["Registry.kept[0]"]
    gone = weakref.ref(ns["Registry"])
    ns.clear()
    gc.collect()
    assert gone() is None  # nor, through it, the arrays in its class attributes


def test_generator_frame_partial_bound_method_and_lru_cache() -> None:
    def batches() -> Iterator[int]:
        buf = Array(block(7), 64)
        yield len([buf])

    gen = batches()
    next(gen)

    class Runner:
        def __init__(self) -> None:
            self.out = Array(block(8), 64)

        def run(self) -> None: ...

    @functools.cache
    def plan(n: int) -> Array:
        return Array(block(9 + n), 64)

    plan(20)
    ns = {"gen": gen, "go": Runner().run, "bound": functools.partial(print, Array(block(12), 8)),
          "plan": plan}
    names = find_holders(ns, BLOCKS)
    assert names[block(7)] == ["gen.<frame>.buf"]
    assert names[block(8)] == ["go.__self__.out"]
    assert names[block(12)] == ["bound.args[0]"]
    assert names[block(29)] == ["plan.<lru_cache>[20]"]  # the cached call: plan(20)


def test_reached_from_several_roots_named_once_by_the_shortest_chain() -> None:
    arr = Array(block(0), 64)
    ns = {"deep": {"x": {"y": arr}}, "short": arr, "also": [arr]}
    found = find(ns, BLOCKS, modules=False)
    assert found.names[block(0)] == ["short"]
    assert [g.name for g in found.groups] == ["short"]


def test_a_view_and_its_base_are_two_holders() -> None:
    ns = {"a": Array(block(0), 64), "b": Array(block(0) + 4096, 64)}
    assert find_holders(ns, BLOCKS)[block(0)] == ["a", "b"]


def test_ipython_names_are_not_roots_but_the_output_cache_is() -> None:
    arr = Array(block(0), 64)
    ns = {"_": arr, "__": arr, "_5": arr, "_i5": "x = 1", "In": ["", "x"], "exit": object(),
          "Out": {5: arr}, "get_ipython": lambda: None}
    assert [r.path for r in roots_of(ns, modules=False, last_error=False)] == ["Out"]
    assert described(ns, last_error=False) == ["Out[5] (64.0 MiB, IPython's output cache)"]


def test_user_module_globals(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "helpers_for_holders.py").write_text("_CACHE = {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    helpers = importlib.import_module("helpers_for_holders")
    try:
        helpers._CACHE["k"] = Array(block(14), 64)
        found = find({}, BLOCKS)
        assert found.names[block(14)] == ["helpers_for_holders._CACHE['k']"]
        assert found.groups[0].name == "helpers_for_holders"
    finally:
        del sys.modules["helpers_for_holders"]


def test_a_pip_target_folder_on_the_path_is_no_users(tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # ``pip install --target DIR`` and DIR on PYTHONPATH: installed code, not the user's
    (tmp_path / "somelib-1.0.dist-info").mkdir()
    (tmp_path / "somelib_for_holders.py").write_text("_CACHE = {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = importlib.import_module("somelib_for_holders")
    try:
        lib._CACHE["k"] = Array(block(16), 64)
        assert not user_module(lib)
        assert find({}, BLOCKS).names == {}
    finally:
        del sys.modules["somelib_for_holders"]


def _prepare(n: int) -> None:
    tmp = Array(block(n), 64)
    raise ValueError(f"bad shape for {tmp.nbytes}")


def test_the_last_traceback_keeps_a_functions_locals(monkeypatch: pytest.MonkeyPatch) -> None:
    cell_file = "<ipython-input-4-abc>"
    code = compile("_prepare(15)", cell_file, "exec")
    try:
        exec(code, {"_prepare": _prepare})
    except ValueError as exc:
        monkeypatch.setattr(sys, "last_value", exc, raising=False)
        monkeypatch.setattr(sys, "last_traceback", exc.__traceback__, raising=False)
        monkeypatch.setattr(sys, "last_exc", exc, raising=False)
    found = find({}, BLOCKS, cell_files={cell_file: 4}, modules=False)
    assert found.names[block(15)] == ["_prepare's local tmp"]
    assert [g.describe() for g in found.groups] == [
        "the traceback of the error in cell [4]: _prepare's local tmp (64.0 MiB)"]
    # without knowing the cell
    assert find({}, BLOCKS, modules=False).groups[0].name == "the traceback of the last error"
    # a variable of the namespace comes first
    tb = sys.last_traceback
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert find({"x": tb.tb_frame.f_locals["tmp"]}, BLOCKS,
                modules=False).names[block(15)] == ["x"]


def test_long_containers_say_how_many_were_looked_at() -> None:
    arr = Array(block(0), 64)
    ns = {"long": [arr] + [Array(block(1), 64) for _ in range(MAX_CONTAINER_ITEMS + 5)]}
    assert described(ns) == [f"long (list of {MAX_CONTAINER_ITEMS + 6}, the first "
                             f"{MAX_CONTAINER_ITEMS} looked at: 2 × 64 MiB)"]


def test_mixed_containers_and_floats_are_searched_or_skipped() -> None:
    a = block(3)
    ns = {"mixed": [[1, 2], {"x": 1}, Array(a, 8)], "floats": [0.5] * 50,
          "view": [Array(a + 512, 64)]}
    assert find_holders(ns, BLOCKS) == {a: ["mixed[2]", "view[0]"]}
    assert holder_groups(ns, []) == []
    assert holder_groups({"n": 5}, BLOCKS) == []


def test_the_budget_cuts_the_search_and_says_so() -> None:
    chain: Any = Array(block(0), 64)
    for _ in range(50):
        chain = [chain]
    ns = {"nested": chain, **{f"v{i}": [i] for i in range(300)}}
    found = find(ns, BLOCKS, modules=False, budget=Budget(max_objects=100))
    assert found.cut == "search stopped after 100 objects"
    assert found.names == {}
    ticks = iter(range(0, 10**9, 10))
    found = find({f"v{i}": [[i]] for i in range(2000)}, BLOCKS, modules=False,
                 budget=Budget(max_ms=5), clock=lambda: next(ticks) / 1000)
    assert found.cut == "search stopped at 5 ms"
    with pytest.raises(ValueError, match="budget"):
        Budget(max_objects=0)
