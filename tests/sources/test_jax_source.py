"""JAX as a memory source, over a fake ``jax`` (``fake_jax``: the surface JAX 0.11 showed on an
H200): XLA's counters in PyTorch's keys, the live arrays as blocks with their stacks, the
preallocation note, no history (and what JAX gives instead), the OOM report and steps, and
JAX arrays found in a pytree by the holder search once the registry made the source."""

from __future__ import annotations

import pytest
from fake_jax import H200_LIMIT, H200_TOTAL, FakeJax, JaxRuntimeError, MiB

from jupyter_gpumem import sources
from jupyter_gpumem.data import owners, sites
from jupyter_gpumem.data.holders import find
from jupyter_gpumem.data.schema import check_snapshot
from jupyter_gpumem.sources.jax import JAX_OWNERS, JaxSource, preallocation_note
from jupyter_gpumem.sources.protocol import CellPeak, missing_members, shows_row
from jupyter_gpumem.sources.registry import get_source

GiB = 1 << 30
FREE = 37_000_000_000  # what NVML said was free on the H200 with XLA's pool taken


@pytest.fixture
def fj() -> FakeJax:
    return FakeJax()


def source(fj: FakeJax, environ: dict[str, str] | None = None, **kwargs) -> JaxSource:
    return JaxSource(fj, environ=environ or {}, device_memory=lambda i: (FREE, H200_TOTAL),
                     **kwargs)


@pytest.fixture
def fresh_search():
    """The holder search and the site naming with no owner or marker registered, as before
    any source was made; put back after."""
    before = (owners.registered(), sites.library_markers())
    owners.reset()
    sites.reset_library_files()
    yield
    owners.reset()
    owners.register(before[0])
    sites.reset_library_files()
    sites.register_library_files(before[1][len(sites.LIBRARY_MARKERS):])


def test_a_jax_source_is_a_memory_source(fj) -> None:
    src = source(fj)
    assert missing_members(src) == []
    assert (src.name, src.title) == ("jax", "JAX's allocator (XLA's client)")
    assert shows_row(src.shows) == [
        "yes: XLA's counters (in use, peak, pool)",
        "live arrays only: XLA's pool and its free blocks are not visible",
        "yes: the stack that made each live array", "no: XLA records no allocation events",
        "yes; a bound (≤) where the counters cannot tell",
        "yes, with XLA's memory fraction and preallocation",
        "yes: JAX arrays, in pytrees too (`params['dense']['w']`)",
        "no: there are no events to replay"]
    assert src.owners is JAX_OWNERS and "/jax/" in src.library_files
    assert src.replay_setting() is None


def test_xla_counters_in_pytorch_keys(fj) -> None:
    src = source(fj)
    x = fj.array(4 * MiB)
    params = {"w": fj.array(4 * MiB), "b": fj.array(4096), "s": fj.array(12)}
    # XLA rounds each buffer to 256 bytes; with preallocation the pool is the whole limit
    in_use = 2 * 4 * MiB + 4096 + 256
    assert src.memory_stats() == {
        "allocated_bytes.all.current": in_use, "allocated_bytes.all.peak": in_use,
        "active_bytes.all.current": in_use, "active_bytes.all.peak": in_use,
        "reserved_bytes.all.current": H200_LIMIT, "reserved_bytes.all.peak": H200_LIMIT,
        "allocation.all.allocated": 4}
    assert (src.memory_allocated(), src.memory_reserved()) == (in_use, H200_LIMIT)
    assert src.xla_stats()["bytes_limit"] == H200_LIMIT
    del x, params
    st = src.memory_stats()
    assert (st["allocated_bytes.all.current"], st["allocated_bytes.all.peak"]) == (0, in_use)
    assert (src.device_index, src.device_name) == (0, "NVIDIA H200")
    assert src.mem_get_info() == (FREE, H200_TOTAL)


