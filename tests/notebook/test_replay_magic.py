"""``%gpumem replay`` and the OOM explainer's offer, in a real InteractiveShell on a simulated
device, with the fragmentation workload (``fragmentation_workload``)."""

from __future__ import annotations

import re

import pytest
from bundle_checks import check_bundle
from fragmentation_workload import CELL_BEFORE, CELL_OOM, MiB
from IPython.core.error import UsageError

import jupyter_gpumem as gm_api
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.notebook.oom_panel import is_oom_error
from jupyter_gpumem.whatif.compare import ReplayComparison, Suggestion


def oom(run, history: str = "on", between: str = "") -> object:
    """The workload: cell [N] fragments, cell [N+1] runs out of memory (after the cell
    ``between``, if given); returns its panel."""
    if history:
        run(f"%gpumem history {history}")
    run(CELL_BEFORE)
    if between:
        run(between)
    result, out = run(CELL_OOM)
    assert is_oom_error(result.error_in_exec)
    return out.outputs[-1].data


SUGGESTED = ("replaying this trace ({n} events) with `max_split_size_mb:64` would have fit "
             "(peak reserved 700 MiB instead of the 1.2 GiB it needs): `%gpumem replay last "
             "--suggest` shows it, `%gpumem config max_split_size_mb:64` sets it.")


def test_suggest_after_a_fragmentation_oom(gm, run, sim, shell) -> None:
    oom(run)
    result, out = run("%gpumem replay last --suggest -o found")
    assert result.success
    found = shell.user_ns["found"]
    assert isinstance(found, Suggestion) and result.result is found
    text = found._repr_mimebundle_()["text/plain"]
    assert text in out.stdout  # shown as the cell's value
    first = found.baseline.first_oom
    assert text.splitlines()[:4] == [
        "gpumem replay --suggest: max_split_size_mb:64 would have fit: peak reserved 700 MiB "
        f"instead of the 1.2 GiB it needs (the recorded config fails at event {first}); 24 of "
        "24 configs tried, 20 fit.",
        "  in this session:  %gpumem config max_split_size_mb:64",
        "  a new process:    PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64",
        "  a new process:    JUPYTER_GPUMEM_ALLOC_CONF=max_split_size_mb:64"]
    check_bundle(found._repr_mimebundle_())
    assert sim.config.max_split_size_mb is None  # a suggestion, not a change
    # the line it prints does what it says
    _, said = run(found.config_line)
    assert said.stdout == "gpumem config: max_split_size_mb:64\n"
    run("g.caching_allocator_delete(y)\n" + CELL_BEFORE + "\n" + CELL_OOM)
    assert sim.memory_reserved() == 700 * MiB
    run("g.caching_allocator_delete(y); g.caching_allocator_delete(z)\n%gpumem config "
        "max_split_size_mb:none")


def test_the_oom_panel_offers_the_config_that_fits(gm, run, sim, shell) -> None:
    panel = oom(run)
    n = sum(e["action"] != "snapshot" for e in sim.snapshot()["device_traces"][0])
    text = panel["text/plain"]
    # the memory was fragmented: the config that fits leads the next steps
    assert text.split("Next steps:\n")[1].startswith("  - " + SUGGESTED.format(n=n) + "\n")
    assert ("<code>%gpumem replay last --suggest</code>" in panel["text/html"])
    assert "replay" not in text.split("Next steps:")[0]
    run("g.caching_allocator_delete(y)")


def _offered(panel: object) -> int:
    found = re.search(r"replaying this trace \((\d+) events\)", panel["text/plain"])  # type: ignore[index]
    assert found is not None
    return int(found.group(1))


