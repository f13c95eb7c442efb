"""``bench/bench_expandable.py --dry-run``: every part it can run on the simulated device.

The GPU run happens once, on the lent machine; this proves the script's plumbing here, and that
program (a) is built as the issue asks: the default policy runs out of memory under its limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from script_module import load_script

from jupyter_gpumem import AllocatorConfig

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_expandable.py"


def _module() -> Any:
    return load_script(SCRIPT)


def _has_expandable_key() -> bool:
    try:
        AllocatorConfig(expandable_segments=True)  # type: ignore[call-arg]
    except TypeError:
        return False
    return True


def test_dry_run_tables_json_and_the_default_oom_on_a(tmp_path, capsys) -> None:
    bench = _module()
    out = tmp_path / "exp.json"
    assert bench.main(["--dry-run", "--out", str(out), "--loops", "200", "--rounds", "2"]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    cols = data["columns"]
    a = cols["ours_default"]["programs"]["a"]
    b = cols["ours_default"]["programs"]["b"]
    # (a) needs more than the limit under the default policy, and far more with no limit
    assert a["oom"] and not a["oom_nocap"]
    assert a["peak_reserved"] > 2 * bench.CAP_A
    assert a["peak_reserved_capped"] <= bench.CAP_A
    assert b["oom"] and not b["oom_nocap"]
    assert "PASS: (a) the default policy runs out of memory" in text
    assert "| OOM under the limit | - | OOM |" in text
    for label, _ in bench.COST_SIZES:
        assert cols["ours_default"]["cost"][label]["ours_default"] > 0
    for column in ("cupy_pool", "torch_default", "torch_expandable"):
        assert cols[column]["skipped"].startswith("dry run")
    if _has_expandable_key():
        e = cols["ours_expandable"]
        assert "programs" in e and "cost" in e, e
        assert "ours-expandable peak reserved / ours-default" in text
    else:
        assert "no expandable_segments key yet" in cols["ours_expandable"]["skipped"]
        assert "ours expandable: this engine has no expandable_segments key yet" in text
    assert "FAILED" not in text


def test_program_a_pins_each_freed_buffer_segment_alone() -> None:
    bench = _module()
    largest = bench.A_BASE + (bench.A_STEPS - 1) * bench.A_GROW
    assert largest < 2 * bench.A_PIN  # two tensors never share one buffer's segment
    ops = bench.program_growing()
    live: dict[int, int] = {}
    peak = 0
    for op, slot, size in ops:
        if op == "alloc":
            live[slot] = size
        else:
            del live[slot]
        peak = max(peak, sum(live.values()))
    assert peak < bench.CAP_A  # the program itself fits: only fragmentation can make it fail


def test_a_failing_section_is_reported_and_the_run_goes_on(tmp_path, capsys,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _module()

    def broken(*args: Any) -> Any:
        raise RuntimeError("cost measurement broke")

    monkeypatch.setattr(bench, "measure_cost", broken)
    out = tmp_path / "exp.json"
    assert bench.main(["--dry-run", "--out", str(out), "--loops", "100", "--rounds", "1"]) == 0
    text = capsys.readouterr().out
    assert "ours_default cost: FAILED" in text and "cost measurement broke" in text
    data = json.loads(out.read_text())
    assert data["columns"]["ours_default"]["programs"]["a"]["oom"]  # later sections ran
    assert "ours default cost_error: RuntimeError: cost measurement broke" in text
