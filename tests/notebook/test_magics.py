"""``%gpumem`` and ``%%gpumem_trace`` in a real InteractiveShell on a simulated device."""

from __future__ import annotations

import builtins
import gzip
import json
import pickle
import re
import threading

import pytest
from bundle_checks import check_bundle, images
from IPython.core.error import UsageError
from view_assets import needs_dist

from jupyter_gpumem.notebook.subcommands import SUBCOMMANDS

MiB = 1 << 20






def state(sim) -> tuple:
    """Everything a bad %gpumem call must leave alone."""
    return (sim.config, sim.recording, sim.memory_allocated(), sim.memory_reserved(),
            sim.memory_stats())


def free_all(run, *names: str) -> None:
    for name in names:
        result, _ = run(f"g.caching_allocator_delete({name})")
        assert result.success


def test_help_is_real(shell, gm) -> None:
    doc = shell.find_line_magic("gpumem").__doc__
    assert doc.startswith("usage: %gpumem [")  # no stray reStructuredText "::" before it
    assert shell.find_cell_magic("gpumem_trace").__doc__.startswith("usage: %gpumem_trace [")
    for sub in ("summary", "diff A B", "limit FRACTION|SIZE", "--max-entries", "device sim|cuda"):
        assert sub in doc
    assert "--no-plot" in shell.find_cell_magic("gpumem_trace").__doc__


def listed_subcommands(text: str) -> list[list[str]]:
    """``[synopsis, help]`` of each subcommand in the list that ``%gpumem?`` shows."""
    section = text.split("\nSubcommands:\n", 1)[1].split("\n\n", 1)[0]
    rows: list[list[str]] = []
    for line in section.splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # a synopsis, maybe its help
            synopsis, _, help_ = line[2:].partition("  ")
            rows.append([synopsis, help_.strip()])
        else:  # the help under a synopsis too wide for its column
            rows[-1][1] += line.strip()
    return rows


def test_help_lists_every_subcommand_once_with_its_help(shell, gm, run) -> None:
    shown = re.sub(r"\x1b\[[0-9;]*m", "", shell.object_inspect_text("%gpumem"))  # as %gpumem?
    rows = listed_subcommands(shown)
    names = [synopsis.split()[0] for synopsis, _ in rows]
    assert sorted(names) == sorted(sub.name for sub in SUBCOMMANDS)
    assert len(set(names)) == len(names) == len(SUBCOMMANDS)
    for sub, (synopsis, help_) in zip(SUBCOMMANDS, rows, strict=True):
        assert help_, f"{sub.name} has no help"
        assert (synopsis, help_) == (f"{sub.name} {sub.usage}".strip(), sub.help)
    result, _ = run("%gpumem bogus")  # the same names, in the same order
    assert f"one of {', '.join(names)} (see" in str(result.error_in_exec)


@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=lambda sub: sub.name)
def test_usage_agrees_with_the_checks(sub) -> None:
    """The usage line shows exactly the flags and the number of values the checks allow."""
    flags = {f.replace("-", "_") for f in re.findall(r"--(?:no-)?([a-z-]+)", sub.usage)}
    assert flags == set(sub.flags)
    values = re.sub(r"\[--[^]]*\]", "", sub.usage).split()
    required = [v for v in values if not v.startswith("[")]
    most = None if any("..." in v for v in values) else len(values)
    assert sub.arity == (len(required), most)


def test_flags_are_checked_from_the_table(shell, gm, run) -> None:
    options = {"full": "--full", "json": "--json", "stacks": "--stacks",
               "max_entries": "--max-entries 5", "capacity": "--capacity 1GiB",
               "config": "--config max_split_size_mb:64", "suggest": "--suggest",
               "output": "--output r", "interval": "--interval 2", "live": "--no-live",
               "stop": "--stop"}
    parser = shell.find_line_magic("gpumem").parser
    dests = set(vars(parser.parse_args([]))) - {"subcommand", "values"}
    assert dests == set(options) == {flag for sub in SUBCOMMANDS for flag in sub.flags}
    for sub in SUBCOMMANDS:
        for dest, option in options.items():
            if dest not in sub.flags:
                result, _ = run(f"%gpumem {sub.name} {option}")
                assert str(result.error_in_exec) == (
                    f"{option.split()[0]} does not apply to {sub.name!r} (see %gpumem? for "
                    "usage)")
    result, _ = run("%gpumem summary --no-stacks")
    assert str(result.error_in_exec).startswith("--no-stacks does not apply to 'summary'")


