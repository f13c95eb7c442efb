"""``python -m jupyter_gpumem demo``: its story, told with the allocator's own numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from jupyter_gpumem.__main__ import main
from jupyter_gpumem.data.files import load_snapshot
from jupyter_gpumem.data.intervals import live_intervals
from jupyter_gpumem.data.ranking import top_sites
from jupyter_gpumem.data.sites import site_of
from jupyter_gpumem.data.timeline import build_timeline, peak_index
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.demo import SIM_CAPACITY, WORKLOAD, WORKLOAD_FILE, run_demo, story
from jupyter_gpumem.devices.cupy_device import cuda_unavailable_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("JUPYTER_GPUMEM_ALLOC_CONF", None)
    return subprocess.run([sys.executable, "-m", "jupyter_gpumem", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def workload_line(text: str) -> int:
    """The line of WORKLOAD that holds ``text``."""
    (line,) = [i for i, code in enumerate(WORKLOAD.splitlines(), 1) if text in code]
    return line


def section(out: str, title: str) -> list[str]:
    """The lines of the paragraph of ``out`` that starts with ``title``."""
    (part,) = [p for p in out.split("\n\n") if p.startswith(title)]
    return part.splitlines()


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "trace.json.gz"
    proc = demo("demo", "--device", "sim", "--save", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout, path, load_snapshot(path)


def test_the_story_says_it_runs_on_the_simulated_device(saved_run) -> None:
    out, _, _ = saved_run
    assert out.splitlines()[0] == (
        f"Running on a simulated {format_bytes(SIM_CAPACITY)} device, as asked.")


def test_the_phases_add_up_to_the_allocators_counters(saved_run) -> None:
    out, _, snap = saved_run
    stats = snap["jupyter_gpumem"]["stats"]
    lines = section(out, "The workload")
    labels = [line.split("  ")[1] for line in lines[1::2]]
    assert labels == ["weights", "steps 1-5", "steps 6-10", "steps 11-15", "steps 16-20"]
    numbers = lines[2::2]
    allocs = [int(line.split()[0]) for line in numbers]
    assert sum(allocs) == stats["allocation.all.allocated"]
    new_segments = [int(line.split(", ")[2].split()[0]) for line in numbers]
    assert sum(new_segments) == stats["segment.all.allocated"]
    assert numbers[-1].endswith(f"→  {format_bytes(stats['allocated_bytes.all.current'])} / "
                                f"{format_bytes(stats['reserved_bytes.all.current'])}")
    assert "each: 4 × 96 MiB activations, a 64 MiB workspace, a 4 MiB loss" in lines[-2]


def test_the_summary_is_the_allocators(saved_run) -> None:
    out, _, snap = saved_run
    s = snap["jupyter_gpumem"]["stats"]
    lines = section(out, "Summary at the end")
    assert lines[0] == (
        f"Summary at the end: {format_bytes(s['allocated_bytes.all.current'])} allocated "
        f"(peak {format_bytes(s['allocated_bytes.all.peak'])}), "
        f"{format_bytes(s['reserved_bytes.all.current'])} reserved "
        f"(peak {format_bytes(s['reserved_bytes.all.peak'])})")
    assert lines[1].startswith(f"  in {s['segment.all.current']} segments; "
                               f"{s['num_alloc_retries']} alloc retries, {s['num_ooms']} OOMs")
    cached = s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]
    idle = [seg for seg in snap["segments"] if seg["allocated_size"] == 0]
    text = " ".join(line.strip() for line in lines[2:])
    assert text.startswith(f"{format_bytes(cached)} of the reserved bytes are cached free")
    assert (f"{len(idle)} segments ({format_bytes(sum(g['total_size'] for g in idle))}) "
            "hold nothing live") in text
    assert "memory_summary table" not in out and "|===" not in out  # only with --full


def test_the_peak_is_named_by_the_workloads_lines(saved_run) -> None:
    out, _, snap = saved_run
    tl = build_timeline(snap)
    peak = peak_index(tl)
    lines = section(out, "Where the peak came from")
    assert lines[0].startswith(
        f"Where the peak came from: {format_bytes(int(tl.allocated.max()))} allocated after "
        f"event {peak} of {len(tl)}")
    uses = top_sites(tl, live_intervals(tl), peak, 5)
    assert len(lines) == 1 + len(uses)
    code = WORKLOAD.splitlines()
    for use, line in zip(uses, lines[1:], strict=True):
        filename, _, number = use.site.rpartition(":")
        assert filename == WORKLOAD_FILE
        text = code[int(number) - 1].split("  #")[0].strip()
        assert line.startswith(f"  {format_bytes(use.bytes):>9} in {use.count:>2} block")
        assert line.endswith(f"line {number:>2}: {text}")
    # the weights' line tops the list, then the activations of the last, largest batches
    assert [int(u.site.rpartition(":")[2]) for u in uses[:2]] == [
        workload_line("weights = ["), workload_line("activations = [")]


def test_what_is_left_is_named_with_its_holder(saved_run) -> None:
    out, _, snap = saved_run
    live = [b for seg in snap["segments"] for b in seg["blocks"]
            if b["state"] == "active_allocated"]
    by_line = Counter(site_of(b["frames"]) for b in live)
    losses = by_line[f"{WORKLOAD_FILE}:{workload_line('loss = empty(')}"]
    weights = by_line[f"{WORKLOAD_FILE}:{workload_line('weights = [')}"]
    assert losses + weights == len(live) == snap["jupyter_gpumem"]["stats"][
        "allocation.all.current"]
    size = {site_of(b["frames"]): b["size"] for b in live}
    lines = section(out, "Still live at the end")
    loss_size = size[f"{WORKLOAD_FILE}:{workload_line('loss = empty(')}"]
    weight_size = size[f"{WORKLOAD_FILE}:{workload_line('weights = [')}"]
    assert lines[1:] == [
        f"  {format_bytes(weights * weight_size):>9}  line  2: "
        "weights = [empty(128 * MiB) for _ in range(LAYERS)]",
        f"  {'':>9}  held by `weights` (list of {weights} × {format_bytes(weight_size)})",
        f"  {format_bytes(losses * loss_size):>9}  line {workload_line('loss = empty('):>2}: "
        "loss = empty(4 * MiB)",
        f"  {'':>9}  held by `losses` (list of {losses} × {format_bytes(loss_size)})",
    ]
    assert losses == 20  # one per step: the leak


def test_the_next_commands_work_on_the_saved_trace(saved_run) -> None:
    out, path, _ = saved_run
    lines = section(out, "Next, in a notebook")
    for command in ("%load_ext jupyter_gpumem", "%%gpumem_trace", "%gpumem cells"):
        assert any(line.strip().startswith(command) for line in lines)
    assert f"  python -m jupyter_gpumem render {path} -o trace.html" in lines
    assert f"  python -m jupyter_gpumem summary {path}" in lines
    summary = demo("summary", str(path))
    assert summary.returncode == 0, summary.stderr
    assert "top sites at the peak:" in summary.stdout
    assert f"{WORKLOAD_FILE}:{workload_line('weights = [')}" in summary.stdout


def test_the_simulated_run_is_the_same_every_time(saved_run) -> None:
    # in this process, with the saved file's process: same story, same trace, same clock
    out, path, snap = saved_run
    run = run_demo("sim")
    assert story(run, saved=str(path)) == out
    assert run.stats == snap["jupyter_gpumem"]["stats"]
    fields = ("action", "addr", "size", "time_us")
    here = [tuple(e[k] for k in fields) for e in run.snapshot["device_traces"][0]]
    there = [tuple(e[k] for k in fields) for e in snap["device_traces"][0]]
    assert here == there and here[-1][3] > 0
    assert "snapshot" not in {e[0] for e in here}  # the demo's own read adds no event


def test_without_save_it_says_how_to_keep_the_trace(capsys) -> None:
    assert main(["demo", "--device", "sim"]) == 0
    out = capsys.readouterr().out
    assert section(out, "Next, in a notebook")[-2:] == [
        "Keep this run's trace with --save trace.json.gz, then:",
        "  python -m jupyter_gpumem render trace.json.gz -o trace.html"]


def test_full_adds_pytorchs_table(capsys) -> None:
    assert main(["demo", "--device", "sim", "--full"]) == 0
    out = capsys.readouterr().out
    summary, table, peak = out.index("Summary at the end"), out.index("|==="), out.index("Where")
    assert summary < table < peak  # the table comes with the summary
    assert "jupyter_gpumem memory summary, device ID 0" in out[table:peak]
    assert "GPU reserved segments" in out[table:peak]


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="a GPU is visible here")
def test_auto_without_a_gpu_says_why_and_simulates() -> None:
    proc = demo("demo")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [
        f"No GPU here: {cuda_unavailable_reason()}.",
        f"Running on a simulated {format_bytes(SIM_CAPACITY)} device instead."]


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="a GPU is visible here")
def test_cuda_without_a_gpu_exits_1_with_one_line() -> None:
    proc = demo("demo", "--device", "cuda")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == f"jupyter-gpumem: demo --device cuda: {cuda_unavailable_reason()}\n"


def test_save_where_it_cannot_write_is_one_line(tmp_path, capsys) -> None:
    target = tmp_path / "missing" / "t.json.gz"
    assert main(["demo", "--device", "sim", "--save", str(target)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"jupyter-gpumem: {target}: cannot write it: No such file or directory\n"


def test_demo_help_describes_the_options(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for words in ("--device {auto,sim,cuda}", "auto (default): cuda where there is a GPU, else sim",
                  "exit status 1 where there is none", "--full", "memory_summary table",
                  "--save PATH", "for the render and summary commands", "simulated GPU of 16 GiB"):
        assert words in out


def test_bad_device_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="device must be 'auto', 'sim' or 'cuda'"):
        run_demo("gpu")  # type: ignore[arg-type]


@pytest.mark.gpu
def test_on_a_gpu_the_workload_runs_through_cupy() -> None:
    import cupy

    run = run_demo("cuda")
    assert run.device_line.endswith(
        f"CuPy {cupy.__version__}: running the workload on it through our allocator.")
    text = story(run)
    assert "held by `losses` (list of 20 × 4.0 MiB)" in text
    assert "held by `weights` (list of 4 × 128 MiB)" in text
    lines = section(text, "Where the peak came from")
    assert lines[1].endswith("weights = [empty(128 * MiB) for _ in range(LAYERS)]")
