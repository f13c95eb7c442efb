"""The out-of-memory explainer over any memory source: a library of the test's own ("lab"), with
its own out-of-memory error, report and next steps, explained by the same panel as ours."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from jupyter_gpumem import sources
from jupyter_gpumem.data.owners import Owner
from jupyter_gpumem.engine.oom import OomReport, OutOfMemoryError
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.ledger import Ledger
from jupyter_gpumem.notebook.oom_panel import build_panel, is_oom_error, said_for, source_of_oom
from jupyter_gpumem.sources import SourceBase

MiB = 1 << 20
BASE = 0x7F00_0000_0000  # where the lab pool's one segment starts


class LabOutOfMemory(MemoryError):
    """The lab library's out-of-memory error: it says how many bytes were asked for."""

    def __init__(self, requested: int) -> None:
        super().__init__(f"lab: out of memory allocating {requested // MiB} MiB")
        self.requested = requested


class LabBuffer:
    """The lab library's array: its memory as a tensor's surface (``untyped_storage()``)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.address, self.nbytes = address, nbytes

    def untyped_storage(self) -> Any:
        buffer = self

        class Storage:
            def data_ptr(self) -> int:
                return buffer.address

            def nbytes(self) -> int:
                return buffer.nbytes

        return Storage()


class LabPool:
    """One segment that grows by a block at each request, up to ``capacity`` bytes; a block is
    live or cached free (never reused: the lab library is simple). A request past the capacity
    raises ``LabOutOfMemory``."""

    def __init__(self, capacity: int, device_total: int) -> None:
        self.capacity, self.device_total = capacity, device_total
        self.blocks: list[dict[str, Any]] = []  # address, size, state, frames

    @property
    def reserved(self) -> int:
        return sum(b["size"] for b in self.blocks)

    def _block(self, size: int, state: str, frames: list[dict[str, Any]]) -> int:
        address = BASE + sum(b["size"] for b in self.blocks)
        self.blocks.append({"address": address, "size": size, "state": state, "frames": frames})
        return address

    def alloc(self, size: int) -> LabBuffer:
        """A live block of ``size`` bytes, its stack the caller's (innermost first)."""
        if self.reserved + size > self.capacity:
            raise LabOutOfMemory(size)
        frames = [{"filename": f.filename, "line": f.lineno or 0, "name": f.name}
                  for f in reversed(traceback.extract_stack()[:-1])]
        return LabBuffer(self._block(size, "active_allocated", frames), size)

    def cache(self, size: int) -> None:
        """A cached free block of ``size`` bytes."""
        self._block(size, "inactive", [])

    def allocated(self) -> int:
        return sum(b["size"] for b in self.blocks if b["state"] == "active_allocated")


class LabSource(SourceBase):
    """The lab library as a ``MemorySource``: counters, a snapshot, its error and its steps."""

    name = "lab"
    title = "the lab library's pool"
    owners = (Owner("lab buffer", lambda t: t is LabBuffer,
                    lambda b: (b.address, b.nbytes)),)
    oom_errors = (LabOutOfMemory,)

    def __init__(self, pool: LabPool) -> None:
        super().__init__()
        self.pool = pool

    @property
    def device_index(self) -> int:
        return 0

    @property
    def device_name(self) -> str:
        return "Lab GPU"

    def memory_stats(self) -> dict[str, int]:
        allocated = self.pool.allocated()
        return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": allocated,
                "reserved_bytes.all.current": self.pool.reserved}

    def mem_get_info(self) -> tuple[int, int]:
        return 40 * MiB, self.pool.device_total

    def snapshot(self) -> Any:
        blocks = [{**b, "requested_size": b["size"] if b["state"] != "inactive" else 0}
                  for b in self.pool.blocks]
        return {"segments": [{"device": 0, "address": BASE, "total_size": self.pool.reserved,
                              "blocks": blocks}], "device_traces": [[]]}

    def oom_report(self, exc: BaseException) -> OomReport | None:
        if not isinstance(exc, LabOutOfMemory):
            return None
        free, total = self.mem_get_info()
        cached = [b["size"] for b in self.pool.blocks if b["state"] == "inactive"]
        allocated = self.pool.allocated()
        return OomReport(requested=exc.requested, rounded=exc.requested,
                         segment_size=exc.requested, stream=0, device=0, device_name="Lab GPU",
                         device_free=free, device_total=total, allocated=allocated,
                         reserved=self.pool.reserved, largest_free_block=max(cached, default=0),
                         free_cached=self.pool.reserved - allocated, cap=None, fraction=None,
                         max_split_size=None)

    def oom_steps(self, report: OomReport | None) -> list[str]:
        return ["the lab pool keeps freed blocks: `lab.trim()` gives them back to the device."]


