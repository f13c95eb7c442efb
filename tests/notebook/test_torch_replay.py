"""What-if replay of PyTorch's own recorded history, in a real InteractiveShell with the fake
``torch.cuda.memory`` (``fake_torch``, PyTorch's policy run for real on a simulated device):
``%gpumem history on`` records PyTorch's events, ``%gpumem replay last`` reads them, and the OOM
explainer on PyTorch's error offers a config that would have fit, set the way PyTorch takes it.
The fake device leaves most of its memory to "another process", as a GPU leaves some to the
CUDA context: the replay must run on what PyTorch could use, or it would replay the error away.
"""

from __future__ import annotations

import pytest
from fake_torch import FakeTorchMemory, views_on_fake

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice, sources
from tests.fragmentation_workload import CAPACITY, MiB, run_workload

OUTSIDE = 3 * CAPACITY
#: The fragmentation workload through the fake PyTorch (``mem``): out of memory at the end.
WORKLOAD = ("x = mem.empty(600 * MiB)\ndel x\ny = mem.empty(100 * MiB)",
            "z = mem.empty(600 * MiB)")
SETS = ("restart the kernel and run `%env PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64` before "
        "`import torch`")


@pytest.fixture
def fake():
    mem = FakeTorchMemory(CAPACITY + OUTSIDE)
    mem.device.hold_for_process(4242, OUTSIDE, "CUDA context and others")
    yield mem
    sources.use_sources(("cupy",))


@pytest.fixture
def torch_gm(shell, run, sim, fake):
    ext = views_on_fake(shell, run, fake)
    run("MiB = 1 << 20")
    return ext


def test_history_on_records_pytorchs_events(torch_gm, run, fake) -> None:
    result, out = run("%gpumem history on")
    assert result.success
    assert "PyTorch's history on (stacks on" in out.stdout
    assert fake.history_calls[-1]["enabled"] == "all"
    run("%gpumem history off")
    assert fake.history_calls[-1]["enabled"] is None


def test_the_oom_panel_offers_a_config_pytorch_can_use(torch_gm, run, fake) -> None:
    run("%gpumem history on")
    run(WORKLOAD[0])
    result, _ = run(WORKLOAD[1])
    assert type(result.error_in_exec).__module__ == "torch"
    steps = torch_gm.last_oom.advice
    offer = [s for s in steps if s.startswith("replaying this trace")]
    assert offer == [f"replaying this trace (6 events) with `max_split_size_mb:64` would have "
                     f"fit (peak reserved 700 MiB instead of the 1.2 GiB it needs): `%gpumem "
                     f"replay last --suggest` shows it; to use it, {SETS} (PyTorch reads it "
                     "once, when it first allocates)."]
    # and it is true: the same program under that config fits where the defaults fail
    for config, fits in ((AllocatorConfig(), False), (AllocatorConfig(max_split_size_mb=64), True)):
        device = SimulatedDevice(CAPACITY + OUTSIDE)
        device.hold_for_process(1, OUTSIDE)
        allocator = CachingAllocator(device, config)
        allocator.record_history(stacks=False)
        try:
            run_workload(allocator)
        except AssertionError:  # raised when the workload's last request does not fail
            fitted = True
        else:
            fitted = False
        assert fitted is fits


def test_replay_last_reads_pytorch_and_says_how_to_set_it(torch_gm, run, fake) -> None:
    run("%gpumem history on")
    run(WORKLOAD[0])
    run(WORKLOAD[1])
    result, _ = run("%gpumem replay last --suggest")
    assert result.success
    text = result.result._repr_mimebundle_()["text/plain"]
    assert text.startswith("gpumem replay --suggest: max_split_size_mb:64 would have fit")
    assert f"  PyTorch, in a notebook: {SETS}" in text
    assert "  PyTorch, a new process: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64" in text
    assert "%gpumem config" not in text  # that would set CuPy's allocator, not PyTorch's
    # the 4 GiB device with what PyTorch could not use held outside: the error is met again
    assert "on a device of 4.0 GiB (3.0 GiB of it in use outside the allocator)" in text
    assert ("which could use 1.0 GiB: its 600 MiB reserved plus the 424 MiB the device had "
            "free at its first out-of-memory error") in text


