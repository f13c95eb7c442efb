"""What JupyterLab saves of our widgets: a notebook run in headless Chromium and saved with
JupyterLab's save command, with "Save Widget State Automatically" off (its default) and on.

The notebook shows a traced cell (its live widget closed when the cell ends), a bare ``%gpumem``
(its live view still running), a cluster view stopped and one still running (synthetic workers).
Saved, every output keeps its fallback (``notebook_checks``); with the setting off there is no
widget metadata; with it on, the state of exactly the widgets still shown (and their layouts):
the closed ones are gone from the browser's widget manager, so they are not saved.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from notebook_checks import WIDGET_STATE, notebook_problems, referenced_models
from saved_views import (
    WIDGET,
    WORKLOAD,
    browser_page,
    jupyter_server,
    need_browser,
    notebook_json,
    open_and_run,
)

pytestmark = pytest.mark.browser

CELLS = (
    "%load_ext jupyter_gpumem\n%gpumem device sim",
    WORKLOAD,
    "%%gpumem_trace\nimport jupyter_gpumem as gm\nkept = run(gm.get_allocator())",
    "%gpumem",
    "from tests.browser.synthetic_cluster import prefilled_view\n"
    "stopped = prefilled_view(30, 8)\n_ = stopped.start()\nstopped.stop()",
    "running = prefilled_view(30, 8)\n_ = running.start()",
    "print('all ran')",
)
#: Cells whose outputs still show a widget when the notebook is saved.
RUNNING = (3, 5)
SAVE_STATE = {"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}}


def _run_and_save(url: str, root: Path, shot: str) -> dict[str, Any]:
    """Run CELLS in JupyterLab, save with JupyterLab's own command; the file it wrote."""
    name = f"gpumem-state-{uuid.uuid4().hex[:8]}.ipynb"
    path = root / name
    path.write_text(json.dumps(notebook_json(*CELLS)))
    with browser_page(shot) as page:
        open_and_run(page, url, name)
        page.wait_for_selector(".jp-OutputArea-output:has-text('all ran')", timeout=120_000)
        page.wait_for_function(f"() => document.querySelectorAll(\"{WIDGET}\").length === 2",
                               timeout=60_000)  # the two views still running, drawn
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        deadline = time.monotonic() + 60
        while True:
            saved: dict[str, Any] = json.loads(path.read_text())
            if any(c.get("outputs") for c in saved["cells"]):
                return saved
            assert time.monotonic() < deadline, "JupyterLab did not save the notebook"
            time.sleep(0.2)


def _check_outputs(nb: dict[str, Any]) -> None:
    assert notebook_problems(nb) == []
    shown = [i for i, c in enumerate(nb["cells"]) for o in c["outputs"]
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert tuple(shown) == RUNNING  # the traced cell's and the stopped view's became pictures
    pictures = [i for i, c in enumerate(nb["cells"]) for o in c["outputs"]
                if "image/png" in o.get("data", {})]
    assert set(pictures) == {2, 3, 4, 5}


def test_jupyterlab_saves_no_widget_state_by_default(lab: tuple[str, Path]) -> None:
    need_browser()
    nb = _run_and_save(*lab, "widget-state-default.png")
    _check_outputs(nb)
    assert "widgets" not in nb["metadata"]


def test_jupyterlab_saves_the_state_of_the_widgets_still_shown(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    need_browser()
    with jupyter_server(tmp_path_factory.mktemp("lab-state"), SAVE_STATE) as (url, root):
        nb = _run_and_save(url, root, "widget-state-saved.png")
    _check_outputs(nb)
    state = nb["metadata"]["widgets"][WIDGET_STATE]["state"]
    ours = {m for m, s in state.items() if s["model_name"] == "AnyModel"}
    assert ours == referenced_models(nb) and len(ours) == 2
    layouts = {m for m, s in state.items() if s["model_name"] == "LayoutModel"}
    assert set(state) == ours | layouts and len(layouts) == 2