def test_without_preallocation_the_pool_grows(fj) -> None:
    fj = FakeJax(preallocate=False)
    src = source(fj, {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    x = fj.array(3 * MiB)
    assert src.memory_stats()["reserved_bytes.all.current"] == 4 * MiB
    del x


def test_the_platform_allocator_keeps_no_counters() -> None:
    fj = FakeJax(allocator="platform")
    src = source(fj, {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})
    mark = src.start_cell(1)
    x = fj.array(4 * MiB)
    assert src.xla_stats() is None
    assert src.memory_stats() == {"allocated_bytes.all.current": 4 * MiB,
                                  "active_bytes.all.current": 4 * MiB,
                                  "allocation.all.current": 1}
    assert src.end_cell(mark).peak == CellPeak(4 * MiB, False, "bound")
    assert src.status().notes == (
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform: XLA takes each array from the device and keeps "
        "no counters (allocated is the live arrays' bytes; no peak, no pool)",)
    del x


def test_live_blocks_are_the_live_arrays_with_their_stacks(fj) -> None:
    src = source(fj)
    x = fj.array(4 * MiB, line=2)
    y = fj.array(4096, line=5, file="/home/me/train.py")
    empty = fj.array(0, line=6)  # no buffer
    gone = fj.array(MiB, line=7)
    gone.delete()  # deleted: listed by no one
    live = src.live_blocks()
    assert sorted((size, requested) for _a, size, requested, _s in live.rows) == [
        (4096, 4096), (4 * MiB, 4 * MiB)]
    by_address = {a: s for a, _size, _r, s in live.rows}
    assert by_address.keys() == {x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()}
    frames = live.stacks.frames(by_address[x.unsafe_buffer_pointer()])
    assert frames[0]["filename"].endswith("/jax/_src/interpreters/pxla.py")  # innermost first
    assert frames[-1] == {"filename": "<ipython-input-3-abc>", "line": 2, "name": "<module>"}
    assert live.stacks.frames(by_address[y.unsafe_buffer_pointer()])[-1]["line"] == 5
    assert live.owner == ("jax", 0)
    del x, y, empty, gone


def test_arrays_of_one_line_share_a_stack(fj) -> None:
    src = source(fj)
    xs = [fj.array(1024, line=4) for _ in range(50)]
    rows = src.live_blocks().rows
    assert len(rows) == 50 and len({s for *_, s in rows}) == 1
    del xs


def test_a_sharded_array_is_its_shard_on_the_device_read() -> None:
    fj = FakeJax(gpus=2)
    src = source(fj, device=1)
    w = fj.sharded(2 * MiB)
    only0 = fj.array(MiB, device=0)
    rows = src.live_blocks().rows
    assert [(a, size) for a, size, _r, _s in rows] == [
        (w.addressable_shards[1].data.unsafe_buffer_pointer(), 2 * MiB)]
    assert src.device_index == 1
    del w, only0


def test_snapshot_one_segment_a_live_buffer(fj) -> None:
    src = source(fj)
    a = fj.array(2 * MiB, line=3)
    b = fj.array(100, line=4)
    snap = src.snapshot()
    assert check_snapshot(snap) is snap
    assert [(s["address"], s["total_size"], s["segment_type"], [bl["state"] for bl in s["blocks"]])
            for s in snap["segments"]] == [
        (a.unsafe_buffer_pointer(), 2 * MiB, "large", ["active_allocated"]),
        (b.unsafe_buffer_pointer(), 100, "small", ["active_allocated"])]
    assert snap["segments"][0]["blocks"][0]["frames"][-1]["line"] == 3
    assert snap["device_traces"] == []
    info = snap["jupyter_gpumem"]
    assert {k: info[k] for k in ("device", "device_name", "source", "device_free",
                                 "device_total")} == {
        "device": 0, "device_name": "NVIDIA H200", "source": "jax", "device_free": FREE,
        "device_total": H200_TOTAL}
    assert info["xla_memory_stats"]["bytes_limit"] == H200_LIMIT
    del a, b


def test_status_line_numbers_and_the_preallocation_note(fj) -> None:
    src = source(fj)
    x = fj.array(4 * MiB)
    st = src.status()
    assert (st.backend, st.device, st.device_name, st.allocated, st.peak, st.reserved,
            st.device_free, st.device_total, st.history) == (
        "jax", 0, "NVIDIA H200", 4 * MiB, 4 * MiB, H200_LIMIT, FREE, H200_TOTAL,
        "no event history (JAX)")
    assert st.notes == (
        "XLA preallocates 75% of the device for JAX (105 GiB, XLA's default), used or not: "
        "`XLA_PYTHON_CLIENT_PREALLOCATE=false` takes only what JAX uses, "
        "`XLA_PYTHON_CLIENT_MEM_FRACTION=.5` less (set before JAX starts)",)
    del x


@pytest.mark.parametrize(("environ", "note"), [
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"},
     "XLA preallocates 50% of the device for JAX (105 GiB, `XLA_PYTHON_CLIENT_MEM_FRACTION`), "
     "used or not: `XLA_PYTHON_CLIENT_PREALLOCATE=false` takes only what JAX uses (set before "
     "JAX starts)"),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
     "XLA takes memory as JAX needs it, up to 75% of the device (105 GiB, XLA's default)"),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "0", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"},
     "XLA takes memory as JAX needs it, up to 90% of the device (105 GiB, "
     "`XLA_PYTHON_CLIENT_MEM_FRACTION`)"),
])
def test_the_note_follows_the_environment(environ, note) -> None:
    # the limit is XLA's own figure (here the H200's at the default fraction)
    assert preallocation_note(environ, {"bytes_limit": H200_LIMIT}, H200_TOTAL) == note


