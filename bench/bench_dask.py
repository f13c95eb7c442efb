"""What the Dask plugin costs: (a) wall-time overhead on a chunked dask.array workload, (b) the
time to gather stats from 64 workers, (c) the live view's sampler at 64 workers.

    python bench/bench_dask.py                    # both, on simulated devices where no GPU is
    python bench/bench_dask.py --gpu              # (a) with CuPy chunks (a GPU machine)
    python bench/bench_dask.py --gather-processes # (b) with 64 worker processes (16+ cores)
    python bench/bench_dask.py --only sampler --gather-processes  # (c) alone, worker processes

(a) One LocalCluster (worker processes, one thread each) runs the same graph again and again,
the modes taking turns: ``none`` (no plugin), ``stats`` (``GpuMemPlugin()``, stats only) and
``history`` (``GpuMemPlugin(history=True)``). With ``--gpu`` the chunks are CuPy arrays and
``none`` is CuPy's own pool; the others put our allocator under them. Without a GPU every task
allocates its chunk's bytes through our API on a simulated device, and ``none`` points the
workers at a simulated device without the plugin, so the difference is the plugin's own cost
(the transition hook and task labels). Figures: the median wall time of each mode and the
overhead of ``stats`` and ``history`` over ``none`` (target for stats: <= 2 %).

(b) A LocalCluster of 64 workers on simulated devices (threads in this process by default:
64 worker processes need more cores than a laptop; ``--gather-processes`` starts them) with the
plugin; ``memory_stats(client)`` is timed: median and best of several calls (target <= 1 s).

(c) The same cluster: ``ClusterSampler.sample()`` (one round of the live view, every worker's
record through one scheduler call) is timed, and its bytes counted: the records per worker, and
the pickled answer the client receives per round (records plus addresses and names).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 1 << 20


def _sim_chunk(block, nbytes: int):  # type: ignore[no-untyped-def]
    """A task of the simulated workload: the chunk's bytes through our allocator, numpy work."""
    from jupyter_gpumem import api

    ptr = api.caching_allocator_alloc(nbytes)
    try:
        return (block * 2.0 + 1.0).sum(axis=0, keepdims=True)
    finally:
        api.caching_allocator_delete(ptr)


def _use_sim() -> bool:
    from jupyter_gpumem.runtime import registry

    registry.use_simulated_device(1 << 36)
    return True


def _graph(gpu: bool, chunks: int, side: int):  # type: ignore[no-untyped-def]
    import dask.array as da

    if gpu:
        import cupy

        rs = da.random.RandomState(RandomState=cupy.random.RandomState)
        x = rs.random_sample((chunks * side, side), chunks=(side, side))
        # a task per chunk at each step, then a tree of sums: x @ x.T would make chunks**2
        # output chunks (40,000 at the default), far longer than a benchmark round should be
        return ((x * 2.0 + 1.0).T @ x).sum()

    x = da.ones((chunks * side, side), chunks=(side, side))
    nbytes = side * side * 8
    return x.map_blocks(_sim_chunk, nbytes, chunks=(1, side), dtype=float).sum()


def bench_overhead(args: argparse.Namespace) -> None:
    from distributed import Client, LocalCluster

    from jupyter_gpumem.dask import GpuMemPlugin

    device = "cuda" if args.gpu else "sim"
    times: dict[str, list[float]] = {"none": [], "stats": [], "history": []}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        graph = _graph(args.gpu, args.chunks, args.side)
        if not args.gpu:
            client.run(_use_sim)
        graph.compute()  # warm up: imports, first segments
        for _ in range(args.repeat):
            for mode in times:
                if mode == "none":
                    if not args.gpu:
                        client.run(_use_sim)
                else:
                    client.register_plugin(GpuMemPlugin(device=device,
                                                        history=mode == "history"))
                graph.compute()  # a warm-up run in this mode, untimed
                start = time.perf_counter()
                graph.compute()
                times[mode].append(time.perf_counter() - start)
                if mode != "none":
                    client.unregister_worker_plugin("jupyter_gpumem")
    tasks = len(graph.__dask_graph__())
    base = statistics.median(times["none"])
    print(f"(a) {args.workers} worker processes x 1 thread, {tasks} tasks a run, "
          f"{'CuPy' if args.gpu else 'simulated'} chunks of {args.side}x{args.side} float64, "
          f"{args.repeat} runs a mode (median):")
    for mode, values in times.items():
        m = statistics.median(values)
        extra = "" if mode == "none" else f"  {100 * (m / base - 1):+.1f} %"
        print(f"    {mode:8s} {m * 1000:8.1f} ms (min {min(values) * 1000:.1f}){extra}")


