"""The out-of-memory explainer: shown under the traceback, with the facts and a next step."""

from __future__ import annotations

from jupyter_gpumem import OomReport
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.oom_panel import HolderRow, build_panel, is_oom_error, next_step

MiB = 1 << 20


def report(**kw) -> OomReport:
    base = dict(requested=600 * MiB, rounded=600 * MiB, segment_size=600 * MiB, stream=0,
                device=0, device_name="Simulated GPU 0", device_free=400 * MiB,
                device_total=1024 * MiB, allocated=600 * MiB, reserved=620 * MiB,
                largest_free_block=20 * MiB, free_cached=20 * MiB, cap=None, fraction=None,
                max_split_size=None, processes=[])
    base.update(kw)
    return OomReport(**base)


def test_panel_under_the_traceback(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    get_extension(shell).settings.live_view = False
    run("import jupyter_gpumem as g")
    run("big = g.caching_allocator_alloc(600 << 20)")  # cell 3
    result, out = run("more = g.caching_allocator_alloc(600 << 20)")  # cell 4
    assert is_oom_error(result.error_in_exec)
    panel = out.outputs[-1].data
    text = panel["text/plain"]
    assert text.splitlines()[0] == (
        "GPU out of memory in cell [4]: asked for 600 MiB (600 MiB after rounding) on device 0 "
        "(Simulated GPU 0); the largest free block was 0 B.")
    assert "\n  600 MiB  1 block  cell [3] line 1  ← big" in text
    assert "Other processes: none" in text
    assert "`del big`" in text
    assert 'class="jupyter-gpumem-oom"' in panel["text/html"]
    assert get_extension(shell).ledger.rows[-1]["ooms"] == 1
    run("g.caching_allocator_delete(big)")


def test_panel_off(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    get_extension(shell).settings.oom_panel = False
    run("import jupyter_gpumem as g")
    _, out = run("g.caching_allocator_alloc(2 << 30)")
    assert out.outputs == []


def test_fragmented_bytes_and_split_advice(sim) -> None:
    ptrs = [sim.malloc(7 * MiB) for _ in range(60)]  # 30 segments of 20 MiB, 6 MiB left in each
    try:
        sim.malloc(500 * MiB)
    except MemoryError as exc:
        panel = build_panel(exc, allocator=sim)
    else:
        raise AssertionError("expected an out-of-memory error")
    finally:
        for p in ptrs:
            sim.free(p)
    assert panel.fragmented == 30 * 6 * MiB
    assert "180 MiB free but fragmented" in panel.text()


def test_cap_advice() -> None:
    r = report(cap=700 * MiB, fraction=0.68, device_free=900 * MiB, allocated=100 * MiB,
               reserved=120 * MiB, free_cached=20 * MiB)
    assert next_step(r, []).startswith("the cap, not the device, refused this request")


def test_named_holders_lead_the_advice() -> None:
    rows = [HolderRow(3, "cell [3] line 1", 600 * MiB, 1, ("big",))]
    assert next_step(report(), rows).startswith(
        "free big (600 MiB, cell [3] line 1): `del big`, then jupyter_gpumem.empty_cache()")
    assert next_step(report(), []).startswith("free arrays you no longer need")


def test_other_processes_listed() -> None:
    from jupyter_gpumem.notebook.oom_panel import OomPanel

    panel = OomPanel("oom", report(processes=[(42, "python", 300 * MiB)]), 0)
    assert "Other processes: pid 42 (python) 300 MiB." in panel.text()


def test_is_oom_error() -> None:
    from jupyter_gpumem import OutOfMemoryError

    assert is_oom_error(OutOfMemoryError(report()))
    assert not is_oom_error(MemoryError("x")) and not is_oom_error(None)
    cupy_like = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})
    assert is_oom_error(cupy_like())