def test_last_is_the_trace_cell_once_history_is_off_again(torch_gm, run, fake) -> None:
    result, _ = run("%%gpumem_trace --no-plot\nx = mem.empty(600 * MiB)\ndel x\n"
                    "y = mem.empty(100 * MiB)")
    assert result.success and not fake._history_enabled()
    result, _ = run("%gpumem replay last --config defaults --config max_split_size_mb:64")
    assert result.success, result.error_in_exec
    text = result.result.text()
    assert text.startswith("gpumem replay: ")
    assert "max_split_size_mb:64" in text


def test_nothing_recorded_says_how_to_record(torch_gm, run, fake) -> None:
    result, out = run("%gpumem replay last")
    assert not result.success
    assert "PyTorch has recorded no events; `%gpumem history on` records them" in (
        out.stderr + str(result.error_in_exec))


def test_with_both_sources_last_is_the_source_that_ran_out(torch_gm, run, fake, sim) -> None:
    sources.use_torch(fake, also_cupy=True)
    run("%gpumem history on")
    run("import jupyter_gpumem as g\np = g.caching_allocator_alloc(8 * MiB)")
    run("t = mem.empty(64 * MiB)")
    result, out = run("%gpumem replay last")
    assert not result.success  # both recorded: which one is not a guess
    assert "say which, `%gpumem replay cupy` or `%gpumem replay torch`" in (
        out.stderr + str(result.error_in_exec))
    peaks = {}
    for which in ("cupy", "torch"):
        result, _ = run(f"%gpumem replay {which} --config defaults")
        assert result.success
        peaks[which] = result.result.results[0].peak_allocated
    assert peaks == {"cupy": 8 * MiB, "torch": 64 * MiB}
    run("del t")
    run(WORKLOAD[0])
    result, _ = run(WORKLOAD[1])  # PyTorch runs out: last is PyTorch's trace now
    assert torch_gm.last_oom.source == "torch"
    result, _ = run("%gpumem replay last --config defaults")
    assert result.success and result.result.results[0].num_ooms == 1  # PyTorch's, not ours
    run("g.caching_allocator_delete(p)")
    sources.use_sources(("torch",))
    result, out = run("%gpumem replay cupy")
    assert result.success  # cupy by name reads our allocator whatever the views read


def test_pytorchs_own_marks_do_not_change_the_count(torch_gm, run, fake) -> None:
    run("%gpumem history on")
    run(WORKLOAD[0])
    run(WORKLOAD[1])
    offer = next(s for s in torch_gm.last_oom.advice if s.startswith("replaying this trace"))
    counts = []
    for _ in range(3):  # each read makes PyTorch log a snapshot entry
        result, _ = run("%gpumem replay last --config defaults")
        counts.append(result.result.events)
    assert counts == [6, 6, 6] and "replaying this trace (6 events)" in offer


def test_the_panel_speaks_pytorch_and_names_what_lies_outside(torch_gm, run, fake) -> None:
    run("%gpumem history on")
    run(WORKLOAD[0])
    run(WORKLOAD[1])
    panel = torch_gm.last_oom
    text = panel.text()
    assert "device: 424 MiB free of 4.0 GiB, 3.0 GiB of it in use outside the allocator." in text
    assert "caching_allocator" not in text and "JUPYTER_GPUMEM_ALLOC_CONF" not in text
    assert panel.advice[0].startswith("replaying this trace")  # fragmented: the fix leads
    assert "free memory you no longer need: `del` the tensors holding it." in panel.advice