def test_status_line(gm, run, sim) -> None:
    run("p = g.caching_allocator_alloc(3 * MiB)")
    _, out = run("%gpumem")
    assert out.outputs[0].data["text/plain"] == (
        "gpumem · sim device 0 (Simulated GPU 0) · allocated 3.0 MiB (peak 3.0 MiB) · "
        "reserved 20.0 MiB · device free 1004 MiB of 1.0 GiB · "
        "history: lines of live blocks only · 2 cells recorded")
    # the line is an output of its own (a frontend that draws our views shows it too); then a
    # picture of the layout as the cell ran, and its view payload (kind snapshot)
    assert set(out.outputs[0].data) == {"text/plain", "text/html"}
    payload = check_bundle(out.outputs[1].data, kind="snapshot")
    assert payload["title"] == "block layout when cell [4] ran (%gpumem snapshot shows it now)"
    assert payload["n_events"] == 0 and "1 allocated block (3.0 MiB)" in images(
        out.outputs[1].data["text/html"])[0][1]
    assert payload["block_holders"] == [[sim.snapshot()["segments"][0]["address"], ["p"]]]
    free_all(run, "p")
    # on an empty device: the line alone, no layout of "0 segments"
    run("g.empty_cache()")
    _, out = run("%gpumem")
    assert len(out.outputs) == 1 and "reserved 0 B" in out.outputs[0].data["text/plain"]


def test_summary_and_full(gm, run, sim) -> None:
    _, out = run("%gpumem summary")
    assert out.stdout == sim.memory_summary(abbreviated=True)
    _, out = run("%gpumem summary --full")
    assert out.stdout == sim.memory_summary()


def test_stats_text_and_json(gm, run, sim) -> None:
    run("p = g.caching_allocator_alloc(1024)")
    _, out = run("%gpumem stats --json")
    assert json.loads(out.stdout) == sim.memory_stats()
    _, out = run("%gpumem stats")
    assert "\nallocated_bytes       1.0 KiB  1.0 KiB\n" in out.stdout
    assert "allocations made 1, freed 0" in out.stdout
    free_all(run, "p")


def test_snapshot_and_plot_pictures(gm, run, sim) -> None:
    run("p = g.caching_allocator_alloc(1024)")
    _, out = run("%gpumem snapshot")
    check_bundle(out.outputs[0].data, kind="snapshot")
    _, out = run("%gpumem plot")
    assert "no event history" in out.stdout
    run("%gpumem history on")
    run("q = g.caching_allocator_alloc(2048)")
    _, out = run("%gpumem plot")
    check_bundle(out.outputs[0].data)
    assert "Plot of allocated and reserved GPU memory" in images(
        out.outputs[0].data["text/html"])[0][1]
    free_all(run, "p", "q")


def test_cells_table(gm, run, sim) -> None:
    run("p = g.caching_allocator_alloc(3 * MiB)")
    _, out = run("%gpumem cells")
    lines = out.outputs[0].data["text/plain"].splitlines()
    assert lines[0].split()[:3] == ["cell", "Δ", "allocated"]
    row = next(line for line in lines if line.startswith("[3]"))
    assert row.split()[:4] == ["[3]", "+3.0", "MiB", "+20.0"]
    assert "<table" in out.outputs[0].data["text/html"]
    free_all(run, "p")