def test_not_readable_before_jax_starts_and_without_a_gpu() -> None:
    fj = FakeJax(started=False)
    src = source(fj)
    assert src.unavailable() == ("JAX has not started its GPU backend yet (its first array "
                                 "does; gpumem never does)")
    assert not fj._started  # asking started nothing
    x = fj.array(8)
    assert src.unavailable() is None
    cpu = source(FakeJax(platform="cpu"))
    assert cpu.unavailable() == "JAX sees no GPU (its default backend is cpu)"
    del x


def test_no_history_and_what_jax_gives_instead(fj) -> None:
    src = source(fj)
    assert not src.history_on()
    assert src.recorded_trace() == (
        "gpumem: JAX records no event history (XLA keeps no allocation events); what it gives "
        "is the stack that made each live array (jax.profiler.device_memory_profile()): no "
        "array is live on device 0.")
    x = fj.array(4 * MiB, line=2)
    ys = [fj.array(MiB, line=3) for _ in range(2)]
    z = fj.array(12, line=9, file="/home/me/train.py")
    assert src.recorded_trace() == (
        "gpumem: JAX records no event history (XLA keeps no allocation events); what it gives "
        "is the stack that made each live array (jax.profiler.device_memory_profile()): 4 live "
        "arrays, 6.0 MiB, from cell [3] line 2 (4.0 MiB), cell [3] line 3 (2.0 MiB), "
        "train.py:9 (12 B).")
    assert src.profile_sites({"<ipython-input-3-abc>": 7})[:1] == [("cell [7] line 2", 4 * MiB, 1)]
    with pytest.raises(ValueError, match="JAX records no event history"):
        src.record_history("all")
    src.record_history("state")  # the stacks of live arrays: always kept
    src.record_history("off")
    del x, ys, z


def test_cell_peak_from_xla_counters(fj) -> None:
    src = source(fj)
    keep = fj.array(4 * MiB)
    mark = src.start_cell(2)
    tmp = fj.array(8 * MiB)
    del tmp
    assert src.end_cell(mark).peak == CellPeak(12 * MiB, True, "counter")
    mark = src.start_cell(3)  # below the peak, which XLA never resets: a bound
    tmp = fj.array(MiB)
    del tmp
    assert src.end_cell(mark).peak == CellPeak(12 * MiB, False, "bound")
    del keep


