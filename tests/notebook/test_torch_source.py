"""``%gpumem source torch`` in a real InteractiveShell, with a fake ``torch.cuda.memory``
(``fake_torch``): footer and ledger numbers are the module's stats, the cell peak rule, the
trace and its holders, both sources at once, and the OOM explainer on PyTorch's error."""

from __future__ import annotations

import re
import sys

import pytest
from cell_text import text_of
from fake_torch import FakeTorchMemory, views_on_fake

from jupyter_gpumem import sources
from jupyter_gpumem.data.units import format_bytes, format_signed_bytes
from jupyter_gpumem.notebook.extension import get_extension

MiB = 1 << 20


@pytest.fixture
def fake():
    mem = FakeTorchMemory()
    yield mem
    sources.use_sources(("cupy",))


@pytest.fixture
def torch_gm(shell, run, sim, fake):
    """The extension loaded on a simulated device, the views on the fake PyTorch."""
    ext = views_on_fake(shell, run, fake, footer=True)
    run("import fake_torch as ft\nMiB = 1 << 20")
    return ext




def torch_rows(ext) -> list[dict]:
    return [r for r in ext.ledger.rows if r.get("memory_source") == "torch"]


def test_source_magic_switches_and_rejects(shell, run, sim, fake) -> None:
    run("%load_ext jupyter_gpumem")
    get_extension(shell).settings.live_view = False
    sources.use_torch(fake)  # the module to read (real torch is not installed here)
    result, out = run("%gpumem source both")
    assert result.success and sources.selected() == ("cupy", "torch")
    assert "PyTorch's allocator" in out.stdout
    result, out = run("%gpumem source tensorflow")
    assert not result.success and sources.selected() == ("cupy", "torch")
    assert "source takes torch, cupy or both" in out.stderr + str(result.error_in_exec)
    run("%gpumem source cupy")
    assert sources.selected() == ("cupy",)
    assert "torch" not in sys.modules


def test_footer_and_ledger_are_the_modules_stats(torch_gm, run, fake) -> None:
    before = fake.memory_stats()
    result, out = run("x = mem.empty(6 * MiB)\ny = mem.empty(2 * MiB)\ndel y")
    assert result.success
    after = fake.memory_stats()
    row = torch_rows(torch_gm)[-1]
    assert row["allocated_delta"] == (after["allocated_bytes.all.current"]
                                      - before.get("allocated_bytes.all.current", 0)) == 6 * MiB
    assert row["reserved_delta"] == after["reserved_bytes.all.current"] == fake.memory_reserved()
    assert row["peak_allocated"] == after["allocated_bytes.all.peak"] == 8 * MiB
    assert row["peak_exact"] is True
    assert (row["allocs"], row["frees"]) == (2, 1)
    assert [r for r in torch_gm.ledger.rows if "memory_source" not in r] == []  # cupy is off
    footer = [ln for ln in out.stdout.splitlines() if ln.startswith("gpumem [")]
    assert footer == [f"gpumem [{row['cell']}] torch: Δallocated {format_signed_bytes(6 * MiB)}"
                      f" · peak {format_bytes(8 * MiB)} · reserved "
                      f"{format_bytes(fake.memory_reserved())} "
                      f"(Δ {format_signed_bytes(row['reserved_delta'])})"]
    assert "x (6.0 MiB)" in out.stdout  # who holds what the cell left
    assert fake.peak_resets == 0


def test_a_peak_below_the_users_peak_is_a_bound(torch_gm, run, fake) -> None:
    run("big = mem.empty(40 * MiB)\ndel big")
    _, out = run("small = mem.empty(2 * MiB)\ndel small")
    row = torch_rows(torch_gm)[-1]
    assert (row["peak_allocated"], row["peak_exact"]) == (40 * MiB, False)
    assert f"peak ≤ {format_bytes(40 * MiB)}" in out.stdout
    _, table = run("%gpumem cells")
    assert f"≤ {format_bytes(40 * MiB)}" in text_of(table)
    # with PyTorch's history on, the cell's own peak is exact
    fake._record_memory_history("all", stacks="python")
    run("small = mem.empty(2 * MiB)\ndel small")
    row = torch_rows(torch_gm)[-1]
    assert (row["peak_allocated"], row["peak_exact"]) == (2 * MiB, True)
    fake._record_memory_history(None)
    assert fake.peak_resets == 0


def test_status_summary_stats_snapshot_diff(torch_gm, run, fake) -> None:
    run("a = mem.empty(3 * MiB)")
    cell_a = torch_rows(torch_gm)[-1]["cell"]
    run("b = mem.empty(5 * MiB)")
    cell_b = torch_rows(torch_gm)[-1]["cell"]
    _, out = run("%gpumem")
    status = text_of(out)
    assert "gpumem · torch device 0 (Fake H200) · allocated 8.0 MiB" in status
    assert "history off" in status
    _, out = run("%gpumem stats --json")
    assert '"allocated_bytes.all.current": 8388608' in out.stdout
    _, out = run("%gpumem summary")
    assert "Allocated memory" in out.stdout and "8192 KiB" in out.stdout
    _, out = run("%gpumem snapshot")
    assert out.outputs  # the layout picture of PyTorch's segments
    _, out = run(f"%gpumem diff {cell_a} {cell_b}")
    text = "\n".join(o.data["text/plain"] for o in out.outputs)
    assert text.startswith(f"torch: cell [{cell_a}] → cell [{cell_b}]: 1 new block(s) (5.0 MiB)")


