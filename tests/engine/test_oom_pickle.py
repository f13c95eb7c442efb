"""An out-of-memory error crosses processes whole (a Dask worker's reaches the notebook)."""

from __future__ import annotations

import pickle

import pytest

from jupyter_gpumem import CachingAllocator, OutOfMemoryError, SimulatedDevice

MiB = 1 << 20


def test_our_oom_error_pickles_with_its_report_message_and_attributes() -> None:
    a = CachingAllocator(SimulatedDevice(64 * MiB))
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(128 * MiB)
    exc = info.value
    exc.worker = "tcp://10.0.0.1:4000"
    exc.args = (exc.args[0] + "\nOn Dask worker tcp://10.0.0.1:4000.",)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is OutOfMemoryError
    assert back.report == exc.report and str(back) == str(exc)
    assert back.worker == "tcp://10.0.0.1:4000"
