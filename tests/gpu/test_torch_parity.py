"""Our numbers against PyTorch's caching allocator itself, request for request, on a GPU.

PyTorch runs a random program through ``torch.cuda.caching_allocator_alloc`` / ``_delete``; our
allocator runs the same program on a device that hands out the very segment addresses PyTorch
got from cudaMalloc (best fit breaks ties by address, so addresses matter). After every step,
every counter named in the issue must be equal.
"""

from __future__ import annotations

import random
import time

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator
from jupyter_gpumem.engine.device import DeviceOutOfMemory

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no CUDA device", allow_module_level=True)

KiB, MiB = 1 << 10, 1 << 20
COMPARED = [
    f"{stat}.{pool}.{field}"
    for stat in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                 "requested_bytes", "allocation", "segment", "active", "inactive_split")
    for pool in ("all", "large_pool", "small_pool")
    for field in ("current", "peak", "allocated", "freed")
] + ["num_alloc_retries", "num_ooms", "oversize_allocations.current",
     "oversize_allocations.peak", "oversize_segments.current", "oversize_segments.peak"]


class ReplayDevice:
    """Hands out the segment addresses PyTorch got, as they come; frees are only bookkept."""

    def __init__(self, total: int) -> None:
        self.index = 0
        self.name = "replay of PyTorch's cudaMalloc"
        self.clock = time.perf_counter_ns
        self.queue: list[int] = []  # addresses of PyTorch's segments not yet handed out
        self._live: dict[int, int] = {}
        self.total = total

    def malloc(self, nbytes: int, stream: int) -> int:
        if not self.queue:
            raise DeviceOutOfMemory("PyTorch got no new segment at this step")
        addr = self.queue.pop(0)
        self._live[addr] = nbytes
        return addr

    def free(self, ptr: int) -> None:
        del self._live[ptr]

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - sum(self._live.values()), self.total


def _program(seed: int, steps: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    ops: list[tuple[str, int]] = []
    live = 0
    for _ in range(steps):
        r = rng.random()
        if r < 0.02:
            ops.append(("empty_cache", 0))
        elif live and r < 0.45:
            ops.append(("free", rng.randrange(1 << 30)))
            live -= 1
        else:
            kind = rng.random()
            if kind < 0.45:
                size = rng.randint(1, 1 * MiB)
            elif kind < 0.85:
                size = rng.randint(1 * MiB, 12 * MiB)
            else:
                size = rng.randint(12 * MiB, 80 * MiB)
            ops.append(("alloc", size))
            live += 1
    return ops


def _torch_segments() -> set[int]:
    return {seg["address"] for seg in torch.cuda.memory_snapshot()}


def _run_both(ops: list[tuple[str, int]], config: AllocatorConfig, label: str) -> None:
    """Each op on PyTorch, then on ours, then compare; the first difference fails the test."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_allocated() == 0, "PyTorch holds memory from elsewhere"
    device = ReplayDevice(torch.cuda.mem_get_info()[1])
    ours = CachingAllocator(device, config, debug=True)
    stream = torch.cuda.current_stream().cuda_stream
    theirs_live: list[int] = []
    ours_live: list[int] = []
    segments = _torch_segments()
    try:
        for step, (op, arg) in enumerate(ops):
            if op == "alloc":
                theirs_live.append(torch.cuda.caching_allocator_alloc(arg, 0, stream))
            elif op == "free":
                torch.cuda.caching_allocator_delete(theirs_live.pop(arg % len(theirs_live)))
            else:
                torch.cuda.empty_cache()
            now = _torch_segments()
            device.queue.extend(sorted(now - segments))
            segments = now
            if op == "alloc":
                ours_live.append(ours.malloc(arg, stream))
            elif op == "free":
                ours.free(ours_live.pop(arg % len(ours_live)))
            else:
                ours.empty_cache()
            t, o = torch.cuda.memory_stats(), ours.memory_stats()
            diff = {k: (t.get(k), o.get(k)) for k in COMPARED if t.get(k) != o.get(k)}
            assert not diff, f"{label}: step {step} {ops[max(0, step - 3):step + 1]}: {diff}"
    finally:
        for ptr in theirs_live:
            torch.cuda.caching_allocator_delete(ptr)
        torch.cuda.empty_cache()


def test_same_numbers_as_pytorch() -> None:
    # Default settings first: PyTorch's settings cannot be unset once set in a process.
    # Each settings string replaces all of PyTorch's settings, so the last one names both keys.
    configs = [("", AllocatorConfig()),
               ("max_split_size_mb:64", AllocatorConfig(max_split_size_mb=64)),
               ("max_split_size_mb:64,roundup_power2_divisions:4",
                AllocatorConfig(max_split_size_mb=64, roundup_power2_divisions=4))]
    for settings, config in configs:
        if settings:
            setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
            (setter or torch.cuda.memory._set_allocator_settings)(settings)
        for seed in (1, 2, 3):
            _run_both(_program(seed * 101 + len(settings), 400), config,
                      f"{settings or 'default'} seed {seed}")
