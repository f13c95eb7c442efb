"""The live widget without a browser: traits and messages through a recording comm, the sampler
thread's lifecycle, and the binary payloads."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import comm as comm_package
import numpy as np
import pytest
from bundle_checks import check_bundle
from render_workload import two_device_snapshot

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.data.codes import SHOWN_FRAMES
from jupyter_gpumem.data.sites import is_library_file
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.demo import demo_allocator
from jupyter_gpumem.notebook.widget import (
    MIN_PLOTTED,
    LiveSession,
    MemoryWidget,
    stop_all_sessions,
)
from jupyter_gpumem.render.view_payload import decode_column, encode


def decode_samples(data: Any) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype="<f8").reshape(-1, 4)

MiB = 1 << 20
GiB = 1 << 30
SAMPLER = "jupyter_gpumem-sampler"


class RecordingComm:
    """Stands in for the kernel's comm: records what the widget sends, as ipywidgets' tests do."""

    kernel = "Truthy"

    def __init__(self, **kwargs: Any) -> None:
        RecordingComm.count += 1
        self.comm_id = f"comm-{RecordingComm.count}"
        self.opened_with = kwargs
        self.messages: list[tuple[dict[str, Any], list[Any]]] = []
        self.close_callbacks: list[Any] = []
        self.closed = False

    count = 0

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.messages.append((data, list(buffers or [])))

    def on_msg(self, callback: Any) -> None:
        self.msg_callback = callback

    def on_close(self, callback: Any) -> None:
        self.close_callbacks.append(callback)

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.closed = True

    def frontend_closes(self) -> None:
        """What the kernel does when the browser closes the comm."""
        for cb in self.close_callbacks:
            cb({"content": {"comm_id": self.comm_id}})

    def custom(self) -> list[tuple[dict[str, Any], list[Any]]]:
        return [(m["content"], b) for m, b in self.messages if m.get("method") == "custom"]

    def updates(self) -> list[tuple[dict[str, Any], list[Any]]]:
        return [(m, b) for m, b in self.messages if m.get("method") == "update"]


@pytest.fixture(autouse=True)
def recording_comm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm_package, "create_comm", lambda **kw: RecordingComm(**kw))


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield
    leaked = [t.name for t in threading.enumerate() if t.name == SAMPLER]
    stop_all_sessions()
    assert leaked == [], "a test left a sampler thread running"


def browser_says(widget: MemoryWidget, content: dict[str, Any]) -> None:
    """Deliver a custom message from the browser to the widget."""
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}},
                        "buffers": []})


class Counter:
    """A sample_fn with known values: allocated = k MiB, reserved = 2k MiB, on call k."""

    def __init__(self, *, device: bool = True, stop_after: int | None = None,
                 fail_at: int | None = None) -> None:
        self.calls = 0
        self.device = device
        self.reached = threading.Event()
        self.stop_after = stop_after
        self.fail_at = fail_at

    def __call__(self) -> tuple[int, int, int | None]:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("sampler source went away")
        if self.stop_after is not None and self.calls >= self.stop_after:
            self.reached.set()
        k = self.calls
        return k * MiB, 2 * k * MiB, (3 * k * MiB if self.device else None)


def comm_of(widget: MemoryWidget) -> RecordingComm:
    assert isinstance(widget.comm, RecordingComm)
    return widget.comm


# -- live messages ------------------------------------------------------------------------------


def test_each_live_message_carries_only_the_new_sample() -> None:
    clock = iter(float(i) for i in range(1000))
    session = LiveSession(Counter(), interval_s=3600, clock=lambda: next(clock))
    session.start(display=False)  # takes sample 0, then the thread waits an hour
    for _ in range(49):
        session.sample()
    session.stop()
    custom = comm_of(session.widget).custom()
    samples = [(c, b) for c, b in custom if c["type"] == "samples"]
    assert len(samples) == 51  # the first, 49 by hand, one at stop
    for k, (content, buffers) in enumerate(samples):
        assert content == {"type": "samples", "first": k, "n": 1}
        assert len(buffers) == 1
        assert len(buffers[0]) == 4 * 8  # one row of four float64, however long the series
        t, allocated, reserved, device_used = decode_samples(buffers[0])[0]
        assert (allocated, reserved, device_used) == ((k + 1) * MiB, 2 * (k + 1) * MiB,
                                                      3 * (k + 1) * MiB)
        assert t == k + 1  # seconds since start (clock 0), from the injected clock


def test_device_used_none_is_sent_as_nan() -> None:
    session = LiveSession(Counter(device=False), interval_s=3600)
    session.start(display=False)
    session.stop()
    (_, buffers), *_ = comm_of(session.widget).custom()
    assert np.isnan(decode_samples(buffers[0])[0, 3])


def test_stop_freezes_the_series_into_the_samples_trait_once() -> None:
    session = LiveSession(Counter(), interval_s=3600)
    session.start(display=False)
    session.sample()
    session.stop()
    session.stop()  # a second stop changes nothing
    frozen = session.widget.samples
    assert frozen["n"] == 3
    assert decode_column(frozen["data"]).reshape(-1, 4)[:, 1].tolist() == [MiB, 2 * MiB,
                                                                             3 * MiB]
    updates = [m for m, _ in comm_of(session.widget).updates() if "samples" in m["state"]]
    assert len(updates) == 1


def test_a_late_view_catches_up_from_what_it_has() -> None:
    session = LiveSession(Counter(), interval_s=3600)
    session.start(display=False)
    for _ in range(4):
        session.sample()
    widget = session.widget
    sent = len(comm_of(widget).custom())
    browser_says(widget, {"type": "ready", "have": 2})
    (content, buffers), = comm_of(widget).custom()[sent:]
    assert content == {"type": "samples", "first": 2, "n": 3}
    assert decode_samples(buffers[0])[:, 1].tolist() == [3 * MiB, 4 * MiB, 5 * MiB]
    browser_says(widget, {"type": "ready", "have": 5})  # up to date: nothing to send
    assert len(comm_of(widget).custom()) == sent + 1
    session.stop()


# -- the sampler thread -------------------------------------------------------------------------


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER]


def test_sampler_runs_until_stop_and_leaves_no_thread() -> None:
    source = Counter(stop_after=5)
    session = LiveSession(source, interval_s=0.001)
    session.start(display=False)
    assert session.running
    assert len(sampler_threads()) == 1
    assert source.reached.wait(30), "the sampler never took five samples"
    session.stop()
    assert not session.running
    assert sampler_threads() == []
    calls = source.calls
    assert session.widget.n_samples == calls
    threading.Event().wait(0.02)
    assert source.calls == calls  # nothing samples after stop


def test_context_manager_starts_and_stops() -> None:
    source = Counter(stop_after=3)
    with LiveSession(source, interval_s=0.001) as session:
        assert source.reached.wait(30)
        assert session.running
    assert not session.running
    assert sampler_threads() == []


def test_start_displays_the_widget(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    shown: list[Any] = []
    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            updates.append((obj, kwargs))

    def display(obj: Any, display_id: bool = False) -> Handle:
        shown.append(obj)
        assert display_id
        # nothing sent yet (Note [Samples in order]), but the fallback a notebook saved now
        # keeps has the numbers of a reading taken just before
        assert obj.sample_count() == 0
        assert obj._repr_mimebundle_()[0]["text/plain"].startswith("gpumem live view: 1 sample ")
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    session = LiveSession(Counter(), interval_s=3600)
    session.start()
    session.stop()
    session.stop()  # once only
    assert shown == [session.widget]
    # stopped: the output becomes the static bundle, with no widget view in it
    ((bundle, kwargs),) = updates
    assert kwargs == {"raw": True}
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    payload = check_bundle(bundle, kind="live")
    assert payload["samples"]["n"] == 2
    assert bundle["text/plain"].startswith("gpumem live view: 2 samples over ")


def test_closing_the_widget_stops_the_sampler() -> None:
    source = Counter(stop_after=2)
    session = LiveSession(source, interval_s=0.001)
    session.start(display=False)
    assert source.reached.wait(30)
    session.widget.close()
    assert not session.running
    assert sampler_threads() == []


def test_the_browser_closing_the_comm_stops_the_sampler() -> None:
    source = Counter(stop_after=2)
    session = LiveSession(source, interval_s=0.001)
    session.start(display=False)
    assert source.reached.wait(30)
    comm_of(session.widget).frontend_closes()
    assert not session.running
    assert sampler_threads() == []
    session.stop()  # still fine afterwards


def test_stop_all_sessions_stops_every_running_sampler() -> None:
    sessions = [LiveSession(Counter(), interval_s=0.001).start(display=False) for _ in range(3)]
    assert len(sampler_threads()) == 3
    assert stop_all_sessions() == 3
    assert sampler_threads() == []
    assert not any(s.running for s in sessions)
    assert stop_all_sessions() == 0


def test_a_failing_sample_fn_ends_sampling_and_keeps_the_error() -> None:
    session = LiveSession(Counter(fail_at=3), interval_s=0.001)
    session.start(display=False)
    assert session._thread is not None
    session._thread.join(30)
    assert not session.running
    assert isinstance(session.error, RuntimeError)
    session.stop()
    assert session.widget.n_samples == 2


def test_bad_interval_and_double_start_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        LiveSession(Counter(), interval_s=0)
    session = LiveSession(Counter(), interval_s=3600).start(display=False)
    with pytest.raises(RuntimeError, match="already started"):
        session.start(display=False)
    session.stop()


# -- after the cell: the view payload ----------------------------------------------------------


def _lives(widget: MemoryWidget) -> dict[str, np.ndarray]:
    return {k: decode_column(c) for k, c in widget.view["lives"]["blocks"].items()}


def test_from_snapshot_counts_the_allocated_blocks_at_the_end() -> None:
    snap = demo_allocator().snapshot()
    widget = MemoryWidget.from_snapshot(snap)
    allocated = [b for s in snap["segments"] for b in s["blocks"]
                 if b["state"] == "active_allocated"]
    assert widget.block_count == len(allocated) > 0
    assert widget.mode == "final" and widget.view["schema"] == 2
    lives = _lives(widget)
    at_end = lives["end"] >= widget.view["n_events"]
    assert sorted(lives["addr"][at_end].astype(int).tolist()) == sorted(
        b["address"] for b in allocated)


def test_from_snapshot_shows_the_traced_device_with_its_older_blocks() -> None:
    # Two devices, history on device 1 only: the layout is device 1's, with the block older
    # than the trace, and it adds up to the timeline (which starts from start_allocated).
    snap, old = two_device_snapshot()
    widget = MemoryWidget.from_snapshot(snap)
    view = widget.view
    assert view["device"] == 1
    segs = view["lives"]["segments"]
    device1 = sorted(s["address"] for s in snap["segments"] if s["device"] == 1)
    assert sorted(decode_column(segs["addr"]).astype(int).tolist()) == device1
    lives = _lives(widget)
    live = lives["end"] >= view["n_events"]
    assert old in lives["addr"][live].astype(int).tolist()
    allocated = decode_column(view["timeline"]["allocated"])
    assert int(lives["size"][live].sum()) == int(allocated[-1]) == 6 * MiB
    assert build_timeline(snap).start_allocated == view["start_allocated"] == 5 * MiB
    bands = sum(decode_column(c) for c in view["timeline"]["bands"])
    assert bands[0] == allocated[0]  # the bands stack up to the allocated bytes


def test_stop_with_snapshot_sends_the_view_as_binary_buffers() -> None:
    snap = demo_allocator().snapshot()
    session = LiveSession(Counter(), interval_s=3600).start(display=False)
    session.stop(snap)
    widget = session.widget
    assert widget.mode == "final" and widget.block_count > 0
    (update, buffers), = [(m, b) for m, b in comm_of(widget).updates() if "view" in m["state"]]
    paths = update["buffer_paths"]
    assert ["view", "lives", "blocks", "size", "data"] in paths  # block sizes go as a buffer
    assert ["view", "timeline", "allocated", "data"] in paths  # so do allocated bytes
    assert all(isinstance(b, bytes | memoryview) for b in buffers)
    json.dumps(update["state"])  # and the rest is plain JSON
    # its bundle: the widget view beside the static fallback of what it shows
    data, _ = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    static = {k: v for k, v in data.items() if k != "application/vnd.jupyter.widget-view+json"}
    payload = check_bundle(static, kind="trace")
    assert payload == encode(widget.view, "base64")
    assert "object at 0x" not in repr(data["text/plain"])
    assert " samples over " in data["text/plain"] and "a trace of " in data["text/plain"]


def test_the_view_stacks_are_the_users_frames() -> None:
    snap = demo_allocator().snapshot()
    widget = MemoryWidget.from_snapshot(snap)
    lives = _lives(widget)
    stacks = widget.view["stacks"]
    assert (lives["stack"] >= 0).any()
    for sid in lives["stack"][lives["stack"] >= 0]:
        assert stacks[sid] and len(stacks[sid]) <= SHOWN_FRAMES
        assert not any(is_library_file(f[0]) for f in stacks[sid])


def test_a_stack_ends_at_the_first_module_level() -> None:
    from jupyter_gpumem.render.view_detail import view_stack as _stack

    frames: list[Any] = [
        {"filename": "/x/site-packages/cupy/_creation.py", "line": 1, "name": "empty"},
        {"filename": "cell.py", "line": 3, "name": "run"},
        {"filename": "cell.py", "line": 9, "name": "<module>"},
        {"filename": "/usr/lib/python3.11/asyncio/events.py", "line": 80, "name": "_run"},
    ]
    assert _stack(frames) == [["cell.py", 3, "run"], ["cell.py", 9, "<module>"]]


def test_a_snapshot_without_history_has_an_empty_timeline_and_its_blocks() -> None:
    a = CachingAllocator(SimulatedDevice(8 * GiB))
    ptrs = [a.malloc(MiB), a.malloc(3 * MiB)]
    widget = MemoryWidget.from_snapshot(a.snapshot())
    assert widget.view["n_events"] == 0
    assert widget.block_count == 2
    del ptrs


# -- large traces and long sessions: what the widget stores is bounded ------------------------


def synthetic_trace(n_pairs: int) -> dict[str, Any]:
    """A trace of alloc/free pairs in one 1 GiB segment, with one tall spike in the middle."""
    base = 0x7F0000000000
    trace: list[dict[str, Any]] = [{"action": "segment_alloc", "addr": base, "size": GiB,
                                    "stream": 0, "time_us": 0, "frames": []}]
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    for i in range(n_pairs):
        size = (512 * MiB if i == n_pairs // 2 else (1 + i % 5) * MiB)
        for action in ("alloc", "free_requested"):
            trace.append({"action": action, "addr": base, "size": size, "stream": 0,
                          "time_us": len(trace), "frames": frames, "block_size": size})
    segments = [{"device": 0, "address": base, "total_size": GiB, "allocated_size": 0,
                 "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
                 "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                 "blocks": [{"address": base, "size": GiB, "requested_size": 0,
                             "state": "inactive", "frames": []}]}]
    return {"segments": segments, "device_traces": [trace]}


def test_a_large_trace_reaches_the_comm_as_bounded_buffers() -> None:
    widget = MemoryWidget.from_snapshot(synthetic_trace(50_000),  # type: ignore[arg-type]
                                        max_points=2000)
    view = widget.view
    assert view["n_events"] == 100_001
    assert len(decode_column(view["timeline"]["index"])) <= 2000
    assert decode_column(view["timeline"]["allocated"]).max() == 512 * MiB  # spike kept
    assert view["lives"]["checkpoints"] is not None  # 50k lives > max_lives: cut
    assert len(decode_column(view["lives"]["blocks"]["start"])) <= 20_000
    (update, buffers), = [(m, b) for m, b in comm_of(widget).updates() if "view" in m["state"]]
    assert sum(len(b) for b in buffers) < 2 << 20
    assert len(json.dumps(update["state"])) < 9 * 1024  # ~1000 checkpoints, column headers


def test_long_sessions_store_at_most_max_points_samples() -> None:
    session = LiveSession(Counter(), interval_s=3600, widget=MemoryWidget(max_points=50))
    session.start(display=False)
    for _ in range(500):
        session.sample()
    session.stop()
    frozen = session.widget.samples
    assert frozen["n"] <= 50 and session.widget.n_samples == 502
    rows = decode_column(frozen["data"]).reshape(-1, 4)
    assert rows[:, 1].max() == 502 * MiB  # the last, highest sample survives
    static = session.widget.static_bundle()
    assert check_bundle(static, kind="live")["samples"]["n"] <= 50


def test_after_a_traced_cell_the_widget_names_sites_by_cell() -> None:
    # The widget names sites the way the tables do: "cell [N] line L" for a notebook cell's
    # file, its file name otherwise.
    snap = demo_allocator().snapshot()
    files = {f["filename"] for t in snap["device_traces"] for e in t for f in e["frames"]}
    named = {name: 7 + i for i, name in enumerate(sorted(files))}
    plain = MemoryWidget.from_snapshot(snap).view["timeline"]["band_labels"]
    by_cell = MemoryWidget.from_snapshot(snap, cell_files=named).view["timeline"]["band_labels"]
    assert not any(label.startswith("cell [") for label in plain)
    assert len(by_cell) == len(plain) and by_cell[-1] == plain[-1] == "other"
    assert all(label.startswith("cell [") for label in by_cell[:-1]), by_cell


def test_refresh_reshows_a_running_widget_at_most_every_so_often(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            updates.append(obj)

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    now = [100.0]
    session = LiveSession(Counter(), interval_s=3600, clock=lambda: now[0])
    session.start()
    assert not session.refresh(every_s=10)  # just shown
    now[0] += 11
    assert session.refresh(every_s=10)
    assert updates == [session.widget]  # the widget again: its view and its fresh fallback
    assert not session.refresh(every_s=10)
    session.stop()
    now[0] += 60
    assert not session.refresh(every_s=10)  # stopped: its output is static now
    assert len(updates) == 2 and isinstance(updates[1], dict)


@pytest.mark.parametrize("taken", [1, MIN_PLOTTED])
def test_a_quick_traced_cells_curve_becomes_a_line(monkeypatch: pytest.MonkeyPatch,
                                                   taken: int) -> None:
    import IPython.display

    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            updates.append(obj)

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    session = LiveSession(Counter(), interval_s=3600)
    session.start()  # one sample
    for _ in range(taken - 2):
        session.sample()
    session.stop(traced=True)  # and one at the end
    (bundle,) = updates
    assert session.widget.sample_count() == max(taken, 2)
    if taken < MIN_PLOTTED:  # nothing over time the trace below does not show: one line
        assert set(bundle) == {"text/plain", "text/html"}
        assert bundle["text/plain"].startswith("gpumem live view: 2 samples over ")
        assert bundle["text/plain"].endswith("(too quick to plot over time: the trace below "
                                             "has every event)")
    else:  # a curve worth keeping: the static bundle with its picture and payload
        assert check_bundle(bundle, kind="live")["samples"]["n"] == MIN_PLOTTED


# -- a finished view lets go of its widget (Note [A finished view lets go]) ---------------------


def open_widgets() -> dict[str, Any]:
    """ipywidgets' registry of open widgets (``Widget.widgets``, deprecated, reads it too)."""
    from ipywidgets.widgets import widget as ipywidget

    return ipywidget._instances