@pytest.mark.parametrize("between", ["", "s = g.snapshot()"], ids=["plain", "user-snapshot"])
def test_the_panel_and_every_replay_count_the_same_trace(gm, run, sim, shell,
                                                         between: str) -> None:
    # The tool's own reads (the panel, `last`) log no snapshot event: the trace does not grow
    # as it is looked at, so the offer and each replay after it count the same events; the
    # user's own snapshot is one event of the trace for both.
    n = _offered(oom(run, between=between))
    counts = []
    for _ in range(3):
        result, _ = run("%gpumem replay last -o r")
        assert result.success
        counts.append(shell.user_ns["r"].events)
    assert counts == [n, n, n]
    actions = [e["action"] for e in sim.snapshot(mark=False)["device_traces"][0]]
    assert len(actions) == n and actions.count("snapshot") == (1 if between else 0)
    run("g.caching_allocator_delete(y)")


def test_views_leave_the_history_as_it_is_and_the_users_snapshot_marks_it(
        gm, run, sim, shell) -> None:
    oom(run)
    before = sim.snapshot(mark=False)["device_traces"]
    grew = []
    for cell in ("%gpumem snapshot", "%gpumem plot", "%gpumem",
                 "%gpumem replay last --suggest", "%%gpumem_trace --no-plot\nq = 1"):
        result, _ = run(cell)
        assert result.success, (cell, result.error_in_exec)
        if sim.snapshot(mark=False)["device_traces"] != before:
            grew.append(cell)
            before = sim.snapshot(mark=False)["device_traces"]
    assert grew == []
    run("s = g.snapshot()")  # the user's own snapshot is marked, as PyTorch's _snapshot()
    after = sim.snapshot(mark=False)["device_traces"][0]
    assert after[:-1] == before[0] and after[-1]["action"] == "snapshot"
    assert shell.user_ns["s"]["device_traces"][0] == after
    run("g.caching_allocator_delete(y)")


def test_no_offer_without_recorded_events_or_when_nothing_fits(gm, run, sim, shell) -> None:
    panel = oom(run, history="")  # history state: no events before the error
    assert "replay" not in panel["text/plain"]
    run("g.caching_allocator_delete(y)")
    # events recorded, but nothing the grid tries fits: 2 × 600 MiB live on 1 GiB
    run("%gpumem history on")
    run("a = g.caching_allocator_alloc(600 * MiB)")
    result, out = run("b = g.caching_allocator_alloc(600 * MiB)")
    assert is_oom_error(result.error_in_exec)
    assert "replay" not in out.outputs[-1].data["text/plain"]
    run("g.caching_allocator_delete(a)")


def test_compare_last_equals_replay(gm, run, sim, shell) -> None:
    oom(run)
    result, _ = run("%gpumem replay --config max_split_size_mb:128 --config recorded "
                    "--config defaults -o cmp")
    assert result.success
    cmp = shell.user_ns["cmp"]
    assert isinstance(cmp, ReplayComparison)
    check_bundle(cmp._repr_mimebundle_())
    snapshot = sim.snapshot()  # what `last` replayed, and one more snapshot event (a no-op)
    for config, res in zip(["max_split_size_mb:128", None, ""], cmp.results, strict=True):
        direct = gm_api.replay(snapshot, config)
        assert (res.peak_reserved, res.num_segments, res.num_ooms, res.first_oom,
                res.num_alloc_retries) == (direct.peak_reserved, direct.num_segments,
                                           direct.num_ooms, direct.first_oom,
                                           direct.num_alloc_retries)
    assert [r.fits for r in cmp.results] == [True, False, False]
    run("g.caching_allocator_delete(y)")


