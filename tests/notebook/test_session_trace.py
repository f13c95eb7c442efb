"""``%gpumem plot`` after ``%%gpumem_trace`` cells: the session's timeline has their events."""

from __future__ import annotations

import pytest
from bundle_checks import check_bundle

from jupyter_gpumem.data.timeline import build_timeline
from jupyter_gpumem.notebook.extension import get_extension
from jupyter_gpumem.notebook.session_trace import session_timeline
from jupyter_gpumem.sources.cupy import CupySource

MiB = 1 << 20


@pytest.fixture
def gm(shell, run, sim):
    result, _ = run("%load_ext jupyter_gpumem")  # history "state": no events of its own
    assert result.success
    get_extension(shell).settings.live_view = False
    run("import jupyter_gpumem as g\nMiB = 1 << 20")  # cell 2
    return shell


def traced(run, body: str) -> None:
    result, _ = run("%%gpumem_trace --no-plot\n" + body)
    assert result.success


def free(run, *names: str) -> None:
    for name in names:
        assert run(f"g.caching_allocator_delete({name})")[0].success


def test_plot_after_two_traced_cells_shows_both(gm, run, sim) -> None:
    traced(run, "a = g.caching_allocator_alloc(5 * MiB)")  # cell 3
    traced(run, "b = g.caching_allocator_alloc(7 * MiB)\ng.caching_allocator_delete(a)")  # 4
    _, out = run("%gpumem plot")
    assert "no event history" not in out.stdout
    shown = out.outputs[0].data
    check_bundle(shown)
    assert shown["text/plain"] == (
        "timeline of 5 events: traced cells [3], [4] (history is state: other cells record no "
        "events; %gpumem history on records every cell)")
    snap, _ = session_timeline(CupySource(sim))
    trace = snap["device_traces"][0]
    assert [(e["action"], e["cell"]) for e in trace] == [
        ("segment_alloc", 3), ("alloc", 3), ("alloc", 4), ("free_requested", 4),
        ("free_completed", 4)]
    assert build_timeline(snap).allocated.tolist() == [0, 5 * MiB, 12 * MiB, 7 * MiB, 7 * MiB]
    assert sim.history.max_entries == 0  # the session's history mode is left alone
    free(run, "b")


def test_a_gap_that_changed_memory_is_said_not_drawn_wrong(gm, run, sim) -> None:
    traced(run, "a = g.caching_allocator_alloc(5 * MiB)")  # cell 3
    run("c = g.caching_allocator_alloc(3 * MiB)")  # cell 4: not traced, records no event
    traced(run, "b = g.caching_allocator_alloc(7 * MiB)")  # cell 5
    _, out = run("%gpumem plot")
    text = out.outputs[0].data["text/plain"]
    assert text.startswith("timeline of 1 event: traced cells [5] ")
    assert text.endswith("; traced cells [3] are left out: memory changed after them in cells "
                         "that recorded no events")
    snap, _ = session_timeline(CupySource(sim))
    assert build_timeline(snap).allocated.tolist() == [15 * MiB]  # a, c and b: right
    free(run, "a", "b", "c")


def test_traced_cells_then_the_sessions_own_history(gm, run, sim) -> None:
    traced(run, "a = g.caching_allocator_alloc(5 * MiB)")  # cell 3
    run("%gpumem history on")  # cell 4
    run("b = g.caching_allocator_alloc(7 * MiB)")  # cell 5
    snap, text = session_timeline(CupySource(sim))
    assert text == "timeline of 3 events: traced cells [3] then the session's history"
    assert [e["cell"] for e in snap["device_traces"][0]] == [3, 3, 5]
    assert build_timeline(snap).allocated.tolist() == [0, 5 * MiB, 12 * MiB]
    free(run, "a", "b")


def test_nothing_recorded_says_why(gm, run, sim) -> None:
    _, out = run("%gpumem plot")
    assert out.stdout.startswith("gpumem: no event history is recorded (history is state), "
                                 "and no %%gpumem_trace cell has recorded any")


def test_kept_events_are_bounded_oldest_first(sim, monkeypatch) -> None:
    import jupyter_gpumem as g
    from jupyter_gpumem.notebook import session_trace

    monkeypatch.setattr(session_trace, "MAX_KEPT_EVENTS", 3)
    ptrs = []
    for cell in (1, 2, 3):
        with g.trace(cell=cell, plot=False):
            ptrs.append(g.caching_allocator_alloc(MiB))  # 2 events in cell 1, 1 after
    assert session_trace.kept_cells(CupySource(sim)) == [2, 3]
    for p in ptrs:
        g.caching_allocator_delete(p)


def test_older_recordings_keep_only_what_the_timeline_reads_of_them(sim) -> None:
    """Each traced block's snapshot field carries the allocator's whole stats (~140 counters,
    ~10 KB): kept with every recording, they grew the session by that much a traced cell. The
    stitched timeline reads the newest recording's field, and of the older ones their
    empty_cache marks and the first one's drops: only those stay."""
    import jupyter_gpumem as g
    from jupyter_gpumem.notebook import session_trace

    ptrs = []
    try:
        for cell in (1, 2, 3):
            with g.trace(cell=cell, plot=False):
                ptrs.append(g.caching_allocator_alloc(MiB))
                g.empty_cache()  # a mark in each recording
        recordings = session_trace._recordings(CupySource(sim))
        assert [sorted(r.info) for r in recordings[:-1]] == [
            ["empty_cache", "history_dropped"]] * 2
        assert "stats" in recordings[-1].info and recordings[-1].segments
        snap, _ = session_timeline(CupySource(sim))
        info = snap["jupyter_gpumem"]
        assert info["stats"] == recordings[-1].info["stats"]
        assert info["empty_cache"] == [2, 3, 5]  # one a recording (2, 1, 2 events), after each
    finally:
        for p in ptrs:
            g.caching_allocator_delete(p)
