"""Owners registered with ``data.owners`` reach the holder search (Note [The order owners are
asked in]), and library markers registered with ``data.sites`` reach the site naming."""

from __future__ import annotations

from typing import Any

import pytest
from cupy_like import Array

from jupyter_gpumem.data import owners, sites
from jupyter_gpumem.data.holders import find
from jupyter_gpumem.data.owners import BUILT_IN, CUPY_ARRAY, CUPY_POINTER, TORCH_TENSOR, Owner

MiB = 1 << 20
BLOCK = (0x7000000000, 64 * MiB)


class Buffer:
    """A third party's array: ``.data`` (which CuPy's test would claim) and ``.address``."""

    data = b"host bytes"

    def __init__(self, address: int) -> None:
        self.address = address


def _buffer_type(t: type) -> bool:
    return t is Buffer


def _buffer_memory(obj: Any) -> tuple[int, int]:
    return obj.address, 8


BUFFER = Owner("Buffer", _buffer_type, _buffer_memory)


@pytest.fixture(autouse=True)
def fresh():
    before = owners.registered()
    markers = sites.library_markers()[len(sites.LIBRARY_MARKERS):]
    owners.reset()
    sites.reset_library_files()
    yield
    owners.reset()
    owners.register(before)
    sites.reset_library_files()
    sites.register_library_files(markers)


def test_the_built_ins_and_the_order_they_are_asked_in() -> None:
    assert BUILT_IN == (TORCH_TENSOR, CUPY_POINTER, CUPY_ARRAY)
    owners.register([BUFFER, CUPY_ARRAY])  # a built-in is not registered again
    assert owners.registered() == (BUFFER,)
    assert owners.search_owners() == (TORCH_TENSOR, CUPY_POINTER, BUFFER, CUPY_ARRAY)
    g = owners.generation()
    owners.register([BUFFER])
    assert owners.generation() == g  # nothing new: the search's cache stays


def test_a_registered_owner_is_asked_before_cupy_s_broad_test() -> None:
    ns = {"buf": Buffer(BLOCK[0] + 16), "arr": Array(BLOCK[0], 1024)}
    # CuPy's test claims Buffer (it has ``data``) and finds no pointer in it
    assert find(ns, [BLOCK], modules=False).names == {BLOCK[0]: ["arr"]}
    owners.register([BUFFER])  # the search's per-type cache forgets what it decided
    assert find({"buf": ns["buf"]}, [BLOCK], modules=False).names == {BLOCK[0]: ["buf"]}


def test_an_owner_whose_test_fails_is_not_the_type_s() -> None:
    def broken(t: type) -> bool:
        raise RuntimeError("no")

    owners.register([Owner("broken", broken, _buffer_memory)])
    ns = {"arr": Array(BLOCK[0], 1024)}
    assert find(ns, [BLOCK], modules=False).names == {BLOCK[0]: ["arr"]}


def test_bad_registrations_change_nothing() -> None:
    with pytest.raises(TypeError, match="an owner is a jupyter_gpumem Owner"):
        owners.register([BUFFER, "Buffer"])  # type: ignore[list-item]
    assert owners.registered() == ()
    with pytest.raises(TypeError, match="a library file marker is a non-empty string"):
        sites.register_library_files(["/mylib/", ""])
    assert sites.library_markers() == sites.LIBRARY_MARKERS


def test_registered_markers_name_the_user_s_line() -> None:
    frames = [{"filename": "/opt/mylib/core.py", "line": 3, "name": "alloc"},
              {"filename": "/home/me/run.py", "line": 7, "name": "<module>"}]
    assert sites.site_of(frames) == "core.py:3"
    sites.register_library_files(["/mylib/", "/mylib/"])
    assert sites.library_markers() == (*sites.LIBRARY_MARKERS, "/mylib/")
    assert sites.site_of(frames) == "run.py:7"
