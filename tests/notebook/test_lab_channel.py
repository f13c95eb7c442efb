"""The channel to JupyterLab's panel and badges (``notebook.lab_channel``), in a real
InteractiveShell with a recording comm layer: what the load announces, what each cell sends,
the samples pushed while a cell runs, the hello, a frontend's own comm, the unload; the session's
series and clock (``notebook.session_series``); the devices and sources; the schema the
frontend mirrors."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_comms import RecordingComm, RecordingLayer

from jupyter_gpumem.data import lab_schema
from jupyter_gpumem.notebook import lab_channel
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.session_series import SessionClock, SessionSeries

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@pytest.fixture
def layer(monkeypatch: pytest.MonkeyPatch) -> RecordingLayer:
    found = RecordingLayer()
    monkeypatch.setattr(lab_channel, "comm_layer", lambda shell: found)
    return found


@pytest.fixture
def freed(sim: Any) -> Iterator[Any]:
    """The simulated device; what the cells left allocated is freed afterwards."""
    yield sim
    for block in sim.state().blocks:
        if block.allocated:
            sim.free(block.address)


@pytest.fixture
def lab(layer: RecordingLayer, shell: Any, run: Any, freed: Any) -> tuple[Any, RecordingComm]:
    """The extension loaded in ``shell`` as in a kernel, on the simulated device."""
    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    ext = get_extension(shell)
    ext.settings.live_view = False
    run("import jupyter_gpumem as gm\nMiB = 1 << 20")
    (comm,) = layer.opened
    comm.sent.clear()
    return ext, comm


def test_outside_a_kernel_there_is_no_channel(shell: Any, run: Any, sim: Any) -> None:
    assert lab_channel.comm_layer(shell) is None  # an InteractiveShell has no kernel
    run("%load_ext jupyter_gpumem")
    assert get_extension(shell).lab is None


def test_the_setting_turns_it_off(layer: RecordingLayer, shell: Any, run: Any, sim: Any) -> None:
    shell.run_line_magic("config", "GpuMem.lab_panel = False")
    try:
        run("%load_ext jupyter_gpumem")
        assert get_extension(shell).lab is None and layer.opened == [] and layer.targets == {}
    finally:
        shell.config.GpuMem.pop("lab_panel", None)


def test_load_announces_and_registers_unload_closes(layer: RecordingLayer, shell: Any,
                                                    run: Any, sim: Any) -> None:
    run("%load_ext jupyter_gpumem")
    (comm,) = layer.opened
    assert comm.opened_with["type"] == "state" and comm.opened_with["version"] == 1
    assert lab_schema.COMM_TARGET in layer.targets
    channel = get_extension(shell).lab
    run("%unload_ext jupyter_gpumem")
    assert comm.closed_with == {"reason": "unload"}
    assert layer.targets == {} and channel.comms == []


def test_each_cell_sends_its_badge_span_samples_and_devices(lab: Any, run: Any) -> None:
    ext, comm = lab
    run("x = gm.caching_allocator_alloc(64 * MiB)")
    run("t = gm.caching_allocator_alloc(128 * MiB)\ngm.caching_allocator_delete(t)")
    run("y = gm.caching_allocator_alloc(2 << 30)")  # more than the 1 GiB device: OOM
    cells = [m for m in comm.sent if m["type"] == "cell"]  # (a slow cell also pushes samples)
    assert len(cells) == 3 and comm.sent[-1] is cells[-1]
    first, temp, oom = cells
    (rec,) = first["badge"]["records"]
    assert rec == {"source": "cupy", "device": 0, "device_name": "Simulated GPU 0",
                   "allocated_delta": 64 * MiB, "reserved_delta": 64 * MiB,
                   "peak_allocated": 64 * MiB, "peak_exact": True, "ooms": 0,
                   "holders": "x (64.0 MiB)", "wall_s": rec["wall_s"]}
    assert first["badge"]["execution_count"] == first["span"]["cell"] == ext.ledger.rows[-3]["cell"]
    assert first["span"]["end"] - first["span"]["start"] >= lab_schema.MIN_CELL_S
    (device,) = first["devices"]
    assert device["total"] == 1 << 30 and device["sources"] == [
        {"source": "cupy", "allocated": 64 * MiB, "reserved": 64 * MiB}]
    assert device["other_processes"] == 0 and device["rest_of_process"] == 0
    assert first["sources"][0]["name"] == "cupy" and first["sources"][0]["config"] == ""
    # a temporary's peak, between the cell's samples (Note [A cell's peak between samples])
    rows = [r for m in comm.sent[comm.sent.index(first) + 1:comm.sent.index(temp) + 1]
            for r in m["lanes"]["cupy:0"]]
    assert max(r[1] for r in rows) == 64 * MiB + 128 * MiB
    assert rows[-1][1] == 64 * MiB
    assert temp["badge"]["records"][0]["peak_allocated"] == 192 * MiB
    assert oom["badge"]["records"][0]["ooms"] == 1
    times = [r[0] for m in comm.sent for r in m["lanes"]["cupy:0"]]
    assert times == sorted(times)  # one axis, each row once


def test_a_running_cell_pushes_samples_from_a_thread(lab: Any, run: Any) -> None:
    ext, comm = lab
    ext.lab.interval_s, ext.lab.send_every_s = 0.02, 0.1
    threads: set[str] = set()
    send = comm.send
    comm.send = lambda data: (threads.add(threading.current_thread().name), send(data))
    run("x = gm.caching_allocator_alloc(64 * MiB)\nimport time\ntime.sleep(0.6)")
    kinds = comm.kinds()
    assert kinds[-1] == "cell" and 2 <= kinds.count("samples") <= 8
    assert "jupyter_gpumem-lab-sampler" in threads  # pushed while the cell ran
    pushed = [r for m in comm.sent[:-1] for r in m["lanes"]["cupy:0"]]
    assert any(r[1] == 64 * MiB for r in pushed)
    times = [r[0] for m in comm.sent for r in m["lanes"]["cupy:0"]]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_no_frontend_no_thread_but_the_state_has_every_cell(layer: RecordingLayer, shell: Any,
                                                            run: Any, freed: Any) -> None:
    run("%load_ext jupyter_gpumem")
    (comm,) = layer.opened
    comm.frontend_closes()  # another frontend closed it: no one listens
    ext = get_extension(shell)
    ext.settings.live_view = False
    shell.run_cell("import jupyter_gpumem as gm\nx = gm.caching_allocator_alloc(64 << 20)",
                   store_history=True, cell_id="cell-a")
    assert comm.sent == [] and ext.lab._thread is None
    # a frontend opens a comm of its own: the state, with the cell and its id
    own = RecordingComm()
    layer.targets[lab_schema.COMM_TARGET](own, {})
    (state,) = own.sent
    assert [c["cell_id"] for c in state["cells"]] == ["cell-a"]
    assert state["cells"][0]["badge"]["records"][0]["holders"] == "x (64.0 MiB)"
    assert state["spans"][0]["cell_id"] == "cell-a" and state["lanes"][0]["key"] == "cupy:0"
    # and it hears the next cell; a hello on it gets the state again
    run("y = 1")
    assert own.kinds() == ["state", "cell"]
    own.frontend_says({"type": "hello"})
    assert own.kinds() == ["state", "cell", "state"]
    own.frontend_says({"type": "something else"})
    assert own.kinds() == ["state", "cell", "state"]


def test_request_ids_from_the_kernel_parent() -> None:
    class Kernel:
        def get_parent(self, channel: str) -> dict[str, Any]:
            assert channel == "shell"
            return {"header": {"msg_id": "m1"}, "metadata": {"cellId": "c1"}}

    class Shell:
        kernel = Kernel()

    assert lab_channel.request_ids(Shell()) == ("m1", "c1")
    assert lab_channel.request_ids(Shell(), type("Info", (), {"cell_id": "c2"})()) == ("m1", "c2")
    assert lab_channel.request_ids(object()) == (None, None)


# -- the series --------------------------------------------------------------------------------


def test_session_time_leaves_idle_out_and_widens_quick_cells() -> None:
    now = [100.0]
    clock = SessionClock(lambda: now[0], min_cell_s=0.2)
    assert clock.start_cell() == 0.0
    now[0] += 1.5
    assert clock.now() == 1.5
    assert clock.end_cell() == 1.5
    now[0] += 3600  # an hour idle
    assert clock.now() == 1.5 and clock.start_cell() == 1.5
    now[0] += 0.001
    assert clock.end_cell() == pytest.approx(1.7)  # a quick cell gets 0.2 s


def test_series_is_bounded_keeps_the_peak_and_sends_each_row_once() -> None:
    series = SessionSeries(max_points=50)
    for i in range(1000):
        series.add("cupy", 0, "G", (float(i), 10_000 if i == 640 else i % 7, i % 5, None))
        if i % 97 == 0:
            series.take_new()
    rows = series.rows("cupy:0")
    assert len(rows) <= 100 and max(r[1] for r in rows) == 10_000
    (lane,) = series.lanes()  # what a frontend gets: at most max_points, the peak kept
    assert len(lane["samples"]) <= 50 and max(r[1] for r in lane["samples"]) == 10_000
    series.add("cupy", 0, "G", (999.0, 3, 3, None))  # the same time: replaces the last
    assert series.rows("cupy:0")[-1] == (999.0, 3, 3, None)
    new, lanes = series.take_new()
    assert new["cupy:0"][-1] == [999.0, 3, 3, None] and lanes == []
    assert series.take_new() == ({}, [])


def test_a_cells_peak_goes_between_its_samples() -> None:
    series = SessionSeries()
    series.add("cupy", 0, "G", (0.0, 10, 10, None))
    series.add("cupy", 0, "G", (0.2, 10, 30, None))
    assert series.mark_peak("cupy", 0, 0.0, 30)
    assert series.rows("cupy:0") == [(0.0, 10, 10, None), (0.1, 30, 30, None),
                                     (0.2, 10, 30, None)]
    assert not series.mark_peak("cupy", 0, 0.0, 30)  # reached already
    assert not series.mark_peak("torch", 0, 0.0, 99)  # no such lane


# -- the frontend's copy of the schema --------------------------------------------------------


def test_the_frontend_schema_has_the_same_constants() -> None:
    ts = (ROOT / "labextension" / "src" / "lab" / "schema.ts").read_text()

    def const(name: str) -> str:
        m = re.search(rf"export const {name} = (.+?);", ts)
        assert m, name
        return m.group(1).strip("'")

    assert const("COMM_TARGET") == lab_schema.COMM_TARGET
    assert const("METADATA_KEY") == lab_schema.METADATA_KEY
    assert int(const("LAB_SCHEMA")) == lab_schema.LAB_SCHEMA
    assert int(const("SAVED_POINTS")) == lab_schema.SAVED_POINTS
    assert int(const("SAVED_SPANS")) == lab_schema.SAVED_SPANS
    from jupyter_gpumem.render.view_payload import MAX_POINTS

    assert int(const("LIVE_POINTS")) == MAX_POINTS


def test_read_badges_of_a_saved_notebook() -> None:
    badge = {"version": 1, "execution_count": 2, "records": []}
    nb = {"cells": [{"id": "a", "metadata": {"jupyter_gpumem": badge}},
                    {"id": "b", "metadata": {"jupyter_gpumem": {**badge, "version": 2}}},
                    {"metadata": {"jupyter_gpumem": badge}},
                    {"id": "d", "metadata": {}}]}
    assert lab_schema.read_badges(nb) == {"a": badge, "#2": badge}


def test_sampler_stops_on_unload(lab: Any, run: Any, shell: Any) -> None:
    ext, _ = lab
    run("import time\ntime.sleep(0.3)")
    thread = ext.lab._thread
    assert thread is not None and thread.is_alive()
    run("%unload_ext jupyter_gpumem")
    deadline = time.monotonic() + 3
    while thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not thread.is_alive()
