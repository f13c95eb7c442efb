"""The GPU memory side panel and the cell badges (issue 23), in headless Chromium: JupyterLab and
Notebook 7, on the simulated device.

- live in JupyterLab: while a cell runs, the panel's curve grows from samples the kernel pushes,
  and the browser sends the kernel nothing meanwhile; then a row a cell in its table, each
  cell's badge with the figures the ledger gives for the same cells run here, red after the OOM,
  the holders in its tooltip; the table sorts by a header click; a row click, and a click on a
  cell's span in the timeline, scroll the notebook to that cell; saved, each cell's metadata
  (``jupyter_gpumem``) and the notebook's are what a reader with nbformat gets
  (``lab-panel.png``, and ``docs/lab-panel.png`` with ``GPUMEM_README_SHOTS=1``);
- the saved notebook reopened with no kernel: the badges and the panel come back from the
  metadata, in JupyterLab (the dark theme too: ``lab-panel-dark.png``) and in Notebook 7, whose
  toolbar button opens the panel;
- Notebook 7 live: a cell's badge and the panel's row;
- the setting ``showBadges`` off: no badge, the panel still lists the cells.

Under ``CI=true`` a missing Chromium or playwright fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from saved_views import (
    ARTIFACTS,
    ROOT,
    browser_page,
    copy_without_kernel,
    need,
    need_browser,
    notebook_json,
    open_without_kernel,
    run_all,
    running_kernels,
    wait_for_kernel,
)

pytestmark = pytest.mark.browser

MiB = 1 << 20
PANEL = ".jp-GpumemPanel"
OPEN_PANEL = "() => window.jupyterapp.commands.execute('jupyter-gpumem:open-panel')"
TOOLBAR_BUTTON = "[data-command='jupyter-gpumem:open-panel']"

#: The cells' work on an 80 GiB simulated device; the second waits for the test (the busy cell),
#: the last asks for more than the device has.
WORK = [
    "import jupyter_gpumem as gm\nMiB = 1 << 20\nx = gm.caching_allocator_alloc(64 * MiB)",
    "ys = [gm.caching_allocator_alloc(256 * MiB) for _ in range(2)]",
    "t = gm.caching_allocator_alloc(512 * MiB)\ngm.caching_allocator_delete(t)",
    "big = gm.caching_allocator_alloc(100 << 30)  # more than the device has: OOM",
]
BUSY = 1  # the cell of WORK that runs until the test lets it end
OOM = 3
#: A markdown cell tall enough that the cells before it are out of view when it is.
FILLER = "\n\n".join(f"Filler paragraph {i}, so that the next cell is out of view."
                     for i in range(60))


def _helper(go: str) -> str:
    """The first cell: ``wait_until_told()``, which returns once the file ``go`` (in the
    notebook's folder) exists; tracebacks of one line (a picture shows no file paths)."""
    return ("%xmode Minimal\nimport pathlib, time\n\n"
            "def wait_until_told():\n    for _ in range(1200):\n"
            f"        if pathlib.Path({go!r}).exists():\n            return\n"
            "        time.sleep(0.05)")


LOAD = "%load_ext jupyter_gpumem\n%gpumem device sim"


def _notebook(go: str) -> dict[str, Any]:
    """The helper, the load, WORK (its second cell runs until ``go`` exists), and a tall
    markdown cell last."""
    busy = WORK[1] + "\nwait_until_told()  # runs until the test has watched the live panel"
    nb = notebook_json(_helper(go), LOAD, WORK[0], busy, WORK[2], WORK[3])
    nb["cells"].append({"cell_type": "markdown", "id": "filler", "metadata": {},
                        "source": FILLER})
    return nb


#: Positions in the notebook of the load, of the cells of WORK and of the tall markdown cell.
LOAD_AT, WORK_AT, FILLER_AT = 1, [2, 3, 4, 5], 6
#: The execution counts of the cells of WORK, as the table shows them.
COUNTS = ["[3]", "[4]", "[5]", "[6]"]


def _expected() -> list[dict[str, Any]]:
    """The ledger's figures for WORK, run here on a fresh simulated 80 GiB device, as the badge
    shows them: its text, and who holds what each cell left."""
    import jupyter_gpumem as gm
    from jupyter_gpumem.data.units import format_bytes, format_signed_bytes
    from jupyter_gpumem.notebook.advice import held_by
    from jupyter_gpumem.notebook.ledger import Ledger
    from jupyter_gpumem.runtime import registry

    registry.use_simulated_device(80 << 30, fresh=True)
    ns: dict[str, Any] = {}
    ledger = Ledger(namespace=lambda: ns)
    out = []
    try:
        for i, code in enumerate(WORK):
            with ledger.cell(i + 2, code), pytest.raises(Exception) if i == OOM else _nothing():
                exec(code, ns)
            row, cause = ledger.rows[-1], ledger.causes[-1]
            oom = f" · {row['ooms']} OOM" if row["ooms"] else ""
            out.append({"text": f"{format_signed_bytes(row['allocated_delta'])} · peak "
                                f"{format_bytes(row['peak_allocated'])}{oom}",
                        "holders": held_by(cause), "row": row})
    finally:
        for p in [ns.get("x"), *ns.get("ys", [])]:
            if p is not None:
                gm.caching_allocator_delete(p)
        registry.use_cuda()
    assert [e["row"]["ooms"] for e in out] == [0, 0, 0, 1]
    return out


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- in the page ----------------------------------------------------------------------------------

#: Records what the browser sends the notebook's kernel: ``window.__sent`` of [ms, type].
RECORD_SENT = """() => {
  window.__sent = [];
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  k.anyMessage.connect((_, a) => {
    if (a.direction === 'send') { window.__sent.push([Date.now(), a.msg.header.msg_type]); }
  });
}"""


def _points(page: Any) -> int:
    n = page.locator(f"{PANEL} svg.gm-timeline").first.get_attribute("data-points")
    return int(n or 0)


def _rows(page: Any) -> list[list[str]]:
    found: list[list[str]] = page.locator(
        f"{PANEL} table.jp-GpumemPanel-cells tbody tr").evaluate_all(
        "rs => rs.map(r => Array.from(r.cells).map(c => c.textContent))")
    return found


def _badges(page: Any) -> dict[int, str]:
    """Visible badges' texts, by the cell's position in the notebook."""
    got: dict[int, str] = {}
    cells = page.locator(".jp-Notebook .jp-Cell")
    for i in range(cells.count()):
        badge = cells.nth(i).locator(".jp-GpumemBadge:visible")
        if badge.count():
            got[i] = (badge.first.text_content() or "").strip()
    return got


def _in_view(page: Any, index: int) -> bool:
    """Whether the notebook's cell ``index`` is within the notebook's visible area."""
    return bool(page.evaluate("""i => {
      const nb = window.jupyterapp.shell.currentWidget.content;
      const cell = nb.widgets[i].node.getBoundingClientRect();
      const box = nb.node.getBoundingClientRect();
      return cell.top >= box.top - 1 && cell.top < box.bottom - 20;
    }""", index))


def _active(page: Any) -> int:
    return int(page.evaluate("() => window.jupyterapp.shell.currentWidget.content.activeCellIndex"))


def _scroll_to(page: Any, index: int = 0) -> None:
    """Make cell ``index`` active, at the top of the notebook's view."""
    page.evaluate("""i => { const nb = window.jupyterapp.shell.currentWidget.content;
      nb.activeCellIndex = i; nb.widgets[i].node.scrollIntoView({block: 'start'}); }""", index)
    page.wait_for_timeout(300)


#: Shuts down every session and kernel of the server, from the page (with its XSRF cookie).
SHUTDOWN = """async () => {
  const xsrf = decodeURIComponent((document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || '');
  const gone = m => ({method: 'DELETE', headers: {'X-XSRFToken': xsrf}});
  for (const s of await (await fetch('/api/sessions')).json()) {
    await fetch('/api/sessions/' + s.id, gone());
  }
  for (const k of await (await fetch('/api/kernels')).json()) {
    await fetch('/api/kernels/' + k.id, gone());
  }
}"""


def _wait_idle_kernel(url: str) -> None:
    """Until the server has a kernel, idle (Notebook 7 exposes no app to ask)."""
    import time
    import urllib.request

    for _ in range(600):
        with urllib.request.urlopen(f"{url}/api/kernels", timeout=10) as r:
            if any(k.get("execution_state") == "idle" for k in json.loads(r.read())):
                return
        time.sleep(0.1)
    raise AssertionError("no kernel became idle within a minute")


def _lightness(css_colour: str) -> float:
    parts = css_colour[css_colour.index("(") + 1:css_colour.index(")")].split(",")
    r, g, b = (float(p) for p in parts[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


# -- the live session, then saved -----------------------------------------------------------------

_SAVED: dict[str, Any] = {}


def _shot(page: Any, name: str, *, readme: bool = False) -> None:
    """The panel and a few cells: to test-artifacts, and with ``readme`` to docs/ too when
    GPUMEM_README_SHOTS=1."""
    box = page.locator("#jp-main-content-panel").bounding_box()
    clip = {"x": box["x"], "y": box["y"], "width": box["width"], "height": box["height"]}
    page.screenshot(path=str(ARTIFACTS / name), clip=clip)
    if readme and os.environ.get("GPUMEM_README_SHOTS") == "1":
        from PIL import Image  # matplotlib's: a palette of 256 colours keeps the file small

        with Image.open(ARTIFACTS / name) as shot:
            shot.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE).save(
                ROOT / "docs" / name, optimize=True)


def test_panel_and_badges_live_then_saved(lab: tuple[str, Path]) -> None:
    need_browser()
    url, root = lab
    expected = _expected()
    name = f"gpumem-panel-{uuid.uuid4().hex[:8]}.ipynb"
    go = f"go-{uuid.uuid4().hex[:8]}"
    (root / name).write_text(json.dumps(_notebook(go)))

    with browser_page("lab-panel-page.png", 1200, 780) as page:
        page.goto(f"{url}/lab/tree/{name}?reset")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        wait_for_kernel(page)
        page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
        page.evaluate(OPEN_PANEL)
        panel = page.locator(PANEL)
        panel.wait_for(timeout=30_000)
        page.evaluate(RECORD_SENT)
        run_all(page)

        # while the busy cell runs: its samples arrive, pushed; the browser sends nothing
        page.wait_for_function(
            f"() => document.querySelector('{PANEL}')?.dataset.status === 'connected'",
            timeout=90_000)
        busy = page.locator(".jp-Notebook .jp-Cell").nth(WORK_AT[BUSY])
        page.wait_for_function(
            "n => Number(document.querySelector('.jp-GpumemPanel svg.gm-timeline')"
            "?.dataset.points) >= n", arg=4, timeout=60_000)
        assert busy.locator(".jp-InputPrompt").first.text_content().strip() == "[*]:"
        start_ms = page.evaluate("() => Date.now()")
        before = _points(page)
        page.wait_for_timeout(2000)
        after = _points(page)
        end_ms = page.evaluate("() => Date.now()")
        prompt = busy.locator(".jp-InputPrompt").first
        assert prompt.text_content().strip() == "[*]:"  # still running
        assert after >= before + 2, (before, after)
        assert "a cell is running" in panel.locator(".jp-GpumemPanel-status").inner_text()
        sent = page.evaluate("() => window.__sent")
        during = [t for ms, t in sent if start_ms <= ms <= end_ms]
        assert during == [], during
        (root / go).touch()

        # every cell ran (the last one ends in an OOM): a row and a badge a cell
        page.locator(".jp-Notebook .jp-Cell").nth(WORK_AT[OOM]).locator(
            ".jp-OutputArea-output:has-text('OutOfMemoryError')").first.wait_for(timeout=60_000)
        page.wait_for_function(
            "() => document.querySelectorAll('.jp-GpumemPanel-cells tbody tr').length === 4"
            " && document.querySelectorAll('.jp-GpumemBadge.jp-mod-oom').length === 1",
            timeout=30_000)
        assert [r[0] for r in _rows(page)] == COUNTS
        assert _badges(page) == {at: e["text"] for at, e in zip(WORK_AT, expected, strict=True)}
        cells = page.locator(".jp-Notebook .jp-Cell")
        oom = cells.nth(WORK_AT[OOM]).locator(".jp-GpumemBadge")
        assert "jp-mod-oom" in (oom.get_attribute("class") or "")
        ok = cells.nth(WORK_AT[0]).locator(".jp-GpumemBadge")
        assert oom.evaluate("e => getComputedStyle(e).color") != ok.evaluate(
            "e => getComputedStyle(e).color")
        tip = cells.nth(WORK_AT[BUSY]).locator(".jp-GpumemBadge").get_attribute("title") or ""
        assert f"held by {expected[BUSY]['holders']}" in tip
        assert expected[BUSY]["holders"] == "ys (list of 2 × 256 MiB)"
        assert "1 OOM: out of memory while the cell ran" in (oom.get_attribute("title") or "")
        # the curve: a span a cell, the peak labelled
        timeline = panel.locator("svg.gm-timeline").first
        assert timeline.locator("line.gm-cell").count() == 4
        peak = max(e["row"]["peak_allocated"] for e in expected)
        from jupyter_gpumem.data.units import format_bytes

        assert timeline.locator("text.gm-peak-label").text_content() == f"peak {format_bytes(peak)}"

        # sorted by a header click: peak, largest first; again, smallest first
        panel.locator("th[data-key=peak]").click()
        by_peak = sorted(range(4), key=lambda i: (-expected[i]["row"]["peak_allocated"], i))
        assert [r[0] for r in _rows(page)] == [COUNTS[i] for i in by_peak]
        assert panel.locator("th[data-key=peak]").get_attribute("aria-sort") == "descending"
        panel.locator("th[data-key=peak]").click()
        least = min(range(4), key=lambda i: expected[i]["row"]["peak_allocated"])
        assert _rows(page)[0][0] == COUNTS[least]
        panel.locator("th[data-key=cell]").click()

        _scroll_to(page, LOAD_AT)
        _shot(page, "lab-panel.png", readme=True)

        # a row click scrolls to its cell (out of view while the tall markdown cell is shown)
        _scroll_to(page, FILLER_AT)
        assert not _in_view(page, WORK_AT[BUSY])
        panel.locator("tbody tr", has_text=COUNTS[BUSY]).click()
        page.wait_for_function("i => window.jupyterapp.shell.currentWidget.content"
                               ".activeCellIndex === i", arg=WORK_AT[BUSY], timeout=10_000)
        page.wait_for_timeout(500)
        assert _in_view(page, WORK_AT[BUSY])
        assert "jp-mod-selected" in (panel.locator("tbody tr", has_text=COUNTS[BUSY])
                                     .get_attribute("class") or "")

        # a click on a cell's span in the timeline goes to that cell
        _scroll_to(page, FILLER_AT)
        assert not _in_view(page, WORK_AT[0])
        mark = timeline.locator("line.gm-cell").nth(0)
        box = mark.bounding_box()
        plot = timeline.bounding_box()
        page.mouse.click(box["x"] + 3, plot["y"] + plot["height"] / 2)
        page.wait_for_function("i => window.jupyterapp.shell.currentWidget.content"
                               ".activeCellIndex === i", arg=WORK_AT[0], timeout=10_000)
        page.wait_for_timeout(500)
        assert _in_view(page, WORK_AT[0])

        # saved: the badges in the cells' metadata, the session in the notebook's
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        page.evaluate(SHUTDOWN)

    saved = json.loads((root / name).read_text())
    import nbformat

    from jupyter_gpumem.data.lab_schema import read_badges

    nbformat.validate(nbformat.from_dict(saved))
    badges = read_badges(saved)
    assert list(badges) == [saved["cells"][i]["id"] for i in WORK_AT]
    for at, want in zip(WORK_AT, expected, strict=True):
        badge = saved["cells"][at]["metadata"]["jupyter_gpumem"]
        assert badge["execution_count"] == saved["cells"][at]["execution_count"]
        (record,) = badge["records"]
        row = want["row"]
        assert (record["allocated_delta"], record["peak_allocated"], record["reserved_delta"],
                record["ooms"], record["holders"]) == (
            row["allocated_delta"], row["peak_allocated"], row["reserved_delta"], row["ooms"],
            want["holders"])
        assert record["source"] == "cupy" and record["device_name"] == "Simulated GPU 0"
    session = saved["metadata"]["jupyter_gpumem"]
    assert [f"[{s['cell']}]" for s in session["spans"]] == COUNTS
    (lane,) = session["lanes"]
    assert lane["key"] == "cupy:0" and len(lane["samples"]) >= 8
    assert max(r[1] for r in lane["samples"]) == peak
    assert session["devices"][0]["total"] == 80 << 30
    _SAVED.update(nb=saved, expected=expected)


@pytest.fixture(scope="module")
def saved(lab: tuple[str, Path]) -> dict[str, Any]:
    """The notebook the live test saved from JupyterLab (it runs first)."""
    if "nb" not in _SAVED:
        pytest.skip("needs test_panel_and_badges_live_then_saved to have run")
    return _SAVED


def test_saved_notebook_without_kernel_in_jupyterlab(lab: tuple[str, Path],
                                                     saved: dict[str, Any]) -> None:
    need_browser()
    url, root = lab
    name = copy_without_kernel(saved["nb"], root, "panel saved")
    with browser_page("lab-panel-saved-page.png", 1200, 780) as page:
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        page.wait_for_selector(".jp-GpumemBadge:visible", timeout=30_000)
        assert _badges(page) == {at: e["text"] for at, e in zip(WORK_AT, saved["expected"],
                                                                  strict=True)}
        page.locator(TOOLBAR_BUTTON).first.click()  # the notebook toolbar's button
        panel = page.locator(PANEL)
        panel.wait_for(timeout=10_000)
        assert panel.get_attribute("data-origin") == "saved"
        assert panel.get_attribute("data-status") == "no-kernel"
        assert panel.locator(".jp-GpumemPanel-status").inner_text() == (
            "No kernel · as the notebook saved it")
        assert [r[0] for r in _rows(page)] == COUNTS
        timeline = panel.locator("svg.gm-timeline").first
        lane = saved["nb"]["metadata"]["jupyter_gpumem"]["lanes"][0]
        assert _points(page) == len(lane["samples"]) + 1  # and the last one held to the right
        assert timeline.locator("line.gm-cell").count() == 4
        assert panel.locator(".jp-GpumemPanel-deviceTitle").inner_text() == (
            "device 0 · Simulated GPU 0 · 80.0 GiB")
        _scroll_to(page, FILLER_AT)
        panel.locator("tbody tr", has_text=COUNTS[OOM]).click()
        page.wait_for_function("i => window.jupyterapp.shell.currentWidget.content"
                               ".activeCellIndex === i", arg=WORK_AT[OOM], timeout=10_000)

        # the dark theme: the panel's words and the badges in light ink
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme',"
                      " {theme: 'JupyterLab Dark'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'",
                               timeout=30_000)
        page.wait_for_timeout(300)
        for el in (panel.locator("td").first, panel.locator(".jp-GpumemPanel-header h2"),
                   timeline.locator("text.gm-ytick").first):
            prop = "fill" if "text" in el.evaluate("e => e.tagName") else "color"
            assert _lightness(el.evaluate(f"e => getComputedStyle(e).{prop}")) > 0.5
        _scroll_to(page, LOAD_AT)
        _shot(page, "lab-panel-dark.png")
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme',"
                      " {theme: 'JupyterLab Light'})")
    assert running_kernels(url) == []


