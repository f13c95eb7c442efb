"""``%gpumem cluster``: the table of workers of the current Dask client (in-process workers
on simulated devices: they share this process's allocator, so each row is the same)."""

from __future__ import annotations

import pytest

distributed = pytest.importorskip("distributed")
IPython = pytest.importorskip("IPython")

from IPython.core.error import UsageError  # noqa: E402

from jupyter_gpumem.dask import GpuMemPlugin  # noqa: E402
from jupyter_gpumem.dask.view import ClusterTable, cluster_table  # noqa: E402
from jupyter_gpumem.runtime import registry  # noqa: E402

MiB = 1 << 20


def test_the_table_names_every_worker_and_its_bytes() -> None:
    with distributed.LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        client.register_plugin(GpuMemPlugin(device="sim", capacity=1 << 30))
        try:
            ptr = registry.get_allocator(None).malloc(3 * MiB)
            table = cluster_table(client)
            registry.get_allocator(None).free(ptr)
        finally:
            client.unregister_worker_plugin("jupyter_gpumem")
    assert isinstance(table, ClusterTable) and len(table.stats) == 2
    text = repr(table)
    for addr in table.stats:
        assert addr in text
    assert text.count("3.0 MiB") >= 2 and "Simulated GPU 0 (0)" in text
    assert "<table" in table._repr_html_()


def test_without_a_client_the_magic_says_what_to_do(shell) -> None:
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    with pytest.raises(UsageError, match="no Dask client"):
        shell.run_line_magic("gpumem", "cluster")