def test_a_file_ours_and_pytorch_pickle(gm, run, sim, shell, tmp_path) -> None:
    oom(run)
    path = tmp_path / "frag.pickle"
    run(f"%gpumem dump {path}")
    run("g.caching_allocator_delete(y)\n%gpumem history off")
    result, out = run(f"%gpumem replay {path} --suggest")
    assert result.success, result.error_in_exec
    assert "max_split_size_mb:64 would have fit" in out.stdout
    # --capacity: on a 2 GiB device the recorded config fits too
    result, out = run(f"%gpumem replay {path} --capacity 2GiB --config recorded")
    assert result.result.results[0].fits and result.result.capacity == 2 << 30
    # a PyTorch-style pickle: no field of ours, so nothing says the config or the device size
    import pickle

    snap = pickle.loads(path.read_bytes())
    del snap["jupyter_gpumem"]
    torch_path = tmp_path / "torch.pickle"
    torch_path.write_bytes(pickle.dumps(snap, protocol=2))
    result, out = run(f"%gpumem replay {torch_path} --capacity 1GiB --suggest")
    assert result.success, result.error_in_exec
    text = out.stdout
    assert "max_split_size_mb:64 would have fit" in text
    assert "note: the trace lists no empty_cache() calls (a PyTorch trace)" in text


def test_last_from_a_traced_cell(gm, run, sim, shell) -> None:
    # history state (the default): only the traced cell's events are kept, empty_cache included
    run("p = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(p)")
    result, _ = run("%%gpumem_trace --no-plot -o t\n"
                    "q = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(q)\n"
                    "g.empty_cache()\n"
                    "r = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(r)\n"
                    "g.empty_cache()")
    assert result.success
    t = shell.user_ns["t"]
    result, _ = run("%gpumem replay last --config recorded -o cmp")
    assert result.success, result.error_in_exec
    replayed = shell.user_ns["cmp"].results[0]
    # what the cell did, event by event, with the empty_cache calls at their places (a replay
    # takes a segment at the alloc event, not at the segment_alloc just before it)
    actions = [e["action"] for e in t.snapshot["device_traces"][0]]
    assert actions.count("segment_free") == 2
    at = [i for i, action in enumerate(actions) if action != "segment_alloc"]
    assert list(replayed.reserved[at]) == list(t.timeline.reserved[at])
    assert replayed.peak_reserved == 30 * MiB
    assert replayed.empty_cache_calls == 2 and replayed.num_segments == 0


def test_nothing_to_replay(gm, run, sim) -> None:
    result, _ = run("%gpumem replay")
    assert isinstance(result.error_in_exec, UsageError)
    assert "nothing to replay" in str(result.error_in_exec)
    # history on, and only the user's own snapshot marks in it: still nothing to replay
    run("%gpumem history on\ng.snapshot(); g.snapshot()")
    assert [e["action"] for e in sim.snapshot(mark=False)["device_traces"][0]] == [
        "snapshot", "snapshot"]
    result, _ = run("%gpumem replay last")
    assert "the history holds no events yet" in str(result.error_in_exec)


BAD = [
    "replay nope.pickle", "replay last extra", "replay --config max_split_size_mb:10",
    "replay --config bogus:1", "replay --config ''", "replay --config", "replay --suggest "
    "--config max_split_size_mb:64", "replay --capacity 0", "replay --capacity -1GiB",
    "replay --capacity nan", "replay --capacity lots", "replay -o 1x", "replay -o",
    "summary --suggest", "stats --config max_split_size_mb:64", "cells -o x",
    # names the namespace keeps, and a keyword: they were taken
    "replay -o for", "replay -o __builtins__", "replay -o In", "replay -o _",
    "replay --output get_ipython", "replay -o _i3", "replay -o __doc__",
]


@pytest.mark.parametrize("line", BAD)
def test_bad_input_is_a_usage_error_and_changes_nothing(gm, run, sim, shell, line) -> None:
    run("%gpumem history on")
    run("p = g.caching_allocator_alloc(30 * MiB)")
    before = (sim.config, sim.memory_allocated(), sim.memory_reserved(), sim.memory_stats(),
              len(sim.snapshot()["device_traces"][0]))
    names = set(shell.user_ns)
    result, _ = run(f"%gpumem {line}")
    assert isinstance(result.error_in_exec, UsageError), line
    message = str(result.error_in_exec)
    assert "\n" not in message and message.endswith("(see %gpumem? for usage)"), message
    after = (sim.config, sim.memory_allocated(), sim.memory_reserved(), sim.memory_stats(),
             len(sim.snapshot()["device_traces"][0]) - 1)  # the snapshot event of `before`
    assert after == before
    assert set(shell.user_ns) - names <= {"_i", "_ii", "_iii"} | {
        n for n in shell.user_ns if n.startswith("_i")}
    run("g.caching_allocator_delete(p)")