def test_cells_says_older_rows_were_folded(gm, run, sim) -> None:
    gm.settings.keep_rows = 2  # %config GpuMem.keep_rows = 2, at run time
    run("p = g.caching_allocator_alloc(3 * MiB)")  # cell 3
    run("q = g.caching_allocator_alloc(1 * MiB)")  # cell 4
    run("r = g.caching_allocator_alloc(2 * MiB)")  # cell 5
    _, out = run("%gpumem cells")  # cell 6: the ledger holds cells 4 and 5; 2 and 3 are folded
    lines = out.outputs[0].data["text/plain"].splitlines()
    assert lines[0] == ("older rows folded: the first row adds up 2 older cells (totals, and "
                        "the highest peak); the last 2 cells are kept in full (GpuMem.keep_rows)")
    assert lines[2].split()[:4] == ["[2]–[3]", "+3.0", "MiB", "+20.0"]
    assert lines[2].endswith("2 older cells, folded")
    assert [line.split()[0] for line in lines[3:]] == ["[4]", "[5]"]
    assert "<p>older rows folded: " in out.outputs[0].data["text/html"]
    _, out = run("%gpumem")  # cell 7
    assert out.outputs[0].data["text/plain"].endswith(" · 5 cells recorded")  # folded ones too
    assert [r["cell"] for r in gm.ledger.rows] == [6, 7]
    free_all(run, "p", "q", "r")


def test_diff(gm, run, sim) -> None:
    run("a = g.caching_allocator_alloc(2 * MiB)")  # cell 3
    run("b = g.caching_allocator_alloc(3 * MiB)")  # cell 4
    _, out = run("%gpumem diff 3 4")
    text = out.outputs[0].data["text/plain"]
    assert text.splitlines()[0] == ("cell [3] → cell [4]: 1 new block(s) (3.0 MiB), 0 freed "
                                    "(0 B), net +3.0 MiB")
    assert "cell [4] line 1" in text
    free_all(run, "a", "b")


def test_reset_peak_and_empty_cache(gm, run, sim) -> None:
    run("p = g.caching_allocator_alloc(30 * MiB); g.caching_allocator_delete(p)")
    assert sim.memory_stats()["allocated_bytes.all.peak"] == 30 * MiB
    _, out = run("%gpumem reset-peak")
    assert sim.memory_stats()["allocated_bytes.all.peak"] == 0
    _, out = run("%gpumem empty-cache")
    assert out.stdout == "gpumem: released 30.0 MiB of cached segments to the device\n"
    assert sim.memory_reserved() == 0


def test_config(gm, run, sim) -> None:
    _, out = run("%gpumem config")
    assert out.stdout == "gpumem config: (defaults)\n"
    _, out = run("%gpumem config max_split_size_mb:64,garbage_collection_threshold:0.6")
    assert sim.config.max_split_size_mb == 64
    assert sim.config.garbage_collection_threshold == 0.6
    from jupyter_gpumem import AllocatorConfig
    from jupyter_gpumem.runtime import registry

    registry.set_default_config(AllocatorConfig())


@pytest.mark.parametrize(("value", "cap"), [("0.5", 512 * MiB), ("256MiB", 256 * MiB),
                                           ("1GiB", None), ("0", 0)])
def test_limit(gm, run, sim, value, cap) -> None:
    result, _ = run(f"%gpumem limit {value}")
    assert result.success
    assert sim.cap == cap
    run("%gpumem limit none")
    assert sim.cap is None


def test_history_modes(gm, run, sim) -> None:
    assert sim.recording and sim.history.max_entries == 0  # "state" by default
    run("%gpumem history on --no-stacks --max-entries 50")
    assert sim.history.max_entries == 50 and not sim.history.stacks
    assert gm.settings.record_history == "all"
    run("%gpumem history off")
    assert not sim.recording


def test_processes_and_info(gm, run, sim) -> None:
    _, out = run("%gpumem processes")
    assert out.stdout.startswith("GPU:0\nno processes are running\nof 1.0 GiB: free 1.0 GiB")
    _, out = run("%gpumem info")
    assert "backend sim" in out.stdout and "Simulated GPU 0, 1.0 GiB total" in out.stdout