def test_oom_detected_reported_and_explained(fj) -> None:
    src = source(fj)
    x = fj.array(4 * MiB)
    with pytest.raises(JaxRuntimeError) as info:
        fj.array(160 * GiB)
    exc = info.value
    assert str(exc).startswith("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                               "160.00GiB with allocator GPU_0_bfc on device 0.")
    assert src.is_oom(exc)
    assert not src.is_oom(JaxRuntimeError("INVALID_ARGUMENT: UnsafeBufferPointer called on "
                                          "deleted or donated buffer"))
    assert not src.is_oom(MemoryError("RESOURCE_EXHAUSTED"))
    report = src.oom_report(exc)
    assert report is not None
    assert (report.requested, report.rounded, report.device, report.device_name,
            report.device_free, report.device_total, report.allocated, report.reserved,
            report.free_cached, report.largest_free_block, report.cap) == (
        160 * GiB, 160 * GiB, 0, "NVIDIA H200", FREE, H200_TOTAL, 4 * MiB, H200_LIMIT,
        H200_LIMIT - 4 * MiB, H200_LIMIT - 4 * MiB, None)
    # larger than the device: no fraction makes it fit
    assert src.oom_steps(report) == [
        "`del` the arrays you no longer need (`jax.live_arrays()` lists every live one): their "
        "memory goes back to XLA's pool at once.",
        "`jax.clear_caches()` drops the functions JAX compiled, and what they keep on the "
        "device."]
    assert src.oom_report(JaxRuntimeError("RESOURCE_EXHAUSTED: something else")) is None
    del x


def test_oom_steps_name_the_fraction_and_a_fragmented_pool(fj) -> None:
    src = source(fj)
    x = fj.array(100 * GiB)
    with pytest.raises(JaxRuntimeError) as info:
        fj.array(10 * GiB)
    report = src.oom_report(info.value)
    assert report is not None and report.requested == 10 * GiB
    assert src.oom_steps(report)[0] == (
        "XLA lets JAX use at most 105 GiB of this device (75%, `XLA_PYTHON_CLIENT_MEM_FRACTION`): "
        "set `XLA_PYTHON_CLIENT_MEM_FRACTION=.95` before JAX starts (restart the kernel) to let "
        "it use more.")
    del x
    fj._devices[0].largest_free = 64 * MiB  # XLA's pool in pieces
    report = src.oom_report(JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB with allocator "
        "GPU_0_bfc on device 0."))
    assert report is not None
    assert src.oom_steps(report)[0] == (
        "XLA's pool has 105 GiB free, but in pieces of at most 64.0 MiB: "
        "`XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async` (set before JAX starts) leaves placing each "
        "array to CUDA.")


def test_the_exact_bytes_where_xla_gives_them(fj) -> None:
    src = source(fj)
    exc = JaxRuntimeError("RESOURCE_EXHAUSTED: Failed to allocate request for 32.00MiB "
                          "(33554436B) on device ordinal 0")
    assert src.is_oom(exc)
    report = src.oom_report(exc)
    assert report is not None and (report.requested, report.rounded) == (33554436, 33554688)


def test_registry_makes_jax_from_the_injected_module(fj) -> None:
    try:
        assert sources.use_sources(("jax",), jax_module=fj) == ("jax",)
        made = sources.source("jax")
        assert isinstance(made, JaxSource) and made.jax is fj
        x = fj.array(MiB)
        assert [s.name for s in sources.current_sources()] == ["jax"]
        del x
    finally:
        sources.use_sources(("cupy",))


def test_a_params_pytree_found_by_the_holder_search(fresh_search, fj) -> None:
    src = source(fj)
    params = {"dense": {"w": fj.array(4 * MiB), "b": fj.array(4096)},
              "layers": [fj.array(MiB), {"scale": fj.array(512)}]}
    blocks = [(a, size) for a, size, _r, _s in src.live_blocks().rows]
    ns = {"params": params, "step": 3}
    assert find(ns, blocks, modules=False).names == {}  # no source told the search of JAX yet
    made = get_source("jax", jax_module=fj)  # the registry registers the source's owners
    assert JAX_OWNERS[0] in owners.registered() and made.owners == JAX_OWNERS
    found = find(ns, blocks, modules=False)
    w, b = params["dense"]["w"], params["dense"]["b"]
    assert found.names[w.unsafe_buffer_pointer()] == ["params['dense']['w']"]
    assert found.names[b.unsafe_buffer_pointer()] == ["params['dense']['b']"]
    assert found.names[params["layers"][1]["scale"].unsafe_buffer_pointer()] == [
        "params['layers'][1]['scale']"]
    # its elements are a dict and a list: "objects"
    assert [g.describe() for g in found.groups] == ["params (dict of 4 objects, 5.0 MiB)"]


def test_jax_frames_are_a_library_s_once_registered(fresh_search, fj) -> None:
    from jupyter_gpumem.data.sites import site_of

    frames = [{"filename": "/src/jax/jax/_src/pjit.py", "line": 1166, "name": "_pjit"},
              {"filename": "/home/me/train.py", "line": 12, "name": "<module>"}]
    assert site_of(frames) == "pjit.py:1166"  # a JAX built from source: not site-packages
    get_source("jax", jax_module=fj)
    assert site_of(frames) == "train.py:12"
