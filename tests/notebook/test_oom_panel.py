"""The out-of-memory explainer: shown under the traceback, with the facts and a next step."""

from __future__ import annotations

from jupyter_gpumem import OomReport
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.oom_panel import (
    HolderRow,
    advice,
    build_panel,
    is_oom_error,
    next_step,
)
from jupyter_gpumem.sources.cupy import CupySource

MiB = 1 << 20


def report(**kw) -> OomReport:
    base = dict(requested=600 * MiB, rounded=600 * MiB, segment_size=600 * MiB, stream=0,
                device=0, device_name="Simulated GPU 0", device_free=400 * MiB,
                device_total=1024 * MiB, allocated=600 * MiB, reserved=620 * MiB,
                largest_free_block=20 * MiB, free_cached=20 * MiB, cap=None, fraction=None,
                max_split_size=None, processes=[])
    base.update(kw)
    return OomReport(**base)


ARRAY_LIKE = """
BIG = 600 << 20
import types
class DeviceArray:  # what the panel needs of a CuPy array: .data.ptr and .nbytes
    def __init__(self, ptr, nbytes):
        self._data = types.SimpleNamespace(ptr=ptr)
        self.nbytes = nbytes
    @property
    def data(self):
        return self._data
"""


def oom_cell(shell, run, holder: str) -> tuple:
    """Cell 3 keeps 600 MiB alive through ``holder``; cell 4 runs out of memory."""
    run("%load_ext jupyter_gpumem")
    get_extension(shell).settings.live_view = False
    run("import jupyter_gpumem as g\n" + ARRAY_LIKE)  # cell 2
    run(holder)  # cell 3
    result, out = run("more = g.caching_allocator_alloc(600 << 20)")  # cell 4
    assert is_oom_error(result.error_in_exec)
    return result, out


def test_panel_under_the_traceback(shell, run, sim) -> None:
    _, out = oom_cell(shell, run, "big = DeviceArray(g.caching_allocator_alloc(BIG), BIG)")
    panel = out.outputs[-1].data
    text = panel["text/plain"]
    assert text.splitlines()[0] == (
        "GPU out of memory in cell [4]: asked for 600 MiB (600 MiB after rounding) on device 0 "
        "(Simulated GPU 0); the largest free block was 0 B.")
    assert "\n  600 MiB  1 block  cell [3] line 1  ← big" in text
    assert "Other processes: none" in text
    assert "\nNext steps:\n  - free big (600 MiB, cell [3] line 1): `del big` (if nothing else " \
           "refers to it) and run the cell again.\n  - shrink the work" in text
    assert 'class="jupyter-gpumem-oom"' in panel["text/html"]
    assert get_extension(shell).ledger.rows[-1]["ooms"] == 1
    run("g.caching_allocator_delete(big.data.ptr)")


def test_code_is_code_in_html_and_backticks_in_text(shell, run, sim) -> None:
    _, out = oom_cell(shell, run, "held = [DeviceArray(g.caching_allocator_alloc(BIG), BIG)]")
    panel = out.outputs[-1].data
    assert "`del held[0]`" in panel["text/plain"]
    assert "<code>del held[0]</code>" in panel["text/html"]
    assert "`" not in panel["text/html"]
    run("g.caching_allocator_delete(held[0].data.ptr)")


def test_a_handle_is_freed_by_caching_allocator_delete_not_del(shell, run, sim) -> None:
    # caching_allocator_alloc returns the address, an int: `del big` would free nothing
    _, out = oom_cell(shell, run, "big = g.caching_allocator_alloc(600 << 20)\ncopy = big + 0")
    text = out.outputs[-1].data["text/plain"]
    assert "\n  600 MiB  1 block  cell [3] line 1  ← big (600 MiB)\n" in text  # not its copy
    assert "`caching_allocator_delete(big)`" in text and "`del big`" not in text
    run("g.caching_allocator_delete(big)")


def test_the_footer_and_the_panel_name_the_same_holders(shell, run, sim) -> None:
    run("%load_ext jupyter_gpumem")
    get_extension(shell).settings.live_view = False
    run("import jupyter_gpumem as g\n%gpumem auto on\n" + ARRAY_LIKE)  # cell 2
    _, out = run("small = [DeviceArray(g.caching_allocator_alloc(12 << 20), 12 << 20) "
                 "for _ in range(20)]")  # cell 3
    assert "held by small (list of 20 × 12 MiB)" in out.stdout
    _, out = run("g.caching_allocator_alloc(2 << 30)")  # cell 4
    html = out.outputs[-1].data["text/html"]
    assert '<td style="text-align: left">small (list of 20 × 12 MiB)</td>' in html
    run("for a in small:\n    g.caching_allocator_delete(a.data.ptr)\ndel small")


