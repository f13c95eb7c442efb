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
from render_workload import two_device_snapshot

from jupyter_gpumem import CachingAllocator, ManualClock, SimulatedDevice
from jupyter_gpumem.data.codes import SHOWN_FRAMES
from jupyter_gpumem.data.sites import is_library_file
from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.demo import demo_allocator
from jupyter_gpumem.notebook.widget import LiveSession, MemoryWidget, stop_all_sessions
from jupyter_gpumem.render.widget_payload import (
    decode_columns,
    decode_samples,
    layout_payload,
    timeline_payload,
)

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
    assert decode_samples(frozen["data"])[:, 1].tolist() == [MiB, 2 * MiB, 3 * MiB]
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
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    session = LiveSession(Counter(), interval_s=3600)
    session.start()
    session.stop()
    assert shown == [session.widget]


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


# -- after the cell: timeline and layout --------------------------------------------------------


def test_from_snapshot_has_one_block_per_snapshot_block() -> None:
    snap = demo_allocator().snapshot()
    widget = MemoryWidget.from_snapshot(snap)
    expected = sum(len(s["blocks"]) for s in snap["segments"])
    assert widget.block_count == expected == 18
    assert widget.block_layout["n_segments"] == len(snap["segments"])
    assert widget.mode == "final"
    blocks = decode_columns(widget.block_layout["blocks"])
    states = [b["state"] for s in snap["segments"] for b in s["blocks"]]
    assert [widget.block_layout["states"][c] for c in blocks["state"]] == states
    assert len(blocks["segment"]) == expected


def test_from_snapshot_shows_the_traced_device_with_its_older_blocks() -> None:
    # Two devices, history on device 1 only: the layout is device 1's, with the block older
    # than the trace, and it adds up to the timeline (which starts from start_allocated).
    snap, old = two_device_snapshot()
    widget = MemoryWidget.from_snapshot(snap)
    segs = decode_columns(widget.block_layout["segments"])
    blocks = decode_columns(widget.block_layout["blocks"])
    device1 = sorted(s["address"] for s in snap["segments"] if s["device"] == 1)
    assert segs["device"].tolist() == [1] * len(device1)
    assert segs["address"].astype(int).tolist() == device1
    live = blocks["state"] == 0
    addrs = (segs["address"][blocks["segment"]] + blocks["offset"]).astype(int)
    assert old in addrs[live].tolist()
    cols = decode_columns(widget.timeline["columns"])
    assert int(blocks["size"][live].sum()) == int(cols["allocated"][-1]) == 6 * MiB
    start = build_timeline(snap).start_allocated
    assert start == 5 * MiB
    first = cols["allocated"][0]  # the bands stack up to the allocated bytes
    assert sum(decode_columns(widget.timeline["bands"]).values())[0] == first


def test_stop_with_snapshot_sends_layout_as_binary_buffers() -> None:
    snap = demo_allocator().snapshot()
    session = LiveSession(Counter(), interval_s=3600).start(display=False)
    session.stop(snap)
    widget = session.widget
    assert widget.mode == "final"
    assert widget.block_count == 18
    (update, buffers), = [(m, b) for m, b in comm_of(widget).updates()
                          if "block_layout" in m["state"]]
    paths = update["buffer_paths"]
    assert ["block_layout", "blocks", 2, "data"] in paths  # block sizes travel as a buffer
    assert ["timeline", "columns", 2, "data"] in paths  # so do allocated bytes
    assert all(isinstance(b, bytes | memoryview) for b in buffers)
    json.dumps(update["state"])  # and the rest is plain JSON


def test_layout_columns_match_the_segments() -> None:
    snap = demo_allocator().snapshot()
    payload = layout_payload(snap["segments"])
    segs = decode_columns(payload["segments"])
    blocks = decode_columns(payload["blocks"])
    for k, (i, off, size) in enumerate(zip(blocks["segment"], blocks["offset"], blocks["size"],
                                           strict=True)):
        seg = snap["segments"][i]
        block = [b for s in snap["segments"] for b in s["blocks"]][k]
        assert segs["address"][i] == seg["address"]
        assert seg["address"] + off == block["address"]
        assert size == block["size"]
    all_blocks = [b for s in snap["segments"] for b in s["blocks"]]
    assert len(blocks["stack"]) == len(all_blocks)
    checked = 0
    for k, sid in enumerate(blocks["stack"]):
        frames = all_blocks[k]["frames"]
        if all_blocks[k]["state"] == "inactive":
            assert sid < 0  # a free block has no stack
            continue
        checked += 1
        assert sid >= 0  # every allocated block points at its stack
        user = [[f["filename"], f["line"], f["name"]] for f in frames
                if not is_library_file(f["filename"])]
        assert user and payload["stacks"][sid] == user[:SHOWN_FRAMES]  # pytest's frames go
        assert payload["stacks"][sid][-1][2] == "test_layout_columns_match_the_segments"
    assert checked == sum(b["state"] != "inactive" for b in all_blocks) > 0


