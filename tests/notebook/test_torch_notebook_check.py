"""``bench/torch_notebook_check.py`` (run on the H200) in its dry run: the same notebook on a
fake ``torch`` and a simulated device, executed by nbclient; every check passes, and a check
fails when the notebook's numbers disagree."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "torch_notebook_check.py"


def _module():
    return load_script(SCRIPT)


def _failures(module, nb) -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        results = module.check(nb).results
    return [text for ok, text in results if not ok]


def test_dry_run_passes_and_a_wrong_number_fails(tmp_path) -> None:
    out = tmp_path / "dry.ipynb"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = out.with_suffix(".report.txt").read_text()
    assert "FAIL" not in report and ", 0 failed (dry run)" in report
    for what in ("OOM panel: allocated", "live view: allocated samples",
                 "both: cupy ledger Δallocated", "both: torch footer Δallocated",
                 "status line under both sources: two rows", "trace band 'gradients'",
                 "trace band 'freed during the trace'", "trace bands sum to allocated"):
        assert f"PASS {what}" in report

    module = _module()
    nb = nbformat.read(out, as_version=4)
    assert _failures(module, nb) == []
    index = {c.metadata.get("name"): i for i, c in enumerate(nb.cells)}
    wrong = copy.deepcopy(nb)  # the panel prints other figures than memory_stats()
    for o in wrong.cells[index["oom"]].outputs:
        if o.output_type == "display_data":
            o.data["text/plain"] = o.data["text/plain"].replace(" allocated, ", "0 allocated, ")
    assert [f for f in _failures(module, wrong) if f.startswith("OOM panel prints")]
    wrong = copy.deepcopy(nb)  # the trace's bands by site: no gradients band
    for o in wrong.cells[index["trace"]].outputs:
        payload = o.get("data", {}).get(module.MIME_TYPE)
        if isinstance(payload, dict) and payload.get("kind") == "trace":
            payload["timeline"]["band_labels"] = ["x.py:1"] * len(payload["timeline"]["bands"])
    assert [f for f in _failures(module, wrong) if f.startswith("trace band 'gradients'")]
    wrong = copy.deepcopy(nb)  # no live view under the traced cell
    wrong.cells[index["trace"]].outputs = []
    assert [f for f in _failures(module, wrong) if "live view output shown" in f]
