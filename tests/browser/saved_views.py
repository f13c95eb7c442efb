"""Helpers of the browser and nbconvert tests: the saved notebook with our outputs, its payloads,
and a JupyterLab server.

The notebook runs a workload on the simulated device under ``%%gpumem_trace`` and then a bare
``%gpumem``, executed by nbclient and saved with its outputs, the kernel shut down. Every expected
number comes from the saved view payloads (MIME type ``application/vnd.jupyter-gpumem.trace+json``),
and the ones that matter are checked again against the same workload run in this process.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
MIME = "application/vnd.jupyter-gpumem.trace+json"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
NO_NEWS = {"@jupyterlab/apputils-extension:notification":
           {"checkForUpdates": False, "fetchNews": "false"}}

#: The kernelspec the saved notebook names: no such kernel exists and no kernel speaks its
#: language (the notebook keeps no ``language_info``), so opening it starts none; the "select a
#: kernel" dialog that JupyterLab and Notebook 7 then show is answered "No Kernel"
#: (``open_without_kernel``), and the tests check that the server never started a kernel.
NO_KERNEL = {"name": "gpumem-no-such-kernel", "display_name": "No kernel",
             "language": "gpumem-no-such-language"}

#: The workload, run in the notebook's kernel and (for the expected counts) in this process.
#: The last allocation is far larger than the rest, so the peak is one clear event.
WORKLOAD = """\
MiB = 1 << 20

def run(a):
    weights = [a.malloc(n) for n in (96 * MiB, 32 * MiB, 4 * MiB)]
    scratch = []
    for step in range(4):
        acts = [a.malloc((6 + step) * MiB) for _ in range(4)]
        small = [a.malloc(200 * 1024) for _ in range(9)]
        for p in small[::3]:
            a.free(p)
        scratch.append(small)
        for p in acts:
            a.free(p)
    spike = a.malloc(700 * MiB)
    a.free(spike)
    return weights, scratch
"""

#: Lines of WORKLOAD (1-based, as a frame in the cell names them) that allocate.
ALLOCATING_LINES = {n for n, line in enumerate(WORKLOAD.splitlines(), 1) if "a.malloc(" in line}

CELLS = [
    "%load_ext jupyter_gpumem\n%gpumem device sim",
    WORKLOAD,
    "%%gpumem_trace\nimport jupyter_gpumem as gm\nkept = run(gm.get_allocator())",
    "%gpumem",
]
TRACE_CELL = 2
STATUS_CELL = 3


def need(what: str, ok: bool) -> None:
    """Skip without ``what``; under ``CI=true`` fail instead."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing, and CI needs the browser tests")
    pytest.skip(f"{what} is not installed")


def need_browser() -> None:
    need("chromium", Path(CHROMIUM).exists())
    need("playwright", importlib.util.find_spec("playwright") is not None)


def wait_for_kernel(page: Any) -> None:
    """Wait until the open notebook's kernel has started."""
    page.wait_for_function(
        "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel",
        timeout=60_000)


