"""A scripted workload on the simulated device, for the README's first command and the docs."""

from __future__ import annotations

from jupyter_gpumem.data.sizes import GiB, KiB, MiB
from jupyter_gpumem.devices.simulated import ManualClock, SimulatedDevice
from jupyter_gpumem.engine.allocator import CachingAllocator
from jupyter_gpumem.engine.config import AllocatorConfig


def run_workload(allocator: CachingAllocator, steps: int = 4) -> None:
    """A small "training loop": weights that stay, activations that come and go, a leak."""
    weights = [allocator.malloc(n) for n in (64 * MiB, 64 * MiB, 16 * MiB, 4 * KiB)]
    leaked = []
    for step in range(steps):
        activations = [allocator.malloc((8 + step) * MiB) for _ in range(6)]
        scratch = [allocator.malloc(256 * KiB) for _ in range(20)]
        for ptr in scratch[::2]:
            allocator.free(ptr)
        leaked.append(scratch[1])  # one scratch buffer per step is never freed
        for ptr in activations + scratch[3::2]:
            allocator.free(ptr)
    del weights, leaked


def demo_allocator(capacity: int = 16 * GiB, *, stacks: bool = True) -> CachingAllocator:
    """An allocator on a simulated device that has run ``run_workload`` with history on."""
    device = SimulatedDevice(capacity, clock=ManualClock(tick_ns=1_000), name="Simulated GPU")
    allocator = CachingAllocator(device, AllocatorConfig.from_env())
    allocator.record_history(True, stacks=stacks)
    run_workload(allocator)
    return allocator


def main() -> None:
    allocator = demo_allocator()
    print(allocator.memory_summary(), end="")