def bench_gather(args: argparse.Namespace) -> None:
    from distributed import Client, LocalCluster

    from jupyter_gpumem.dask import GpuMemPlugin, memory_stats

    t0 = time.perf_counter()
    with LocalCluster(n_workers=args.gather_workers, threads_per_worker=1,
                      processes=args.gather_processes, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.gather_workers)
        client.register_plugin(GpuMemPlugin(device="sim"))
        started = time.perf_counter() - t0
        got = memory_stats(client)
        assert got.complete and len(got) == args.gather_workers, got.message
        times = []
        for _ in range(args.repeat * 2):
            start = time.perf_counter()
            memory_stats(client)
            times.append(time.perf_counter() - start)
    kind = "processes" if args.gather_processes else "threads of one process"
    print(f"(b) memory_stats(client) from {args.gather_workers} workers ({kind}; cluster up in "
          f"{started:.1f} s): median {statistics.median(times) * 1000:.1f} ms, best "
          f"{min(times) * 1000:.1f} ms over {len(times)} calls")


def bench_sampler(args: argparse.Namespace) -> None:
    import pickle

    from distributed import Client, LocalCluster

    from jupyter_gpumem.dask import GpuMemPlugin
    from jupyter_gpumem.dask.live import RECORD_BYTES, ClusterSampler

    n = args.gather_workers
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=args.gather_processes,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(n)
        client.register_plugin(GpuMemPlugin(device="sim"))
        sampler = ClusterSampler(client, interval=1.0, timeout=5.0)
        for _ in range(20):  # warm up: worker processes still starting answer late at first
            sampler.sample()
            if sampler.error == "" and sampler.last_bytes == RECORD_BYTES * n:
                break
        whys = {w.why for w in sampler.workers.values() if w.why}
        assert sampler.error == "" and sampler.last_bytes == RECORD_BYTES * n, (sampler.error, whys)
        answer = sampler._ask()  # what one round brings back to the client
        wire = len(pickle.dumps(answer, protocol=5))
        times = []
        for _ in range(args.repeat * 4):
            start = time.perf_counter()
            sampler.sample()
            times.append(time.perf_counter() - start)
        stale = sum(w.state != 0 for w in sampler.workers.values())
    kind = "processes" if args.gather_processes else "threads of one process"
    print(f"(c) live sampler, {n} workers ({kind}, mode {sampler.mode}): a round takes median "
          f"{statistics.median(times) * 1000:.1f} ms, best {min(times) * 1000:.1f} ms, worst "
          f"{max(times) * 1000:.1f} ms over {len(times)} rounds; {RECORD_BYTES} B of record per "
          f"worker per sample, {wire} B pickled answer per round ({wire / n:.0f} B a worker); "
          f"{stale} stale")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="CuPy chunks (needs a GPU)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=200, help="chunks of the array")
    parser.add_argument("--side", type=int, default=256, help="a chunk is side x side")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gather-workers", type=int, default=64)
    parser.add_argument("--gather-processes", action="store_true")
    parser.add_argument("--only", choices=("overhead", "gather", "sampler"))
    args = parser.parse_args()
    if args.only in (None, "overhead"):
        bench_overhead(args)
    if args.only in (None, "gather"):
        bench_gather(args)
    if args.only in (None, "sampler"):
        bench_sampler(args)


if __name__ == "__main__":
    main()