def _workload() -> CachingAllocator:
    a = CachingAllocator(SimulatedDevice(8 * GiB, clock=ManualClock(tick_ns=1_000)))
    a.record_history(True, stacks=True)
    keep = a.malloc(64 * MiB)
    tmp = [a.malloc(8 * MiB) for _ in range(4)]
    for p in tmp:
        a.free(p)
    del keep
    return a


def test_clicking_a_band_names_the_allocation_under_it() -> None:
    a = _workload()
    snap = a.snapshot()
    widget = MemoryWidget.from_snapshot(snap)
    trace = snap["device_traces"][0]
    first_alloc = next(i for i, e in enumerate(trace) if e["action"] == "alloc")
    labels = widget.timeline["band_labels"]
    band = next(g for g, label in enumerate(labels) if label != "other")
    sent = len(comm_of(widget).custom())
    browser_says(widget, {"type": "pick", "event": len(trace) - 1, "band": band, "offset": 0})
    (reply, _), = comm_of(widget).custom()[sent:]
    assert reply["type"] == "picked"
    found = reply["allocation"]
    assert found["addr"] == trace[first_alloc]["addr"]  # the 64 MiB block stacks at the bottom
    assert found["size"] == 64 * MiB
    assert found["alloc_event"] == first_alloc
    assert found["free_event"] is None
    assert found["stack"][0][:2] == [trace[first_alloc]["frames"][0]["filename"],
                                     trace[first_alloc]["frames"][0]["line"]]
    browser_says(widget, {"type": "pick", "event": 0, "band": 99, "offset": 0})
    assert comm_of(widget).custom()[-1][0] == {"type": "picked", "allocation": None}


def test_a_stack_ends_at_the_first_module_level() -> None:
    from jupyter_gpumem.render.widget_payload import _stack

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
    assert widget.timeline["n_events"] == 0
    assert widget.block_count == sum(len(s["blocks"]) for s in a.snapshot()["segments"])
    del ptrs


# -- large traces -------------------------------------------------------------------------------


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


def test_a_large_trace_goes_as_small_binary_columns_that_keep_the_peak() -> None:
    snap = synthetic_trace(100_000)  # 200,001 events
    payload, _ = timeline_payload(snap, max_points=2000)  # type: ignore[arg-type]
    assert payload["n_events"] == 200_001
    m = payload["n_points"]
    assert 0 < m <= 2 * 2000 + 4
    cols = decode_columns(payload["columns"])
    assert set(cols) == {"index", "time_s", "allocated", "reserved"}
    assert all(len(c) == m for c in cols.values())
    assert cols["allocated"].max() == 512 * MiB  # the one-event spike survives downsampling
    assert payload["peak"]["allocated"] == 512 * MiB
    assert payload["peak"]["index"] == 2 * (100_000 // 2) + 1
    assert (np.diff(cols["index"]) > 0).all()
    for col in payload["columns"] + payload["bands"]:
        assert isinstance(col["data"], bytes)
        assert len(col["data"]) == 8 * m
    without_buffers = json.dumps({k: v for k, v in payload.items()
                                  if k not in ("columns", "bands")})
    assert len(without_buffers) < 4096  # the JSON part stays small


def test_a_large_trace_reaches_the_comm_as_buffers() -> None:
    widget = MemoryWidget.from_snapshot(synthetic_trace(50_000))  # type: ignore[arg-type]
    (update, buffers), = [(m, b) for m, b in comm_of(widget).updates()
                          if "timeline" in m["state"]]
    total = sum(len(b) for b in buffers)
    assert total < 1 << 20  # a 100k-event trace moves well under a MiB
    assert len(json.dumps(update["state"])) < 8192


def test_after_a_traced_cell_the_widget_names_sites_by_cell() -> None:
    # The widget that replaces the live view after %%gpumem_trace names sites the way the tables
    # do: "cell [N] line L" for a notebook cell's file, its file name otherwise.
    snap = demo_allocator().snapshot()
    files = {f["filename"] for t in snap["device_traces"] for e in t for f in e["frames"]}
    named = {name: 7 + i for i, name in enumerate(sorted(files))}
    plain = MemoryWidget.from_snapshot(snap).timeline["band_labels"]
    by_cell = MemoryWidget.from_snapshot(snap, cell_files=named).timeline["band_labels"]
    assert not any(label.startswith("cell [") for label in plain)
    assert len(by_cell) == len(plain) and by_cell[-1] == plain[-1] == "other"
    assert all(label.startswith("cell [") for label in by_cell[:-1]), by_cell