def test_a_file_that_is_not_a_snapshot(gm, run, tmp_path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    result, _ = run(f"%gpumem replay {path}")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec).startswith(f"%gpumem replay: {path}")


def test_a_traced_cells_snapshot_marks_its_own_empty_cache_calls(gm, run, sim, shell) -> None:
    # history on, with events before the traced cell: its snapshot's empty_cache marks count
    # the cell's own events (they counted the whole history, so a replay put them elsewhere)
    run("%gpumem history on")
    run("p = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(p)")
    run("%%gpumem_trace --no-plot -o t\n"
        "q = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(q)\n"
        "g.empty_cache()\n"
        "r = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(r)\n"
        "g.empty_cache()")
    t = shell.user_ns["t"]
    actions = [e["action"] for e in t.snapshot["device_traces"][0]]
    assert t.snapshot["jupyter_gpumem"]["empty_cache"] == [3, 8]
    assert actions[3] == actions[8] == "segment_free"
    replayed = gm_api.replay(t.snapshot)
    at = [i for i, action in enumerate(actions) if action != "segment_alloc"]
    assert list(replayed.reserved[at]) == list(t.timeline.reserved[at])


def test_last_joins_traced_cells_with_their_marks_and_device(gm, run, sim, shell) -> None:
    cell = ("%%gpumem_trace --no-plot\n"
            "q = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(q)\n"
            "g.empty_cache()")
    run(cell)
    run(cell + "\ng.empty_cache()")  # a call that frees nothing is replayed too
    result, _ = run("%gpumem replay last --config recorded -o cmp")
    assert result.success, result.error_in_exec
    replayed = shell.user_ns["cmp"].results[0]
    assert replayed.empty_cache_calls == 3 and not replayed.inferred_empty_cache
    assert replayed.capacity == 1 << 30 and replayed.notes == ()
    assert replayed.num_segments == 0 and replayed.peak_reserved == 30 * MiB


GROWING = ("keep = []\n"
           "for step in range(1, 30):\n"
           "    p = g.caching_allocator_alloc(step * 7 * MiB + 123)\n"
           "    keep.append(g.caching_allocator_alloc(MiB + 512 * step))\n"
           "    g.caching_allocator_delete(p)\n")


def test_the_oom_panel_offers_expandable_segments_for_growing_requests(gm, run, sim,
                                                                        shell) -> None:
    """Requests that grow step by step: out of memory under the default policy on 1 GiB,
    with expandable segments the replay fits, lowest of the grid."""
    run("%gpumem history on")
    result, out = run(GROWING)
    assert is_oom_error(result.error_in_exec)
    text = out.outputs[-1].data["text/plain"]
    assert "with `expandable_segments:True` would have fit (peak reserved" in text
    assert "`%gpumem config expandable_segments:True` sets it." in text
    result, out = run("%gpumem replay last --config expandable_segments:True -o cmp")
    assert result.success
    cmp = shell.user_ns["cmp"]
    assert isinstance(cmp, ReplayComparison)
    assert [r.config.as_text() for r in cmp.results] == ["expandable_segments:True"]
    assert cmp.results[0].fits and cmp.results[0].num_ooms == 0
    assert "expandable_segments:True" in out.stdout
    assert "note: segments count classic segments only" in out.stdout
    result, out = run("%gpumem replay last --suggest -o found")
    assert shell.user_ns["found"].changes == {"expandable_segments": True}
    run("for q in keep: g.caching_allocator_delete(q)")


