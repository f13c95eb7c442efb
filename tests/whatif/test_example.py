"""The saved ``examples/whatif.ipynb`` says what a fresh replay of its own workload says.

Its workload cell and the call that runs out of memory are run here, in this process, on a
simulated device of the size the notebook asks for (no kernel); the verdict of ``suggest_config``
and the rows of ``compare`` under the notebook's ``--config`` values must be the saved ones. A
change to the allocator or the replay that changes the story fails here until the example is
refreshed (``python examples/refresh.py whatif.ipynb``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpumem import AllocatorConfig, OutOfMemoryError
from jupyter_gpumem.data.units import parse_bytes
from jupyter_gpumem.whatif.compare import compare, suggest_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "whatif.ipynb"


def _source(cell: dict[str, Any]) -> str:
    return "".join(cell["source"])


def _plain(cell: dict[str, Any]) -> str:
    return "\n".join("".join(o["data"]["text/plain"]) for o in cell["outputs"]
                     if "text/plain" in o.get("data", {}))


def _code(nb: dict[str, Any], start: str) -> list[dict[str, Any]]:
    return [c for c in nb["cells"] if c["cell_type"] == "code" and _source(c).startswith(start)]


def _rows(text: str) -> list[str]:
    """The table rows of a comparison's text (the lines under its header)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("config "))
    return [line for line in lines[header + 1:] if line.startswith("  ")]


@pytest.fixture
def replayed() -> tuple[dict[str, Any], Any]:
    """The saved notebook, and the snapshot of its workload run here up to its OOM."""
    from jupyter_gpumem.runtime import registry

    nb = json.loads(EXAMPLE.read_text())
    (setup,) = _code(nb, "%load_ext jupyter_gpumem")
    capacity = parse_bytes(re.search(r"--capacity (\S+)", _source(setup)).group(1))
    assert "%gpumem history on" in _source(setup)
    (workload,) = _code(nb, "import jupyter_gpumem as g")
    (failing,) = [c for c in nb["cells"]
                  if any(o["output_type"] == "error" for o in c.get("outputs", []))]
    (allocator,) = registry.use_simulated_device(capacity, fresh=True)
    scope: dict[str, Any] = {}
    try:
        allocator.record_history(True, stacks=False)
        exec(_source(workload), scope)
        with pytest.raises(OutOfMemoryError):
            exec(_source(failing), scope)
        snapshot = allocator.snapshot()
    finally:
        for p in scope.get("weights", []):
            allocator.free(p)
        allocator.record_history(False)
        allocator.empty_cache()
        registry.use_cuda()
    return nb, snapshot


def test_saved_suggestion_is_a_fresh_replays(replayed: tuple[dict[str, Any], Any]) -> None:
    nb, snapshot = replayed
    (cell,) = _code(nb, "%gpumem replay last --suggest")
    saved = _plain(cell).splitlines()
    found = suggest_config(snapshot)
    assert found.improves
    assert found.lines()[0] == saved[0]
    assert f"%gpumem config {found.change_text}" in _source(_code(nb, "%gpumem config")[0])
    assert _rows(found.text()) == _rows(_plain(cell))


def test_saved_comparison_is_a_fresh_replays(replayed: tuple[dict[str, Any], Any]) -> None:
    nb, snapshot = replayed
    (cell,) = _code(nb, "%gpumem replay last --config")
    configs = re.findall(r"--config\s+(\S+)", _source(cell))
    fresh = compare(snapshot, [AllocatorConfig() if c == "defaults" else c for c in configs])
    assert [r.fits for r in fresh.results] == [False, True, True]
    assert _rows(fresh.text()) == _rows(_plain(cell))
