"""The plugin's life in a process of several workers (``LocalCluster(processes=False)``, as in a
notebook): a plugin of other settings replaces the one set up, a failed setup counts for nothing
and leaves the process as it found it, and the notebook's own recording outlives the plugin."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from jupyter_gpumem.dask import GpuMemPlugin  # noqa: E402
from jupyter_gpumem.dask.plugin import PLUGIN_NAME, process_state  # noqa: E402
from jupyter_gpumem.engine.config import AllocatorConfig  # noqa: E402
from jupyter_gpumem.runtime import registry  # noqa: E402

GiB = 1 << 30


@contextmanager
def in_process_client(n_workers: int) -> Iterator[Any]:
    with distributed.LocalCluster(n_workers=n_workers, processes=False, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        try:
            yield client
        finally:
            if process_state() is not None:
                client.unregister_worker_plugin(PLUGIN_NAME)


def test_a_plugin_of_other_settings_replaces_the_one_set_up_in_the_process() -> None:
    config = AllocatorConfig.parse("max_split_size_mb:64")
    with in_process_client(2) as client:
        client.register_plugin(GpuMemPlugin("sim", capacity=GiB))
        (a,) = registry.simulated_allocators().values()
        before = a.config
        assert not a.recording and process_state().users == 2
        client.register_plugin(GpuMemPlugin("sim", capacity=GiB, history=True, config=config))
        assert a.recording and a.config == config and registry.default_config() == config
        assert process_state().users == 2
        client.unregister_worker_plugin(PLUGIN_NAME)
        assert process_state() is None
        assert not a.recording and a.config == before and registry.backend() == "cuda"


class FailsHalfWay(GpuMemPlugin):
    """A plugin whose setup fails after it changed everything (config, device, recording)."""

    def _apply(self, state: Any) -> None:
        super()._apply(state)
        raise RuntimeError("this setup fails half way")


def test_a_setup_that_fails_leaves_the_process_as_found_and_counts_for_nothing() -> None:
    with in_process_client(2) as client:
        with pytest.raises(RuntimeError, match="fails half way"):
            client.register_plugin(FailsHalfWay("sim", capacity=GiB, history=True,
                                                config="max_split_size_mb:64"))
        assert process_state() is None and registry.backend() == "cuda"
        assert registry.default_config() == AllocatorConfig()
        assert not any(a.recording for a in registry.simulated_allocators().values())
        client.register_plugin(GpuMemPlugin("sim", capacity=GiB))
        assert process_state().users == 2  # the failed plugin's teardowns took none away
        client.unregister_worker_plugin(PLUGIN_NAME)
        assert process_state() is None and registry.backend() == "cuda"


def test_an_in_process_plugin_leaves_the_notebooks_own_recording_on() -> None:
    (mine,) = registry.use_simulated_device(GiB)  # the notebook's device, recording
    try:
        mine.record_history(True, max_entries=1000, clear=True)
        ptr = mine.malloc(1 << 20)
        mine.free(ptr)
        before = mine.snapshot(mark=False)["device_traces"][0]
        with in_process_client(1) as client:
            client.register_plugin(GpuMemPlugin("sim", capacity=GiB, history=True))
            assert mine.recording
            client.unregister_worker_plugin(PLUGIN_NAME)
        assert mine.recording and registry.backend() == "sim"
        ptr = mine.malloc(1 << 20)
        mine.free(ptr)
        after = mine.snapshot(mark=False)["device_traces"][0]
        assert after[:len(before)] == before and len(after) > len(before)
    finally:
        mine.record_history(False)
        registry.use_cuda()
