"""``bench/torch_whatif_check.py`` (run on the H200) in its dry run: a fake ``torch`` whose device
is mostly held outside PyTorch; every check passes, and the checks fail when the notebook's
report or the fresh run disagrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "torch_whatif_check.py"


def _module():
    return load_script(SCRIPT)


def test_dry_run_passes_and_wrong_figures_fail(tmp_path, monkeypatch) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "11 passed, 0 failed (dry run)" in proc.stdout
    module = _module()
    nb = nbformat.read(str(tmp_path / "torch_whatif.ipynb"), as_version=4)
    assert all(ok for ok, _ in module.check(nb, True))
    # a replay on the whole device (what a naive replay does) is caught
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out["text"].startswith("REPORT "):
                report = json.loads(out["text"][len("REPORT "):])
                report["capacity"] *= 4
                out["text"] = "REPORT " + json.dumps(report) + "\n"
    failed = [text for ok, text in module.check(nb, True) if not ok]
    assert len(failed) == 1 and failed[0].startswith("the replayed device is what PyTorch")
    # a suggestion that does not fit when run is caught
    monkeypatch.setattr(module, "fresh_run", lambda config, dry: ("oom", 0))
    failed = [text for ok, text in module.check(nb, True) if not ok]
    assert any(text.startswith("a fresh run under PYTORCH_CUDA_ALLOC_CONF=") for text in failed)