def test_history_takes_the_rings_size_and_a_bare_history_says_its_bytes(gm, run, sim) -> None:
    from jupyter_gpumem.data.sizes import RING_EVENT_BYTES

    _, out = run("%gpumem history on --max-entries 64MiB")
    assert out.stdout == "gpumem: history on (stacks on, up to 2097152 events)\n"
    run("p = g.caching_allocator_alloc(4 * MiB)")
    _, out = run("%gpumem history")
    # 1,024 events' room (32 KiB) and the cell runs' list (1 KiB)
    assert out.stdout == (
        "gpumem: history on (stacks on, up to 2097152 events)\n"
        "  GPU 0: 2 events kept, 0 dropped; ring 33.0 KiB now, 64.0 MiB when full "
        f"({RING_EVENT_BYTES} B an event, with stacks or without); 1 distinct stack\n")
    for bad, why in (("abc", "a number of events (1000000) or the ring's size"),
                     ("16B", "holds no event"), ("0", "between 1 and")):
        result, _ = run(f"%gpumem history on --max-entries {bad}")
        assert isinstance(result.error_in_exec, UsageError) and why in str(result.error_in_exec)
    free_all(run, "p")


def test_dump_and_load(gm, run, sim, tmp_path) -> None:
    run("%gpumem history on")
    run("p = g.caching_allocator_alloc(4 * MiB)")
    path = tmp_path / "s.pickle"
    _, out = run(f"%gpumem dump {path}")
    assert out.stdout == f"gpumem: snapshot saved to {path}\n"
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert [b["size"] for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"] == [4 * MiB]
    result, _ = run(f"view = %gpumem load {path}")
    assert result.success
    view = gm.shell.user_ns["view"]
    assert "4.0 MiB" in repr(view) or "4.0 MiB" in str(view._repr_mimebundle_()["text/plain"])
    json_path = tmp_path / "s.json"
    run(f"%gpumem dump {json_path}")
    assert json.loads(json_path.read_text())["segments"]
    gz_path = tmp_path / "s.json.gz"
    run(f"%gpumem dump {gz_path}")
    assert json.loads(gzip.decompress(gz_path.read_bytes()))["segments"]
    ours = tmp_path / "s.gpumem"
    _, out = run(f"%gpumem dump {ours}")
    assert out.stdout == f"gpumem: snapshot saved to {ours}\n"
    assert ours.read_bytes().startswith(b"GPUMEM\0")
    result, _ = run(f"again = %gpumem load {ours}")
    assert result.success
    text = str(gm.shell.user_ns["again"]._repr_mimebundle_()["text/plain"])
    assert "4.0 MiB" in text and "gpumem trace: 6 events" in text  # 3 more: the 3 dumps' marks
    result, _ = run(f"%gpumem dump {tmp_path / 's.txt'}")  # no format named: nothing written
    assert isinstance(result.error_in_exec, UsageError)
    assert not (tmp_path / "s.txt").exists()
    free_all(run, "p")


def test_load_refuses_code(gm, run, tmp_path) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(threading.Thread, protocol=4))
    result, _ = run(f"%gpumem load {path}")
    assert isinstance(result.error_in_exec, UsageError)


def test_auto_footer(gm, run, sim) -> None:
    run("%gpumem auto on")
    _, out = run("p = g.caching_allocator_alloc(3 * MiB)")
    assert out.stdout == ("gpumem [4]: Δallocated +3.0 MiB · peak 3.0 MiB · reserved 20.0 MiB "
                          "(Δ +20.0 MiB)\n"
                          "  left 3.0 MiB in 1 new block, held by p (3.0 MiB); allocated at "
                          "cell [4] line 1\n")
    run("%gpumem auto off")
    _, out = run("g.caching_allocator_delete(p)")
    assert out.stdout == ""


def test_device_switch(gm, run, sim) -> None:
    from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason
    from jupyter_gpumem.runtime import registry

    result, _ = run("%gpumem device cuda")
    if cuda_unavailable_reason() is not None:
        assert isinstance(result.error_in_exec, UsageError)
        assert "no GPU here" in str(result.error_in_exec)
        assert registry.backend() == "sim"
    result, out = run("%gpumem device sim --capacity 2GiB")
    assert result.success, out.stderr
    assert registry.get_allocator().device.mem_get_info()[1] == 2 << 30
    run("%gpumem device sim --capacity 1GiB")