def test_each_step_is_said_once_and_only_when_true(shell, run, sim) -> None:
    _, out = oom_cell(shell, run, "big = DeviceArray(g.caching_allocator_alloc(BIG), BIG)")
    message_step = out.stdout.split("Next step: ")[1].splitlines()[0]
    panel = get_extension(shell).last_oom
    said = [message_step, *panel.advice]
    assert len(said) == len(set(said)) == 3, said
    assert message_step not in panel.text()
    # the retry ladder released every whole cached segment before raising: nothing to empty
    assert "empty_cache" not in out.stdout + panel.text()
    # nothing is fragmented, nothing is capped, no other process holds memory
    assert not any(w in out.stdout + panel.text()
                   for w in ("max_split_size", "%gpumem limit", "%gpumem processes"))
    run("g.caching_allocator_delete(big.data.ptr)")


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
        panel = build_panel(exc, CupySource(sim))
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


def test_a_cap_refused_request_gets_the_cap_advice_only() -> None:
    # 400 MiB asked under a cap, with 139 GiB of the device free: no "0.0× what the device
    # has free", no "free memory", no named holder to delete
    r = report(requested=400 * MiB, rounded=400 * MiB, segment_size=400 * MiB,
               cap=4 * 1024 * MiB, fraction=0.0286, device_free=139 * 1024 * MiB,
               device_total=140 * 1024 * MiB, allocated=3900 * MiB, reserved=3920 * MiB)
    rows = [HolderRow(3, "cell [3] line 1", 3900 * MiB, 20, ("small",), 3900 * MiB,
                      ("small",))]
    assert advice(r, rows) == [
        "the cap, not the device, refused this request: raise it (e.g. `%gpumem limit 0.08`)."]
    # the cap and the device both short: how far off, against what the cap leaves
    tight = report(cap=700 * MiB, fraction=0.68, device_free=300 * MiB, reserved=650 * MiB)
    assert advice(tight, [])[-1] == (
        "shrink the work: this request needs 600 MiB, about 12.0× what the cap leaves — a "
        "smaller batch or chunked processing may fit.")
    # room on the device for the request, refused for fragmentation: no ratio
    fragmented = report(device_free=900 * MiB, free_cached=700 * MiB)
    assert advice(fragmented, [])[-1] == (
        "shrink the work: this request needs 600 MiB — a smaller batch or chunked processing "
        "may fit.")


def test_named_holders_lead_the_advice() -> None:
    rows = [HolderRow(3, "cell [3] line 1", 600 * MiB, 1, ("big",), 600 * MiB, ("big",))]
    assert next_step(report(), rows) == (
        "free big (600 MiB, cell [3] line 1): `del big` (if nothing else refers to it) and run "
        "the cell again.")
    assert next_step(report(), []).startswith("free memory you no longer need")
    # what the names hold, not what their line allocated, must make room
    rows = [HolderRow(3, "cell [3] line 1", 600 * MiB, 2, ("small",), 100 * MiB, ("small",))]
    assert not any(step.startswith("free small") for step in advice(report(), rows))


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


def test_split_advice_only_when_fragmentation_is_the_cause() -> None:
    fragmented = report(free_cached=700 * MiB, largest_free_block=20 * MiB, reserved=1000 * MiB,
                        allocated=300 * MiB, device_free=24 * MiB)
    assert any("max_split_size_mb:" in s for s in advice(fragmented, []))
    assert not any("max_split_size" in s for s in advice(report(), []))  # not fragmented
    already = report(free_cached=700 * MiB, largest_free_block=20 * MiB, reserved=1000 * MiB,
                     allocated=300 * MiB, device_free=24 * MiB, max_split_size=64 * MiB)
    assert not any("max_split_size" in s for s in advice(already, []))  # set already
    assert not any("empty_cache" in s for r in (fragmented, already, report())
                   for s in advice(r, []))


def test_other_processes_advice_only_when_stopping_them_makes_room() -> None:
    few = report(processes=[(42, "python", 100 * MiB)])  # 400 + 100 MiB free < 600 MiB
    assert not any("other processes" in s for s in advice(few, []))
    many = report(processes=[(42, "python", 300 * MiB)])
    assert any("other processes hold 300 MiB" in s for s in advice(many, []))