def test_fragmented_is_as_at_the_error_when_the_cell_frees_on_the_way_out(gm, run, sim,
                                                                          shell) -> None:
    # The cell's `finally` frees its blocks before the panel is built: the cache now has one
    # free 600 MiB segment again, but at the error every cached block was too small.
    run("y = g.caching_allocator_alloc(100 * MiB)")
    result, out = run("x = g.caching_allocator_alloc(600 * MiB)\ng.caching_allocator_delete(x)\n"
                      "w = g.caching_allocator_alloc(300 * MiB)\n"
                      "try:\n    z = g.caching_allocator_alloc(600 * MiB)\n"
                      "finally:\n    g.caching_allocator_delete(w)")
    assert is_oom_error(result.error_in_exec)
    report = result.error_in_exec.report
    assert report.largest_free_block < report.rounded
    text = out.outputs[-1].data["text/plain"]
    assert f"Memory: {format_bytes(report.free_cached)} free but fragmented" in text
    run("g.caching_allocator_delete(y)")


def _unbuildable_files(tmp_path) -> dict[str, tuple[object, str]]:
    """Files that load but that the replay cannot rebuild: {name: (snapshot, the error's
    text after "FILE: ")}. They raised ValueError from inside the replay, naming no file."""
    from hostile_files import base_snapshot

    small = base_snapshot()  # a small-pool segment of 3 MiB, older than the trace
    small["segments"][0]["total_size"] = 3 * MiB
    small["segments"][0]["blocks"][1]["size"] = 3 * MiB - 512
    small["device_traces"][0] = small["device_traces"][0][1:]
    no_room = {"segments": [], "device_traces": [[
        {"action": "oom", "addr": 0, "size": 512, "stream": 0, "time_us": 1, "frames": [],
         "device_free": 0}]]}
    bad_config = base_snapshot()
    bad_config["jupyter_gpumem"] = {"config": "max_split_size_mb"}
    lost = {"segments": [], "device_traces": [[  # a block older than the trace, in no segment
        {"action": "free_completed", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 1,
         "frames": []}]]}
    return {
        "small.json": (small, "segments[0].total_size: a small-pool segment of 3,145,728 "
                       "bytes, which the policy never makes (only 2,097,152): the replay "
                       "cannot rebuild it"),
        "no_room.json": (no_room, "device_traces[0][0].device_free: the allocator could use 0 "
                         "bytes of the device (its reserved bytes plus what the device had "
                         "free): nothing to replay on; pass capacity (--capacity) to replay on "
                         "a device of that size"),
        "config.json": (bad_config, "jupyter_gpumem.config: expected key:value, got "
                        "'max_split_size_mb'"),
        "lost.json": (lost, "device_traces[0][0]: block 0x1000 lies in no segment (the trace "
                      "and the snapshot disagree)"),
    }


def test_a_file_the_replay_cannot_rebuild_is_one_line_naming_the_file_and_field(
        gm, run, tmp_path, capsys) -> None:
    import json

    from jupyter_gpumem.__main__ import main
    from jupyter_gpumem.data.files import SnapshotFileError

    for name, (snapshot, said) in _unbuildable_files(tmp_path).items():
        path = tmp_path / name
        path.write_text(json.dumps(snapshot))
        result, _ = run(f"%gpumem replay {path}")
        assert isinstance(result.error_in_exec, UsageError), name
        assert str(result.error_in_exec) == f"%gpumem replay: {path}: {said}"
        with pytest.raises(SnapshotFileError) as raised:
            gm_api.replay(path)
        assert str(raised.value) == f"{path}: {said}"
        assert isinstance(raised.value, ValueError)
        assert main(["replay", str(path)]) == 1
        assert capsys.readouterr().err == f"jupyter-gpumem: {path}: {said}\n"
