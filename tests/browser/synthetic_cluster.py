"""A stand-in for a Dask client with many GPU workers, for the browser test of the live cluster
view: each round answers every worker's record (``jupyter_gpumem.dask.live``) from a formula,
with a worker that runs out of memory, one that stops answering for a while, one that leaves.
The real sampling is tested against a real cluster in tests/dask."""

from __future__ import annotations

import math
import time
from typing import Any

GiB = 1 << 30
TOTAL = 80 * GiB
TASKS = ("random_sample", "matmul", "sum-aggregate", "rechunk-merge", "")


class SyntheticClient:
    """``n`` workers on ``n // 8`` hosts of 8 GPUs; ``sync`` answers one round."""

    status = "running"

    def __init__(self, n: int = 64, *, oom_worker: int = 5, stale_worker: int = 17,
                 gone_worker: int = 42) -> None:
        self.n = n
        self.k = 0
        self.oom_worker, self.stale_worker, self.gone_worker = oom_worker, stale_worker, gone_worker
        self.addresses = [f"tcp://10.0.{i // 8}.{10 + i // 8}:{40000 + i % 8}" for i in range(n)]
        self.peaks = [0] * n

    def record(self, i: int, k: int) -> bytes:
        from jupyter_gpumem.dask.live import encode_record

        wave = 0.5 + 0.5 * math.sin(k / 14 + i * 0.7)
        level = 0.12 + 0.55 * wave * (0.5 + (i % 7) / 12)
        if i == self.oom_worker:  # climbs until it runs out, then starts over
            level = min(0.985, 0.2 + (k % 120) / 110)
        if i % 11 == 3:  # a few idle workers
            level = 0.03
        allocated = int(level * TOTAL)
        reserved = min(TOTAL, int(allocated * 1.25) + GiB)
        self.peaks[i] = max(self.peaks[i], allocated)
        ooms = (k // 120) if i == self.oom_worker else 0
        task = TASKS[(k // 9 + i) % len(TASKS)] if i % 11 != 3 else ""
        return encode_record(allocated, reserved, self.peaks[i], TOTAL, ooms, ooms * 2, i % 8,
                             task)

    def sync(self, _fn: Any, *, callback_timeout: float | None = None
             ) -> tuple[dict[str, Any], dict[str, str]]:
        """As ``Client.sync`` (the sampler bounds its wait with ``callback_timeout``)."""
        k = self.k
        self.k += 1
        answers: dict[str, Any] = {}
        names: dict[str, str] = {}
        for i, addr in enumerate(self.addresses):
            if i == self.gone_worker and k >= 200:
                continue  # it left the cluster
            names[addr] = str(i)
            stale = i == self.stale_worker and 150 <= k < 175
            answers[addr] = "no answer in time" if stale else self.record(i, k)
        return answers, names


def prefilled_view(rounds: int = 240, n: int = 64, interval: float = 1.0) -> Any:
    """A ``ClusterLive`` on a ``SyntheticClient`` with ``rounds`` rounds already in its window
    (one a second on its clock), sampling on in real time from there."""
    from jupyter_gpumem.dask.live import ClusterSampler
    from jupyter_gpumem.notebook.cluster_live import ClusterLive

    client = SyntheticClient(n)
    fake = [0.0]
    sampler = ClusterSampler(client, interval, capacity=300, clock=lambda: fake[0])
    for _ in range(rounds):
        sampler.sample()
        fake[0] += interval
    start = time.monotonic()
    base = fake[0]
    sampler.clock = lambda: base + time.monotonic() - start
    return ClusterLive(client, sampler=sampler, title="64 GPU workers (synthetic)")
