"""Fixtures of the GPU tests: CuPy on device 0, and our allocator installed for one test."""

from __future__ import annotations

import gc

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem.runtime import registry


@pytest.fixture
def cp():
    import cupy

    cupy.cuda.Device(0).synchronize()
    yield cupy
    cupy.cuda.Device(0).synchronize()


@pytest.fixture
def installed(cp):
    """Our allocator installed for the test, uninstalled (and its cache emptied) after."""
    before = cp.cuda.get_allocator()
    gm.install()
    a = registry.get_allocator(0)
    a.set_config(gm.AllocatorConfig())
    a.reset_peak_memory_stats()
    yield a
    gc.collect()
    gm.uninstall()
    assert cp.cuda.get_allocator() == before
    a.record_history(False)
    a.set_config(gm.AllocatorConfig())
    a.empty_cache()
