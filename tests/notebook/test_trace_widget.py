"""A long trace's view asks its kernel: window and layout questions answered on the widget's comm
(a recording comm, no browser), and a traced cell showing its long trace as such a widget."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from layout_workload import blocks_at, random_snapshot, replayed
from test_widget import RecordingComm, browser_says, comm_of, recording_comm  # noqa: F401

from jupyter_gpumem.notebook import trace_view
from jupyter_gpumem.notebook.widget import MemoryWidget
from jupyter_gpumem.render.payload_columns import decode_column
from jupyter_gpumem.render.view_payload import build_view

pytest.importorskip("anywidget")


def joined(content: dict[str, Any], buffers: list[Any]) -> Any:
    """A message with its buffers put back into its columns (what the browser's
    ``joinBuffers`` does)."""
    if isinstance(content, dict):
        if set(content) == {"dtype", "buffer"}:
            return {"dtype": content["dtype"], "data": bytes(buffers[content["buffer"]])}
        return {k: joined(v, buffers) for k, v in content.items()}
    if isinstance(content, list):
        return [joined(v, buffers) for v in content]
    return content


def answers(widget: MemoryWidget) -> list[dict[str, Any]]:
    return [joined(c, b) for c, b in comm_of(widget).custom() if c.get("type") != "samples"]


@pytest.fixture
def long_widget() -> MemoryWidget:
    snap = random_snapshot(3, steps=1500)
    widget = MemoryWidget.from_snapshot(snap)
    widget._test_snapshot = snap  # type: ignore[attr-defined]
    return widget


def test_a_zoom_gets_the_window_at_full_detail(long_widget: MemoryWidget) -> None:
    widget = long_widget
    assert widget.detail  # the browser learns that it may ask
    n = widget.view["n_events"]
    assert widget.view["timeline"]["per_column"] > 1  # the saved view is coarse
    browser_says(widget, {"type": "window", "id": 7, "i0": 100, "i1": 400, "columns": 1000})
    (answer,) = answers(widget)
    assert answer["type"] == "window" and answer["id"] == 7
    t = answer["timeline"]
    assert t["window"] == [100, 400] and t["per_column"] == 1  # every event: exact
    expected = widget._detail.timeline.allocated[100:400]  # type: ignore[union-attr]
    assert np.array_equal(decode_column(t["allocated"]), expected)
    assert np.array_equal(decode_column(t["index"]), np.arange(100, 400))
    snap = widget._test_snapshot  # type: ignore[attr-defined]
    for k in (100, 250, 399):  # the lives in the window give its layouts
        assert blocks_at(answer["lives"], k) == replayed(snap, k)[0]
    assert n > 2000


def test_the_slider_gets_the_layout_at_any_event(long_widget: MemoryWidget) -> None:
    widget = long_widget
    snap = widget._test_snapshot  # type: ignore[attr-defined]
    checkpoints = set(widget.view["lives"]["checkpoints"] or [])
    k = next(k for k in range(1000, 2000) if k not in checkpoints)
    browser_says(widget, {"type": "layout", "id": "a", "k": k})
    (answer,) = answers(widget)
    assert answer["type"] == "layout" and answer["id"] == "a"
    assert answer["lives"]["exact"] == [k, k + 1]
    assert blocks_at(answer["lives"], k) == replayed(snap, k)[0]


def test_a_question_it_cannot_answer_gets_an_error(long_widget: MemoryWidget) -> None:
    widget = long_widget
    n = widget.view["n_events"]
    browser_says(widget, {"type": "window", "id": 1, "i0": 0, "i1": n + 5, "columns": 10})
    browser_says(widget, {"type": "layout", "id": 2, "k": "x"})
    first, second = answers(widget)
    assert (first["type"], first["id"]) == ("error", 1) and "window" in first["message"]
    assert (second["type"], second["id"]) == ("error", 2) and "k must be" in second["message"]
    plain = MemoryWidget()  # a view shown without its detail: nothing to answer from
    plain.show_view(build_view(random_snapshot(1), binary=True))
    assert not plain.detail
    browser_says(plain, {"type": "layout", "id": 3, "k": 0})
    (third,) = answers(plain)
    assert third["type"] == "error" and "no longer keeps" in third["message"]


def test_a_closed_widget_lets_go_of_the_detail(long_widget: MemoryWidget) -> None:
    long_widget.close()
    assert long_widget._detail is None


LONG_CELL = ("%%gpumem_trace\na = g.get_allocator()\nfor _ in range({n}):\n"
             "    a.free(a.malloc(MiB))")


def test_a_traced_cell_shows_a_long_trace_as_a_widget_that_answers(gm, run) -> None:
    result, _ = run(LONG_CELL.format(n=1000))  # 3 events a pair: 3,000 events
    assert result.success
    (linked,) = trace_view._OPEN
    widget, _handle = linked
    assert widget.detail and widget.result.coarse
    bundle = widget._repr_mimebundle_()[0]
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert {"text/plain", "text/html", "application/vnd.jupyter-gpumem.trace+json"} <= set(bundle)
    assert bundle["text/plain"] == widget.result.text()
    result, _ = run(LONG_CELL.format(n=10))  # short: the bundle alone, no widget
    assert result.success and len(trace_view._OPEN) == 1
    trace_view.close_trace_views()
    assert widget.comm is None and widget._detail is None


def test_only_the_last_trace_views_stay_linked(gm, run, monkeypatch) -> None:
    monkeypatch.setattr(trace_view, "OPEN_TRACE_VIEWS", 2)
    updates: list[dict[str, Any]] = []

    class Handle:
        def update(self, obj: Any, raw: bool = False) -> None:
            updates.append(obj)

    import IPython.display

    shown = IPython.display.display
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, **kw: (shown(obj), Handle())[1] if kw else shown(obj))
    widgets = []
    for _ in range(3):
        assert run(LONG_CELL.format(n=800))[0].success
        widgets.append(trace_view._OPEN[-1][0])
    assert [w for w, _ in trace_view._OPEN] == widgets[1:]
    first = widgets[0]
    assert first.comm is None and first._detail is None  # closed, its detail let go
    (bundle,) = updates  # its output became its saved bundle
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert bundle["text/plain"] == first.result.text()
    assert isinstance(comm_of(widgets[2]), RecordingComm)
    trace_view.close_trace_views()


def test_save_keeps_every_event_and_the_views_name_the_file(gm, run, tmp_path) -> None:
    from jupyter_gpumem.data.files import load_snapshot
    from jupyter_gpumem.data.trace_file import MAGIC

    path = tmp_path / "run.gpumem"
    cell = LONG_CELL.format(n=1000).replace("%%gpumem_trace", f"%%gpumem_trace --save {path}")
    assert run(cell)[0].success
    ((widget, _),) = trace_view._OPEN
    traced = widget.result
    assert traced.full_trace == str(path)
    assert traced.to_json()["full_trace"] == str(path)  # the saved view names the file
    assert path.read_bytes().startswith(MAGIC)  # our columnar file
    saved = load_snapshot(path)["device_traces"][0]
    assert len(saved) == traced.events == 3001  # every event, not the view's columns
    trace_view.close_trace_views()
    result, _ = run(f"%gpumem load {path}")  # shown: linked to this kernel
    assert result.success
    ((linked, _),) = trace_view._OPEN
    view = linked.result
    assert view.full_trace == str(path) and view.coarse and view.events == 3001
    assert linked.detail and result.result is view
    trace_view.close_trace_views()