@pytest.fixture
def lab():
    """The lab source registered (not picked); taken back afterwards."""
    pool = LabPool(512 * MiB, 1024 * MiB)
    source = LabSource(pool)
    sources.register_source("lab", source)
    yield source
    sources.use_sources(("cupy",))
    sources.unregister_source("lab")


def fragmented_pool(source: LabSource) -> LabBuffer:
    """200 MiB held, 100 MiB cached, 112 MiB live and unheld, 100 MiB cached: 200 MiB free in
    blocks too small for 150 MiB."""
    weights = source.pool.alloc(200 * MiB)
    source.pool.cache(100 * MiB)
    source.pool.alloc(112 * MiB)
    source.pool.cache(100 * MiB)
    return weights


def test_the_panel_explains_a_sources_error_in_its_words(lab) -> None:
    weights = fragmented_pool(lab)
    ledger = Ledger()
    ledger.cell_files = {__file__: 3}  # this file's lines are cell [3]'s
    exc = LabOutOfMemory(150 * MiB)
    panel = build_panel(exc, lab, ledger=ledger, namespace={"weights": weights}, cell=4)
    line = fragmented_pool.__code__.co_firstlineno + 3  # where weights was allocated
    assert panel.source == "lab"
    assert panel.text() == (
        "GPU out of memory in cell [4]: asked for 150 MiB (150 MiB after rounding) on device 0 "
        "(Lab GPU); the largest free block was 100 MiB.\n"
        "Memory: 200 MiB free but fragmented (cached in blocks too small for the request) · "
        "this process: 312 MiB allocated, 512 MiB reserved · device: 40.0 MiB free of 1.0 GiB, "
        "472 MiB of it in use outside the allocator.\n"
        "Live memory by cell and line:\n"
        f"  200 MiB  1 block  cell [3] line {line}  ← weights (200 MiB)\n"
        f"  112 MiB  1 block  cell [3] line {line + 2}\n"
        "Other processes: none hold memory on this device, as far as the driver reports.\n"
        "Next steps:\n"
        f"  - free weights (200 MiB, cell [3] line {line}): `del weights` (if nothing else "
        "refers to it) and run the cell again.\n"
        "  - shrink the work: this request needs 150 MiB, about 3.8× what the device has free "
        "— a smaller batch or chunked processing may fit.\n"
        "  - the lab pool keeps freed blocks: `lab.trim()` gives them back to the device.")
    assert "<code>lab.trim()</code>" in panel.html()


def test_a_step_the_source_cannot_take_is_left_out_and_its_noun_is_used(lab) -> None:
    """The lab source sets no allocator config (no ``replay_setting``): our split step goes;
    the step that frees memory names its buffers."""
    ours = ["2.0 GiB is cached but split into blocks of at most 20 MiB: set "
            "`JUPYTER_GPUMEM_ALLOC_CONF=max_split_size_mb:64` (or "
            "`%gpumem config max_split_size_mb:64`) so large blocks are not split.",
            "free memory you no longer need: `del` the arrays holding it "
            "(`caching_allocator_delete(ptr)` for `caching_allocator_alloc`).",
            "shrink the work: this request needs 1.0 GiB — a smaller batch or chunked "
            "processing may fit."]
    assert said_for(lab, ours) == [
        "free memory you no longer need: `del` the buffers holding it.",
        "shrink the work: this request needs 1.0 GiB — a smaller batch or chunked processing "
        "may fit."]
    assert said_for(sources.get_source("cupy"), ours) == ours  # ours: as the engine says them


def test_an_error_with_no_holder_named_gets_the_sources_noun(lab) -> None:
    lab.pool.alloc(300 * MiB)  # held by nothing in the namespace
    panel = build_panel(LabOutOfMemory(320 * MiB), lab, namespace={})
    assert panel.advice == [
        "free memory you no longer need: `del` the buffers holding it.",
        "shrink the work: this request needs 320 MiB, about 8.0× what the device has free — a "
        "smaller batch or chunked processing may fit.",
        "the lab pool keeps freed blocks: `lab.trim()` gives them back to the device."]
    assert panel.fragmented == 0


