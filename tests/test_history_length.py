"""The longest history is one limit, ``data.sizes.MAX_HISTORY_ENTRIES``, the length the C core's
ring can count: every way in (the allocator, the API, ``trace``, the magics, the Dask plugin)
refuses a longer one with a clear error before anything changes (``2**70`` raised OverflowError
inside the C core, or was taken and failed later)."""

from __future__ import annotations

import pytest

import jupyter_gpumem as gm
from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES

TOO_LONG = [MAX_HISTORY_ENTRIES + 1, 2**70]


@pytest.mark.parametrize("n", TOO_LONG)
def test_the_allocator_refuses_a_history_longer_than_its_core_counts(n: int) -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30))
    with pytest.raises(ValueError, match=rf"^max_entries must be an int in \[0, "
                                         rf"{MAX_HISTORY_ENTRIES}\], got {n}$"):
        a.record_history(True, max_entries=n)
    assert a.snapshot(mark=False)["device_traces"] == [[]]  # recording did not start
    a.record_history(True, max_entries=MAX_HISTORY_ENTRIES)  # the longest is taken
    a.record_history(False)


@pytest.mark.parametrize("n", TOO_LONG)
def test_the_api_and_trace_refuse_it_before_recording(n: int) -> None:
    with pytest.raises(ValueError, match=r"^max_entries must be an int in \[1, "):
        gm.record_memory_history("all", max_entries=n)
    from jupyter_gpumem.notebook.trace import trace

    with pytest.raises(ValueError, match=r"^max_entries must be an int in \[1, "):
        trace(max_entries=n)


def test_the_magics_and_the_plugin_read_the_same_limit() -> None:
    from jupyter_gpumem.notebook import magics

    pytest.importorskip("distributed")
    from jupyter_gpumem.dask import plugin

    assert magics.MAX_ENTRIES is plugin.MAX_ENTRIES is MAX_HISTORY_ENTRIES


def test_the_setting_refuses_it_too() -> None:
    from traitlets import TraitError

    from jupyter_gpumem.notebook.settings import GpuMem

    settings = GpuMem()
    with pytest.raises(TraitError, match=r"^max_entries must be in \[1, "):
        settings.max_entries = MAX_HISTORY_ENTRIES + 1
    with pytest.raises(TraitError, match=r"^max_entries must be in \[1, "):
        settings.max_entries = 0
    settings.max_entries = MAX_HISTORY_ENTRIES
    assert settings.max_entries == MAX_HISTORY_ENTRIES