def test_the_pytorch_wording_of_our_steps() -> None:
    """Every step ``engine.oom.advice`` gives a split cache, said for PyTorch: its variable
    and its tensors, none of ours."""
    from jupyter_gpumem.engine.oom import OomReport
    from jupyter_gpumem.engine.oom import advice as report_advice
    from jupyter_gpumem.notebook.oom_panel import said_for
    from jupyter_gpumem.sources.torch import TorchSource

    GiB = 1 << 30
    split = OomReport(requested=GiB, rounded=GiB, segment_size=GiB, stream=0, device=0,
                      device_name="H200", device_free=GiB // 2, device_total=8 * GiB,
                      allocated=3 * GiB, reserved=5 * GiB, largest_free_block=GiB // 2,
                      free_cached=2 * GiB, cap=None, fraction=None, max_split_size=None)
    ours = report_advice(split, 0)
    assert any("JUPYTER_GPUMEM_ALLOC_CONF=max_split_size_mb:" in s for s in ours)
    assert any("caching_allocator_delete" in s for s in ours)
    said = said_for(TorchSource(FakeTorchMemory(CAPACITY)), ours)
    assert len(said) == len(ours)
    assert not any("JUPYTER_GPUMEM" in s or "%gpumem config" in s or "caching_allocator" in s
                   for s in said)
    assert any("`PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:" in s
               and "(before PyTorch first allocates)" in s for s in said)
    assert "free memory you no longer need: `del` the tensors holding it." in said


def test_a_row_of_many_holders_stays_one_line() -> None:
    from jupyter_gpumem.notebook.oom_panel import _names

    assert _names(["a", "b", "c", "d"]) == "a, b, c, d"
    assert _names([f"opt.state[p{i}].exp_avg" for i in range(12)]) == (
        "opt.state[p0].exp_avg, opt.state[p1].exp_avg, opt.state[p2].exp_avg and 9 more")


def test_history_with_pytorch_alone(shell, run) -> None:
    """No GPU for CuPy here (no simulated device either): ``%gpumem history`` is PyTorch's."""
    from jupyter_gpumem.runtime import registry

    mem = FakeTorchMemory(CAPACITY)
    try:
        views_on_fake(shell, run, mem)
        assert registry.current_allocator() is None
        result, out = run("%gpumem history on")
        assert result.success
        assert out.stdout == "gpumem: PyTorch's history on (stacks on, up to 100000 events)\n"
        assert mem.history_calls[-1]["enabled"] == "all"
        result, out = run("%gpumem history state")
        assert out.stdout == "gpumem: PyTorch's history as it was\n"
        assert mem.history_calls[-1]["enabled"] == "all"  # untouched
        run("%gpumem history off")
        assert mem.history_calls[-1]["enabled"] is None
    finally:
        sources.use_sources(("cupy",))


def test_a_pytorch_fraction_oom_is_met_again(shell, run, sim) -> None:
    """PyTorch capped by ``set_per_process_memory_fraction``: its snapshot does not say the cap,
    the source reads it with the trace, and the replay meets the error where it was recorded."""
    mem = FakeTorchMemory(4 * CAPACITY)  # the device is free; the fraction allows CAPACITY
    mem.set_per_process_memory_fraction(0.25)
    try:
        ext = views_on_fake(shell, run, mem)
        run("MiB = 1 << 20\n%gpumem history on")
        run(WORKLOAD[0])
        result, _ = run(WORKLOAD[1])
        assert type(result.error_in_exec).__module__ == "torch"
        offer = [s for s in ext.last_oom.advice if s.startswith("replaying this trace")]
        assert len(offer) == 1 and "max_split_size_mb:64" in offer[0]
        result, _ = run("%gpumem replay last --config recorded")
        (own,) = result.result.results
        assert own.config.per_process_memory_fraction == 0.25
        assert own.num_ooms == 1 and not own.fits
        assert ("the memory fraction is the one PyTorch had when the trace was read (0.25)"
                in own.notes)
    finally:
        run("del y")
        sources.use_sources(("cupy",))