def run_all(page: Any) -> None:
    """Run every cell, without waiting for them (the command's promise ends with the run)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


#: An output that holds a widget view.
WIDGET = "[data-mime-type='application/vnd.jupyter.widget-view+json']"


def open_and_run(page: Any, url: str, name: str) -> None:
    """Open notebook ``name`` in JupyterLab at ``url``, wait for its kernel, run every cell."""
    page.goto(f"{url}/lab/tree/{name}?reset")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)
    run_all(page)


def live_view(page: Any, cell: Any, samples: int = 3) -> Any:
    """The live widget view in ``cell``, once it has drawn ``samples`` samples."""
    live = cell.locator(f"{WIDGET} div.gm-view[data-kind=live]")
    live.wait_for(timeout=90_000)
    page.wait_for_function(
        "([sel, n]) => Number(document.querySelector(sel)?.dataset.samples) >= n",
        arg=[f"{WIDGET} div.gm-view[data-kind=live]", samples], timeout=30_000)
    return live


def notebook_json(*sources: str, kernelspec: dict[str, str] | None = None) -> dict[str, Any]:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"cell{i}", "metadata": {},
              "outputs": [], "source": source} for i, source in enumerate(sources)]
    spec = kernelspec or {"display_name": "Python 3", "language": "python", "name": "python3"}
    return {"cells": cells, "metadata": {"kernelspec": spec},
            "nbformat": 4, "nbformat_minor": 5}


def kernel_env() -> dict[str, str]:
    """The environment of a kernel or server started here: this checkout first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def execute_saved_notebook(path: Path, cells: list[str] | None = None) -> dict[str, Any]:
    """Run ``cells`` (default CELLS) in a fresh python3 kernel with nbclient, shut it down, and
    save the notebook with its outputs under ``path``, naming a kernelspec that does not exist
    (NO_KERNEL). The widget state is not stored, as JupyterLab saves by default."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.from_dict(notebook_json(*(CELLS if cells is None else cells)))
    with _environ(kernel_env()):
        client = NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}},
                                store_widget_state=False)
        client.execute()  # starts the kernel, runs every cell, shuts the kernel down
    assert client.kc is None and client.km is None  # the kernel is gone
    for i, cell in enumerate(nb.cells):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"cell {i} raised: {errors}"
    nb.metadata["kernelspec"] = dict(NO_KERNEL)
    nb.metadata.pop("language_info", None)  # JupyterLab starts a kernel of its language otherwise
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, str(path))
    saved: dict[str, Any] = json.loads(path.read_text())
    return saved


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    old = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(old)


# -- the saved payloads -------------------------------------------------------------------------


def copy_without_kernel(nb: dict[str, Any], root: Path, stem: str) -> str:
    """``nb`` naming a kernelspec that starts none, under a unique name in the server's folder
    ``root``; its URL-quoted name."""
    import uuid
    from urllib.parse import quote

    opened = {**nb, "metadata": {**nb["metadata"], "kernelspec": dict(NO_KERNEL)}}
    opened["metadata"].pop("language_info", None)
    name = f"{stem} {uuid.uuid4().hex[:8]}.ipynb"
    (root / name).write_text(json.dumps(opened))
    return quote(name)


def payloads(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """The view payloads among a saved cell's outputs, in order."""
    return [o["data"][MIME] for o in cell.get("outputs", [])
            if isinstance(o.get("data"), dict) and MIME in o["data"]]


def column(col: dict[str, Any]) -> list[float]:
    """A payload column (base64 of little-endian values, as saved) as a list."""
    import array

    typecode = {"f8": "d", "i4": "i", "u1": "B"}[col["dtype"]]
    values = array.array(typecode)
    values.frombytes(base64.b64decode(col["data"]))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def blocks_after(payload: dict[str, Any], k: int) -> int:
    """Allocated blocks in the layout after event ``k``: block lives with start <= k < end."""
    blocks = payload["lives"]["blocks"]
    starts, ends = column(blocks["start"]), column(blocks["end"])
    return sum(1 for s, e in zip(starts, ends, strict=True) if s <= k < e)


def block_life(payload: dict[str, Any], i: int) -> dict[str, Any]:
    """Block life ``i`` of the payload: its size and its stack's frames."""
    blocks = payload["lives"]["blocks"]
    size = column(blocks["size"])[i]
    stack = int(column(blocks["stack"])[i])
    frames = payload["stacks"][stack] if stack >= 0 else []
    return {"size": size, "frames": frames}


#: In the page: the pixels of the timeline's peak label that a curve's stroke or the peak mark
#: covers, as "x,y" strings (a 1 px grid over the label's box, in the SVG's own units).
_PEAK_LABEL_HITS = """svg => {
  const label = svg.querySelector('text.gm-peak-label');
  if (!label) { return ['no peak label']; }
  const b = label.getBBox();
  const hits = [];
  for (const el of svg.querySelectorAll('path.gm-curve, circle.gm-peak-mark')) {
    for (let x = Math.floor(b.x); x <= b.x + b.width; x++) {
      for (let y = Math.floor(b.y); y <= b.y + b.height; y++) {
        const p = new DOMPoint(x, y);
        if (el.isPointInStroke(p) || (el.tagName === 'circle' && el.isPointInFill(p))) {
          hits.push(`${el.getAttribute('class')} ${x},${y}`);
        }
      }
    }
  }
  return hits;
}"""