BAD = [
    "bogus", "summary --json", "stats --full", "stats extra", "diff 1", "diff a b", "diff 1 99",
    "config max_split_size_mb:5", "config nonsense:1", "config novalue", "limit", "limit 1.5",
    "limit -0.1", "limit 40GiB", "limit lots", "history maybe", "history on --max-entries 0",
    "summary --no-stacks", "dump", "load", "auto maybe", "device tpu",
    "load '/no such folder/x.json'",
    "device cuda --capacity 1GiB",
    "device sim --capacity huge", "reset-peak now", "--max-entries x history on",
    # numbers too large for the cores: these raised OverflowError
    "config max_split_size_mb:99999999999999999999",
    "config roundup_power2_divisions:9223372036854775808", "limit 1e999GiB",
    "device sim --capacity 1e400", "history on --max-entries 99999999999999999999",
    "history state --no-stacks --max-entries 99999999999999999999",
    # unclosed quotes: these raised ValueError
    "summary '", 'dump "x.json', "load 'x.json",
    # negative, NaN, infinite and empty values
    "limit nan", "limit inf", "limit -1", "limit -1GiB", "limit 0GiB", "limit ''",
    "limit 1e400", "config max_split_size_mb:-64", "config max_split_size_mb:nan",
    "config max_split_size_mb:1e3", "config garbage_collection_threshold:nan",
    "config garbage_collection_threshold:inf", "config per_process_memory_fraction:-0.5",
    "config roundup_power2_divisions:3", "config roundup_power2_divisions:-4",
    "config max_split_size_mb:", "config :64", "config ''",
    "history on --max-entries -1", "history on --max-entries nan", "history on --max-entries ''",
    "history on --max-entries 1e3", "history on --max-entries", "history ''",
    "device sim --capacity -1GiB", "device sim --capacity nan", "device sim --capacity inf",
    "device sim --capacity 0", "device sim --capacity ''", "device sim --capacity",
    "device sim --capacity 1e30", "diff 1e400 1", "diff nan 1", "diff '' ''",
    # unknown keys, subcommands and flags; too many arguments
    "config nonsense:1,max_split_size_mb:64", "Summary", "'' ''", "--bogus", "summary --bogus",
    "diff 1 2 3", "limit 0.5 0.5", "history on off", "auto on off", "device sim sim",
    "dump a.json b.json", "load a.json b.json", "stats --json extra", "info now",
    "cells 1", "plot x", "snapshot x", "processes x", "empty-cache x",
    "dump out.txt", "dump '/no such folder/x.json'",
    # a NUL character (ValueError: embedded null byte), a place no one can write
    "dump a\0b.json", "dump /proc/gpumem-dump.json",
]


def world(sim) -> tuple:
    """The runtime's side of the state: backend, current allocator, device and its size."""
    from jupyter_gpumem.runtime import registry as _runtime

    a = _runtime.get_allocator()
    return (_runtime.backend(), a is sim, a.device.mem_get_info()[1], dict(_runtime.allocators()))


@pytest.mark.parametrize("line", BAD)
def test_bad_input_is_a_usage_error_and_changes_nothing(gm, run, sim, line) -> None:
    before = state(sim)
    settings = dict(gm.settings.trait_values())
    rows = len(gm.ledger.rows)
    runtime = world(sim)
    result, _ = run(f"%gpumem {line}")
    assert isinstance(result.error_in_exec, UsageError), line
    message = str(result.error_in_exec)
    assert "\n" not in message, message
    # a file that cannot be read is not a usage mistake: the message names the file instead
    if line.startswith("load '/"):
        assert message == "%gpumem load: /no such folder/x.json: no such file"
    else:
        assert message.endswith("(see %gpumem? for usage)"), message
    assert state(sim) == before
    assert world(sim) == runtime
    assert {k: v for k, v in gm.settings.trait_values().items() if k != "config"} == {
        k: v for k, v in settings.items() if k != "config"}
    assert len(gm.ledger.rows) == rows + 1  # the failed cell itself is recorded, nothing else


def test_usage_errors_are_one_line(gm, run) -> None:
    result, _ = run("%gpumem bogus")
    assert str(result.error_in_exec) == (
        "unknown subcommand 'bogus'; one of summary, stats, snapshot, plot, cells, diff, "
        "reset-peak, empty-cache, forget-error, config, limit, history, processes, info, dump, "
        "load, replay, auto, device, source, torch, cluster (see %gpumem? for usage)")
    result, _ = run("%gpumem history on --max-entries 99999999999999999999")
    assert str(result.error_in_exec) == (
        "argument --max-entries: must be between 1 and 9223372036854775807, got "
        "99999999999999999999 (see %gpumem? for usage)")
    result, _ = run("%gpumem summary '")
    assert str(result.error_in_exec) == (
        "cannot split the arguments: No closing quotation (see %gpumem? for usage)")