def test_a_stopped_session_closes_the_widget_it_showed(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            assert session.widget.comm is not None  # the output is static before it closes
            updates.append(obj)

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    session = LiveSession(Counter(), interval_s=3600)
    widget, layout = session.widget, session.widget.layout
    ids = {widget.model_id, layout.model_id}
    session.start()
    comm = comm_of(widget)
    assert ids <= set(open_widgets())
    session.stop()
    assert not ids & set(open_widgets())  # the widget and its layout: closed, and let go
    assert comm.closed and widget.comm is None and layout.comm is None
    (bundle,) = updates
    assert check_bundle(bundle, kind="live")["samples"]["n"] == 2  # what the output keeps
    # the object reads as before; shown again it is its static bundle, with no widget view
    assert widget.samples["n"] == 2 and widget.static_bundle()["text/plain"] == bundle[
        "text/plain"]
    data, _ = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" not in data
    assert check_bundle(data, kind="live")["samples"]["n"] == 2


def test_a_widget_that_is_the_callers_stays_open(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None: ...

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    mine = MemoryWidget()
    handed_in = LiveSession(Counter(), interval_s=3600, widget=mine).start()
    not_shown = LiveSession(Counter(), interval_s=3600).start(display=False)
    handed_in.stop()
    not_shown.stop()
    for widget in (mine, not_shown.widget):
        assert widget.comm is not None and widget.model_id in open_widgets()
        assert "application/vnd.jupyter.widget-view+json" in widget._repr_mimebundle_()[0]
        widget.close()
    assert mine.comm is None and mine.layout.comm is None


def test_100_traced_cells_leave_no_widget_alive(shell, run, sim, monkeypatch) -> None:
    """Each %%gpumem_trace shows a live widget (and its layout, a widget too): 100 traced cells
    left 200 open widgets and ~23 KB a cell alive. Now: none, and a few KB a cell (IPython's
    own history of the cell, and the ledger's row until it is folded)."""
    import gc
    import tracemalloc
    import weakref

    from jupyter_gpumem.notebook.extension import get_extension

    monkeypatch.setattr(MemoryWidget, "_picture", lambda self: None)  # no PNG: quicker cells
    started: weakref.WeakSet[LiveSession] = weakref.WeakSet()
    made = [0]
    start = LiveSession.start

    def counted_start(self: LiveSession, **kwargs: Any) -> LiveSession:
        started.add(self)
        made[0] += 1
        return start(self, **kwargs)

    monkeypatch.setattr(LiveSession, "start", counted_start)
    run("%load_ext jupyter_gpumem")
    ext = get_extension(shell)
    assert ext is not None and ext.settings.live_view
    cell = "%%gpumem_trace --no-plot\nx = [1] * 1000\n"
    result, out = run(cell)
    assert result.success
    updated = [o.data["text/plain"] for o in out.outputs if o.data.get("text/plain", "")
               .startswith("gpumem live view")]
    assert updated and updated[-1].endswith("(too quick to plot over time: the trace below "
                                            "has every event)")  # the live output, replaced
    gc.collect()
    before = set(open_widgets())
    tracemalloc.start()
    try:
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            run(cell)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - traced
    finally:
        tracemalloc.stop()
    assert made[0] == 101  # one live view a traced cell
    assert set(open_widgets()) - before == set()
    assert len(started) == 0  # the sessions went too
    assert grown / 100 < 8 * 1024, f"{grown / 100 / 1024:.1f} KB a traced cell"


def test_a_trace_whose_analysis_fails_still_closes_its_live_view(
        sim, monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    from jupyter_gpumem.notebook import trace as tracing

    updates: list[Any] = []

    class Handle:
        def update(self, obj: Any, **kwargs: Any) -> None:
            updates.append(obj)

    def analysis_fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("analysis failed")

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    monkeypatch.setattr(tracing, "analyze", analysis_fails)
    before = set(open_widgets())
    with pytest.raises(RuntimeError, match="analysis failed"), tracing.trace(live=True,
                                                                             namespace={}):
        sim.free(sim.malloc(4096))
    assert sampler_threads() == []  # the sampler stopped with the block
    assert set(open_widgets()) - before == set()
    assert len(updates) == 1 and updates[0]["text/plain"].startswith("gpumem live view")


def test_a_sample_fn_that_hangs_does_not_hang_stop() -> None:
    entered, release = threading.Event(), threading.Event()
    calls = []

    def hangs() -> tuple[int, int, None]:
        calls.append(1)
        if len(calls) == 2:  # the first is start's reading at time 0, the second the sampler's
            entered.set()
            release.wait(60)
        return 1, 2, None

    session = LiveSession(hangs, interval_s=0.001)
    session.start(display=False)
    assert entered.wait(30), "the sampler never sampled"
    done = threading.Event()
    stopper = threading.Thread(target=lambda: (session.stop(), done.set()), daemon=True)
    stopper.start()
    try:
        assert done.wait(30), "stop waited for a sample_fn that hangs"
        assert session.stuck
        assert len(calls) == 2  # no final sample from a sampler that is stuck
    finally:
        release.set()
        for thread in sampler_threads():
            thread.join(30)
    assert sampler_threads() == [] and not session.running
    assert len(calls) == 2  # and none after it let go