def test_saved_notebook_without_kernel_in_notebook7(lab: tuple[str, Path],
                                                    saved: dict[str, Any]) -> None:
    need_browser()
    need("Notebook 7", importlib.util.find_spec("notebook") is not None)
    url, root = lab
    name = copy_without_kernel(saved["nb"], root, "panel nb7")
    with browser_page("nb7-panel-saved-page.png", 1200, 900) as page:
        open_without_kernel(page, f"{url}/notebooks/{name}")
        page.wait_for_selector(".jp-GpumemBadge:visible", timeout=30_000)
        assert _badges(page) == {at: e["text"] for at, e in zip(WORK_AT, saved["expected"],
                                                                  strict=True)}
        page.locator(TOOLBAR_BUTTON).first.click()
        page.locator(f"{PANEL}:visible").wait_for(timeout=10_000)
        assert [r[0] for r in _rows(page)] == COUNTS
        assert page.locator(PANEL).get_attribute("data-origin") == "saved"
        page.screenshot(path=str(ARTIFACTS / "nb7-panel-saved.png"))
    assert running_kernels(url) == []


def test_notebook7_live_badge_and_row(lab: tuple[str, Path]) -> None:
    need_browser()
    need("Notebook 7", importlib.util.find_spec("notebook") is not None)
    url, root = lab
    name = f"gpumem-nb7-{uuid.uuid4().hex[:8]}.ipynb"
    (root / name).write_text(json.dumps(notebook_json(LOAD, WORK[0])))
    with browser_page("nb7-panel-live.png", 1200, 900) as page:
        page.goto(f"{url}/notebooks/{name}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        _wait_idle_kernel(url)
        page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt").click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        badge = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-GpumemBadge:visible")
        badge.wait_for(timeout=60_000)
        assert badge.inner_text().strip() == "+64.0 MiB · peak 64.0 MiB"
        badge.click()  # a badge opens the panel at its cell's row
        page.locator(f"{PANEL}:visible").wait_for(timeout=10_000)
        page.wait_for_function(
            "() => document.querySelector('.jp-GpumemPanel tbody tr.jp-mod-selected')"
            "?.cells[0].textContent === '[2]'", timeout=10_000)
        assert page.locator(PANEL).get_attribute("data-status") == "connected"
        page.evaluate(SHUTDOWN)


def test_badges_off_in_the_settings(lab: tuple[str, Path], saved: dict[str, Any]) -> None:
    need_browser()
    url, root = lab
    name = copy_without_kernel(saved["nb"], root, "panel no badges")
    with browser_page(None, 1200, 780) as page:
        open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
        page.wait_for_selector(".jp-GpumemBadge:visible", timeout=30_000)
        set_badges = ("b => window.jupyterapp.serviceManager.settings.save("
                      "'jupyter-gpumem:plugin', JSON.stringify({showBadges: b}))")
        page.evaluate(set_badges, False)
        try:
            open_without_kernel(page, f"{url}/lab/tree/{name}?reset")
            page.locator(".jp-Notebook .jp-Cell").nth(WORK_AT[OOM]).wait_for(timeout=30_000)
            page.evaluate(OPEN_PANEL)
            page.wait_for_function(
                "() => document.querySelectorAll('.jp-GpumemPanel-cells tbody tr').length === 4",
                timeout=30_000)
            assert page.locator(".jp-GpumemBadge:visible").count() == 0
        finally:
            page.evaluate(set_badges, True)
