"""Run CuPy's own test files with jupyter_gpumem's allocator installed for the whole session.

Many of CuPy's memory tests set another allocator and, on teardown, put back CuPy's default
pool rather than what was there; ours is installed again before every test. After each test our
cache is emptied, so blocks we keep do not shrink the device for tests that measure it. The
summary lists the tests that allocated through our allocator (the others test CuPy's own pools
or allocators, or allocate nothing). With ``JUPYTER_GPUMEM_SHARE_TORCH=1``, PyTorch allocates
from the same cache for the session (``install_torch``, before PyTorch starts CUDA), with a few
of its tensors alive in it throughout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import jupyter_gpumem as gm

_used: dict[str, int] = {}  # test id -> allocations through our allocator
_reinstalled: list[str] = []  # tests that left another allocator installed
_tensors: list[Any] = []  # PyTorch's, alive in the shared cache through the session


def _allocations() -> int:
    return gm.memory_stats(0)["allocation.all.allocated"]


def pytest_configure(config: pytest.Config) -> None:
    try:
        gm.install()
    except Exception as e:  # no CUDA device: nothing here can run
        pytest.exit(f"jupyter_gpumem could not install its allocator: {e}", returncode=4)
    if os.environ.get("JUPYTER_GPUMEM_SHARE_TORCH") == "1":
        import torch

        gm.install_torch()
        _tensors.extend(torch.full((n << 10,), 1.0, device="cuda") for n in (1, 64, 4096))


def pytest_unconfigure(config: pytest.Config) -> None:
    gm.uninstall()


@pytest.fixture(autouse=True)
def _our_allocator(request: pytest.FixtureRequest) -> Iterator[None]:
    if gm.get_allocator_backend() != "jupyter_gpumem":
        _reinstalled.append(request.node.nodeid)
        gm.uninstall()  # forget the allocator we replaced; it is no longer installed
        gm.install()
    before = _allocations()
    yield
    used = _allocations() - before
    if used:
        _used[request.node.nodeid] = used
    gm.empty_cache()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write = terminalreporter.write_line
    write("")
    write(f"jupyter_gpumem: {len(_used)} tests allocated through our allocator "
          f"({sum(_used.values())} allocations); per file:")
    files: dict[str, int] = {}
    for nodeid in _used:
        files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0) + 1
    for name, count in sorted(files.items()):
        write(f"  {name}: {count}")
    classes = sorted({"::".join(nodeid.split("::")[:2]) for nodeid in _used})
    write("  test classes that did: " + ", ".join(c.split("::")[-1] for c in classes))
    write(f"jupyter_gpumem: reinstalled before {len(_reinstalled)} tests (a test before them "
          "left another allocator installed)")
    stats = gm.memory_stats(0)
    write(f"jupyter_gpumem: live blocks at the end: {stats['allocation.all.current']} "
          f"({stats['allocated_bytes.all.current']} B)")
    if _tensors:
        intact = all(bool((t == 1.0).all()) for t in _tensors)
        write(f"jupyter_gpumem: PyTorch shared the cache: {gm.torch_share_state().text()}; its "
              f"{len(_tensors)} tensors kept through the session are intact: {intact}")