@needs_dist  # it writes an HTML page
def test_quoted_paths_with_spaces(gm, run, sim, shell, tmp_path) -> None:
    folder = tmp_path / "two  words"
    folder.mkdir()
    result, out = run(f"%gpumem dump '{folder}/a snap.json'")
    assert result.success, out.stderr
    assert (folder / "a snap.json").exists()
    result, out = run(f'%gpumem load "{folder}/a snap.json"')
    assert result.success, out.stderr
    result, out = run(f"%%gpumem_trace --no-plot --save '{folder}/a trace.html'\nx = 1")
    assert result.success, out.stderr
    assert (folder / "a trace.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_bad_history_changes_no_setting(gm, run, sim) -> None:
    run("%gpumem history on --no-stacks --max-entries 50")
    before = (gm.settings.record_history, gm.settings.stacks, gm.settings.max_entries,
              sim.history.max_entries)
    result, _ = run("%gpumem history state --stacks --max-entries 99999999999999999999")
    assert isinstance(result.error_in_exec, UsageError)
    assert (gm.settings.record_history, gm.settings.stacks, gm.settings.max_entries,
            sim.history.max_entries) == before == ("all", False, 50, 50)
    run("%gpumem history state")


# -- %%gpumem_trace ------------------------------------------------------------------------------


TRACE_CELL = """%%gpumem_trace -o t --no-plot
q = g.caching_allocator_alloc(5 * MiB)
r = g.caching_allocator_alloc(7 * MiB)
g.caching_allocator_delete(r)
"""


def test_trace_result(gm, run, sim, shell) -> None:
    run("p = g.caching_allocator_alloc(3 * MiB)")  # cell 3
    before = sim.history
    result, out = run(TRACE_CELL)  # cell 4
    assert result.success
    t = shell.user_ns["t"]
    assert t.peak_allocated == 15 * MiB
    assert [(u.site, u.bytes, u.count) for u in t.top_sites] == [
        ("cell [4] line 3", 7 * MiB, 1), ("cell [4] line 2", 5 * MiB, 1),
        ("cell [3] line 1", 3 * MiB, 1)]  # lines as the editor numbers them
    assert [(b.size, b.site, b.holders) for b in t.surviving] == [
        (5 * MiB, "cell [4] line 2", ("q",))]
    assert [e["action"] for e in t.snapshot["device_traces"][0]] == [
        "alloc", "alloc", "free_requested", "free_completed"]
    assert {e["cell"] for e in t.snapshot["device_traces"][0]} == {4}
    # layouts: three blocks live at the peak, two at the end
    live = [[b["size"] for s in layout for b in s["blocks"] if b["state"] == "active_allocated"]
            for layout in (t.layout_peak, t.layout_end)]
    assert live == [[3 * MiB, 5 * MiB, 7 * MiB], [3 * MiB, 5 * MiB]]
    # history is back as it was ("state": stacks of live blocks, no events)
    assert sim.history.max_entries == before.max_entries == 0
    shown = out.outputs[0].data
    assert shown["text/plain"].startswith("gpumem cell [4]: 4 events in ")
    check_bundle(shown, pictures=0, kind="trace")  # --no-plot: no picture
    assert "← q" in shown["text/plain"]
    free_all(run, "p", "q")


def test_trace_bands(gm, run, sim, shell) -> None:
    result, _ = run(TRACE_CELL)
    assert result.success
    t = shell.user_ns["t"]
    assert t.bands == "site" and t.to_json()["timeline"]["bands_by"] == "site"  # CuPy's default
    free_all(run, "q")
    result, _ = run(TRACE_CELL.replace("--no-plot", "--no-plot --bands holder"))
    assert result.success
    t = shell.user_ns["t"]
    # q and r held by plain variables (an address on the simulated device); r freed in the cell
    assert t.to_json()["timeline"]["band_labels"] == [
        "other variables", "freed during the trace (activations, temporaries)"]
    result, out = run("%%gpumem_trace --bands cell\nran = 1")
    assert not result.success and "ran" not in shell.user_ns
    assert "--bands: invalid choice" in out.stderr + str(result.error_in_exec)
    free_all(run, "q")


@needs_dist  # it writes an HTML page
def test_trace_with_plot_and_save(gm, run, sim, shell, tmp_path) -> None:
    path = tmp_path / "t.html"
    result, out = run(f"%%gpumem_trace --save {path}\nx = g.caching_allocator_alloc(MiB)\nx")
    assert result.success
    check_bundle(out.outputs[0].data, kind="trace")
    assert path.read_text().lstrip().lower().startswith("<!doctype html")
    assert shell.user_ns["_"] == shell.user_ns["x"]  # the last expression is the cell's value
    free_all(run, "x")


def test_trace_saves_compressed_json(gm, run, sim, shell, tmp_path) -> None:
    path = tmp_path / "t.json.gz"
    result, _ = run(f"%%gpumem_trace --no-plot --save {path}\nx = g.caching_allocator_alloc(MiB)")
    assert result.success
    trace = json.loads(gzip.decompress(path.read_bytes()))["device_traces"][0]
    assert [e["action"] for e in trace].count("alloc") == 1
    free_all(run, "x")


def test_trace_of_a_failing_cell_shows_then_reraises(gm, run, sim, shell) -> None:
    result, out = run("%%gpumem_trace -o t --no-plot\ny = g.caching_allocator_alloc(MiB)\n1/0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    t = shell.user_ns["t"]
    assert isinstance(t.error, ZeroDivisionError)
    assert [b.holders for b in t.surviving] == [("y",)]
    assert "raised ZeroDivisionError" in out.outputs[0].data["text/plain"]
    # the traceback shows the user's line, none of the magic's
    assert "1/0" in out.stdout and "ZeroDivisionError" in out.stdout
    assert "magics.py" not in out.stdout and "jupyter_gpumem" not in out.stdout, out.stdout
    free_all(run, "y")


@pytest.mark.parametrize("line", ["-o 1x", "--max-entries 0", "--save out.txt",
                                  "--save /no/such/folder/x.html", "--bogus",
                                  "--max-entries 99999999999999999999", "--max-entries -5",
                                  "--max-entries nan", "--max-entries ''", "--save 'x.html",
                                  "-o", "-o ''", "extra",
                                  # names the namespace keeps: -o __builtins__ replaced the
                                  # builtins, -o get_ipython broke every later magic
                                  "-o for", "-o __builtins__", "-o In", "-o Out", "-o _",
                                  "-o __", "-o _i1", "-o _ii", "-o _5", "-o __name__",
                                  "-o get_ipython", "-o exit", "-o _oh", "-o __foo__",
                                  "--output None",
                                  # checked only after the cell had run: an unwritable place,
                                  # a NUL character
                                  "--save /proc/gpumem-trace.json", "--save a\0b.json",
                                  "--save /proc/gpumem-trace.html"])
def test_trace_bad_arguments(gm, run, sim, line) -> None:
    before = state(sim)
    names = {k: id(v) for k, v in gm.shell.user_ns.items()}
    result, _ = run(f"%%gpumem_trace {line}\nz = g.caching_allocator_alloc(512)")
    assert isinstance(result.error_in_exec, UsageError)
    message = str(result.error_in_exec)
    assert "\n" not in message and message.endswith("(see %%gpumem_trace? for usage)"), message
    assert state(sim) == before  # the cell did not run
    assert "z" not in gm.shell.user_ns
    kept = {k: id(v) for k, v in gm.shell.user_ns.items() if k in names}
    changed = {k for k in names if kept.get(k) != names[k]}
    assert changed <= {"_i", "_ii", "_iii", "_ih", "In"} | {k for k in names if k[2:].isdigit()}


def test_trace_output_and_save_are_checked_before_the_cell_runs(gm, run, sim, tmp_path) -> None:
    """A folder with a snapshot's suffix, an unwritable place, a NUL, a keyword, a name the
    namespace keeps: each a one-line UsageError before the cell runs (they failed after it, or
    were taken)."""
    folder = tmp_path / "out.json"
    folder.mkdir()
    cell = "\nz = g.caching_allocator_alloc(512)"
    usage = " (see %%gpumem_trace? for usage)"
    for line, said in (
            (f"--save {folder}", f"--save: '{folder}' is a folder; give a file name in it"),
            ("--save /proc/gpumem-trace.json",
             "--save: cannot write '/proc/gpumem-trace.json': No such file or directory"),
            ("--save a\0b.json", "--save: a file name cannot hold a NUL character, got "
             "'a\\x00b.json'"),
            ("-o for", "-o takes a variable name, got the keyword 'for'"),
            ("-o __builtins__", "-o __builtins__: Python or IPython keeps that name for itself; "
             "choose another")):
        result, _ = run(f"%%gpumem_trace --no-plot {line}{cell}")
        assert str(result.error_in_exec) == said + usage
        assert "z" not in gm.shell.user_ns
    assert list(folder.iterdir()) == []
    assert gm.shell.user_ns["__builtins__"] is builtins
    result, _ = run(f"%%gpumem_trace --no-plot -o match --save {tmp_path / 'ok.json'}{cell}")
    assert result.success  # a soft keyword is a name; the file is written after the cell
    assert "match" in gm.shell.user_ns and (tmp_path / "ok.json").exists()
    free_all(run, "z")


def test_trace_plain_python(sim) -> None:
    import jupyter_gpumem as g

    with g.trace() as t:
        kept = g.caching_allocator_alloc(2 * MiB)
    assert isinstance(t, g.TraceResult)
    assert [(b.size, b.holders) for b in t.surviving] == [(2 * MiB, ("kept",))]
    assert not sim.recording  # history was off before: off again
    g.caching_allocator_delete(kept)


def test_trace_live_view_lifecycle(gm, run, sim) -> None:
    pytest.importorskip("anywidget")
    gm.settings.live_view = True
    result, out = run("%%gpumem_trace --no-plot\nw = g.caching_allocator_alloc(MiB)")
    assert result.success
    widget_view = "application/vnd.jupyter.widget-view+json"
    assert any(widget_view in o.data for o in out.outputs)
    assert not [t for t in threading.enumerate() if t.name == "jupyter_gpumem-sampler"]
    # stopped: a cell this quick leaves its live output as one line (the trace has it all)
    (static,) = [o for o in out.outputs if getattr(o, "update", False)]
    assert set(static.data) == {"text/plain", "text/html"}
    assert static.data["text/plain"].startswith("gpumem live view: ")
    assert static.data["text/plain"].endswith("the trace below has every event)")
    free_all(run, "w")


def test_footer_follows_a_usage_error_in_a_kernel() -> None:
    """In a real kernel the footer of ``%gpumem auto on`` comes after the cell's UsageError."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext jupyter_gpumem", "%gpumem device sim", "%gpumem auto on", "%gpumem bogus")]
    nbclient.NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True).execute()
    streams = [(o.name, o.text) for o in nb.cells[-1].outputs if o.output_type == "stream"]
    assert [name for name, _ in streams] == ["stderr", "stdout"], streams
    assert streams[0][1].startswith("UsageError: unknown subcommand 'bogus'")
    assert streams[1][1].startswith("gpumem [4]: Δallocated 0 B")


def test_load_of_a_trace_its_snapshot_contradicts_is_one_line(gm, run, tmp_path) -> None:
    """An alloc and free with no segment: the layout at the peak has no segment for the block
    (it raised ValueError, naming neither the file nor the event)."""
    path = tmp_path / "no_segment.json"
    path.write_text(json.dumps({"segments": [], "device_traces": [[
        {"action": action, "addr": 0x1000, "size": 512, "stream": 0, "time_us": t, "frames": []}
        for t, action in enumerate(("alloc", "free_requested", "free_completed"))]]}))
    result, _ = run(f"%gpumem load {path}")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == (
        f"%gpumem load: {path}: device_traces[0][2]: block 0x1000 lies in no segment (the trace "
        "and the snapshot disagree)")