def peak_label_hits(view: Any) -> list[str]:
    """Where a curve or the peak mark runs under the trace timeline's peak label (none: it reads
    clear of them)."""
    hits: list[str] = view.locator("svg.gm-timeline").first.evaluate(_PEAK_LABEL_HITS)
    return hits


def workload_counts() -> tuple[int, int]:
    """The allocated blocks at the end of WORKLOAD and at its peak, from a run in this process."""
    from jupyter_gpumem import CachingAllocator, SimulatedDevice

    a = CachingAllocator(SimulatedDevice(16 << 30))
    live: set[int] = set()
    best = (-1, 0)  # (allocated, live blocks) at the first highest point

    class Watch:
        def malloc(self, n: int) -> int:
            p = a.malloc(n)
            live.add(p)
            nonlocal best
            if a.memory_allocated() > best[0]:
                best = (a.memory_allocated(), len(live))
            return p

        def free(self, p: int) -> None:
            a.free(p)
            live.discard(p)

    scope: dict[str, Any] = {}
    exec(WORKLOAD, scope)
    kept = scope["run"](Watch())
    assert kept
    end = sum(1 for s in a.snapshot()["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated")
    assert end == len(live)
    return end, best[1]


# -- a JupyterLab server ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _this_labextension(tmp_path: Path) -> dict[str, str]:
    """``JUPYTER_PATH`` that puts this checkout's built lab extension first, where it is built
    (an installed one elsewhere may be another checkout's build)."""
    built = ROOT / "jupyter_gpumem" / "labextension"
    if not (built / "package.json").exists():
        return {}
    data = tmp_path / "jupyter-path"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "jupyter-gpumem").symlink_to(built, target_is_directory=True)
    paths = [str(data), os.environ.get("JUPYTER_PATH", "")]
    return {"JUPYTER_PATH": os.pathsep.join(filter(None, paths))}


@contextlib.contextmanager
def jupyter_server(tmp_path: Path, overrides: dict[str, Any] | None = None
                   ) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server (with Notebook 7 where installed) on a free port, in its own dirs, with
    the settings ``overrides`` (plugin id -> settings) beside NO_NEWS; stopped by its PID
    afterwards. Yields its URL and its root folder."""
    need("jupyterlab", importlib.util.find_spec("jupyterlab") is not None)
    settings = tmp_path / "app-settings"
    settings.mkdir()
    (settings / "overrides.json").write_text(json.dumps({**NO_NEWS, **(overrides or {})}))
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    env = {**kernel_env(),
           **_this_labextension(tmp_path),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    port = _free_port()
    log_path = tmp_path / "lab.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
         "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--ServerApp.root_dir={notebooks}", f"--LabApp.app_settings_dir={settings}",
         "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=notebooks)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if server.poll() is not None:
                pytest.fail(f"jupyter lab exited: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("jupyter lab did not answer within a minute")
        yield url, notebooks
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def running_kernels(url: str) -> list[Any]:
    """The server's kernels and sessions: empty while no kernel was ever started."""
    found: list[Any] = []
    for api in ("kernels", "sessions"):
        with urllib.request.urlopen(f"{url}/api/{api}", timeout=10) as r:
            found += json.loads(r.read())
    return found


def launch(pw: Any) -> Any:
    need_browser()
    return pw.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM,
                              args=CHROMIUM_FLAGS)


@contextlib.contextmanager
def browser_page(shot: str | None, width: int = 1300, height: int = 1600) -> Iterator[Any]:
    """A Chromium page of ``width`` × ``height``; with ``shot``, a screenshot of the whole page
    to ``ARTIFACTS / shot`` when the block ends, passed or failed."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            try:
                yield page
            finally:
                if shot is not None:
                    page.screenshot(path=str(ARTIFACTS / shot))
        finally:
            browser.close()


def open_without_kernel(page: Any, address: str) -> None:
    """Open a saved notebook (naming NO_KERNEL) and answer the kernel dialog "No Kernel"."""
    page.goto(address)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    dialog = page.locator(".jp-Dialog")
    with contextlib.suppress(Exception):
        dialog.wait_for(state="visible", timeout=15_000)
    if dialog.count():
        dialog.get_by_role("button", name="No Kernel").click()
        dialog.wait_for(state="detached", timeout=15_000)