def test_trace_under_torch_names_holders(torch_gm, run, fake, shell) -> None:
    run("model = ft.FakeSequential(ft.FakeLinear(mem, 256, 256), None, "
        "ft.FakeLinear(mem, 256, 16))\nopt = ft.FakeAdamW(model.parameters())")
    result, _ = run(
        "%%gpumem_trace -o t --no-plot\n"
        "act = mem.empty(3 * MiB)\n"
        "for p in model.parameters():\n"
        "    p.grad = mem.empty(p.nbytes)\n"
        "opt.step()\n"
        "tmp = mem.empty(1 * MiB)\n"
        "del tmp")
    assert result.success, result.error_in_exec
    t = shell.user_ns["t"]
    assert "torch" in t.title
    names = {n for b in t.surviving for n in b.holders}
    assert "act" in names
    assert "model.0.weight.grad" in names
    assert "opt.state[model.0.weight].exp_avg" in names
    assert "opt.state[model.2.bias].exp_avg_sq" in names
    assert "model.0.weight" not in names  # parameters were made before
    assert t.peak_allocated == fake.max_memory_allocated()
    assert any(re.fullmatch(r"cell \[\d+\] line \d+", s.site) for s in t.top_sites)
    # history was off: it was switched on for the cell (with stacks) and off again
    calls = fake.history_calls
    assert calls[0]["enabled"] == "all" and calls[0]["stacks"] == "python"
    assert calls[-1]["enabled"] is None and not fake._history_enabled()


def test_trace_bands_by_holder_under_torch(torch_gm, run, fake, shell) -> None:
    run("model = ft.FakeSequential(ft.FakeLinear(mem, 256, 256), None, "
        "ft.FakeLinear(mem, 256, 16))\nopt = ft.FakeAdamW(model.parameters())")
    step = ("act = [mem.empty(3 * MiB) for _ in range(2)]\n"
            "for p in model.parameters():\n"
            "    p.grad = mem.empty(p.nbytes)\n"
            "del act\n"
            "opt.step()\n"
            "loss = mem.empty(512)")
    result, _ = run("%%gpumem_trace -o t --no-plot\n" + step)
    assert result.success, result.error_in_exec
    t = shell.user_ns["t"]
    assert t.bands == "holder"  # PyTorch's default
    tl = t.to_json()["timeline"]
    assert tl["band_labels"] == ["parameters & buffers", "gradients", "optimizer state",
                                 "other variables",
                                 "freed during the trace (activations, temporaries)"]
    result, _ = run("%%gpumem_trace -o t --no-plot --bands site\n" + step)
    assert result.success, result.error_in_exec
    assert shell.user_ns["t"].bands == "site"
    assert shell.user_ns["t"].to_json()["timeline"]["band_labels"][-1] == "other"
    shell.user_ns["t"] = None
    result, out = run("%%gpumem_trace -o t --bands person\nran = True")
    assert not result.success
    assert "invalid choice: 'person'" in out.stderr + str(result.error_in_exec)
    assert "ran" not in shell.user_ns and shell.user_ns["t"] is None  # nothing ran


def test_trace_leaves_the_users_history_on(torch_gm, run, fake, shell) -> None:
    fake._record_memory_history("all", stacks="python", max_entries=5000)
    run("early = mem.empty(1 * MiB)")
    n = len(fake.history_calls)
    result, _ = run("%%gpumem_trace -o t --no-plot\nlate = mem.empty(2 * MiB)")
    assert result.success
    assert len(fake.history_calls) == n and fake._history_enabled()  # untouched
    t = shell.user_ns["t"]
    assert [s.holders for s in t.surviving] == [("late",)]  # only the cell's events
    fake._record_memory_history(None)


def test_both_sources_two_labelled_rows(torch_gm, run, fake, sim) -> None:
    sources.use_sources(("cupy", "torch"))
    try:
        _both(torch_gm, run)
    finally:
        run("__import__('jupyter_gpumem').caching_allocator_delete(p)")


def _both(torch_gm, run) -> None:
    result, out = run("p = __import__('jupyter_gpumem').caching_allocator_alloc(4 * MiB)"
                      "\nx = mem.empty(2 * MiB)")
    assert result.success
    footer = [ln for ln in out.stdout.splitlines() if ln.startswith("gpumem [")]
    assert len(footer) == 2
    assert re.match(r"gpumem \[\d+\] cupy: Δallocated \+4\.0 MiB", footer[0])
    assert re.match(r"gpumem \[\d+\] torch: Δallocated \+2\.0 MiB", footer[1])
    cell = footer[0].split("]")[0] + "]"
    rows = [r for r in torch_gm.ledger.rows if f"gpumem [{r['cell']}]" == cell]
    assert [r.get("memory_source", "cupy") for r in rows] == ["cupy", "torch"]
    _, status = run("%gpumem")
    lines = text_of(status).splitlines()
    assert any(ln.startswith("cupy: gpumem · sim device 0") for ln in lines)
    assert any(ln.startswith("torch: gpumem · torch device 0") for ln in lines)
    _, table = run("%gpumem cells")
    assert re.search(r"\[\d+\] cupy .*\n.*\[\d+\] torch", text_of(table))


def test_oom_explainer_on_torch_error(torch_gm, run, fake) -> None:
    run("keep = mem.empty(100 * MiB)")
    result, _ = run("huge = mem.empty(4 << 30)")
    assert type(result.error_in_exec).__module__ == "torch"
    panel = torch_gm.last_oom
    assert panel is not None and panel.report is not None
    assert panel.report.requested == 4 << 30
    assert panel.report.allocated == fake.memory_allocated()
    text = panel.text()
    assert "GPU out of memory in cell" in text and "asked for 4.0 GiB" in text
    assert "keep" in text  # the variable holding the live memory