def test_the_sources_error_is_an_oom_error_while_the_source_is_picked(lab, sim) -> None:
    exc = LabOutOfMemory(MiB)
    assert not is_oom_error(exc) and source_of_oom(exc) is None
    sources.use_sources(("cupy", "lab"))
    assert is_oom_error(exc) and source_of_oom(exc) is lab
    assert not is_oom_error(MemoryError("x")) and not is_oom_error(None)
    # ours stays ours, whichever sources are picked
    with pytest.raises(OutOfMemoryError) as raised:
        sim.malloc(2 << 30)
    ours = raised.value
    found = source_of_oom(ours)
    assert found is not None and found.name == "cupy"
    sources.use_sources(("lab",))
    assert is_oom_error(ours) and source_of_oom(ours).name == "cupy"


def test_the_panel_under_a_cell_that_ran_out_of_the_sources_memory(shell, run, sim, lab) -> None:
    run("%load_ext jupyter_gpumem")
    ext = get_extension(shell)
    ext.settings.live_view = False
    shell.user_ns["lab"] = lab.pool
    sources.use_sources(("cupy", "lab"))
    run("MiB = 1 << 20")  # cell 2
    run("weights = lab.alloc(300 * MiB)")  # cell 3
    result, out = run("more = lab.alloc(320 * MiB)")  # cell 4
    assert isinstance(result.error_in_exec, LabOutOfMemory)
    text = out.outputs[-1].data["text/plain"]
    assert ext.last_oom.source == "lab"
    assert text == (
        "GPU out of memory in cell [4]: asked for 320 MiB (320 MiB after rounding) on device 0 "
        "(Lab GPU); the largest free block was 0 B.\n"
        "Memory: 0 B free but fragmented (cached in blocks too small for the request) · this "
        "process: 300 MiB allocated, 300 MiB reserved · device: 40.0 MiB free of 1.0 GiB, "
        "684 MiB of it in use outside the allocator.\n"
        "Live memory by cell and line:\n"
        "  300 MiB  1 block  cell [3] line 1  ← weights (300 MiB)\n"
        "Other processes: none hold memory on this device, as far as the driver reports.\n"
        "Next steps:\n"
        "  - free weights (300 MiB, cell [3] line 1): `del weights` (if nothing else refers to "
        "it) and run the cell again.\n"
        "  - shrink the work: this request needs 320 MiB, about 8.0× what the device has free "
        "— a smaller batch or chunked processing may fit.\n"
        "  - the lab pool keeps freed blocks: `lab.trim()` gives them back to the device.")


def test_a_source_that_sets_its_config_by_a_variable_gets_the_config_step_so(lab) -> None:
    class ConfiguredLab(LabSource):
        def replay_setting(self) -> str | None:
            return "`LAB_ALLOC_CONF` (read when lab starts)"

    split = ("2.0 GiB is cached but split into blocks of at most 20 MiB: set "
             "`JUPYTER_GPUMEM_ALLOC_CONF=max_split_size_mb:64` (or "
             "`%gpumem config max_split_size_mb:64`) so large blocks are not split.")
    assert said_for(ConfiguredLab(lab.pool), [split]) == [
        "2.0 GiB is cached but split into blocks of at most 20 MiB: set "
        "`LAB_ALLOC_CONF=max_split_size_mb:64` (read when lab starts) so large blocks are not "
        "split."]


def test_our_error_on_another_device_is_read_at_that_devices_allocator() -> None:
    from jupyter_gpumem.runtime import registry

    second = registry.use_simulated_device(1 << 30, devices=2, fresh=True)[1]
    try:
        held = second.malloc(600 * MiB)
        with pytest.raises(OutOfMemoryError) as raised:
            second.malloc(600 * MiB)
        found = source_of_oom(raised.value)  # the current device is the first
        assert found is not None and found.name == "cupy" and found.device_index == 1
        panel = build_panel(raised.value, found, replay=False)
        assert panel.holders[0].bytes == 600 * MiB
        assert panel.text().startswith(
            "GPU out of memory: asked for 600 MiB (600 MiB after rounding) on device 1 "
            "(Simulated GPU 1)")
        second.free(held)
    finally:
        registry.use_cuda()
