"""Run the example notebooks on the simulated device and save them with their outputs.

    python examples/refresh.py [NAME.ipynb ...]      # default: every notebook in examples/
                                                     # that needs no GPU

A notebook whose metadata says ``"jupyter_gpumem": {"needs": "gpu"}`` (``pytorch.ipynb``,
recorded on an H200) runs only when named, on a machine with the GPU and PyTorch.

A saved example shows what a user sees without running anything (GitHub, nbviewer, JupyterLab
with our extension and no kernel), so the outputs are kept, made portable first:

- a kernel's temporary folder, an environment's ``site-packages`` (or ``dist-packages``) prefix
  and the folders on ``sys.path`` are cut from every string (``/tmp/ipykernel_123/456.py`` →
  ``ipykernel/456.py``), so no machine's path is saved;
- widget state is not saved (JupyterLab's default); our outputs carry their own static views;
- an error keeps only its last traceback line, the message a user reads.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import nbclient
import nbformat

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent
_KERNEL_TMP = re.compile(r"(?:[A-Za-z]:)?[\w/\\.-]*?[/\\]ipykernel_\d+[/\\]")
_SITE_PACKAGES = re.compile(r"(?:[A-Za-z]:)?[\w/\\.-]*?[/\\]((?:site|dist)-packages[/\\])")
#: Folders of sys.path other than the project's (an install --target folder, say), longest first.
_PATHS = sorted({p.rstrip("/") + "/" for p in sys.path if p.startswith("/") and len(p) > 1}
                - {str(ROOT) + "/"}, key=len, reverse=True)


def portable(text: str) -> str:
    """``text`` without the machine's kernel folder or environment prefix."""
    text = _KERNEL_TMP.sub("ipykernel/", text)
    text = _SITE_PACKAGES.sub(r"\1", text)
    text = text.replace(str(ROOT) + "/", "")
    for folder in _PATHS:
        text = text.replace(folder, "")
    return text


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return portable(value)
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


def refresh(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}},
                                     allow_errors=True, store_widget_state=False)
    client.execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if out.output_type == "error":
                out.traceback = out.traceback[-1:]
        cell.outputs = nbformat.from_dict(_scrub(cell.outputs))
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"wrote {path.relative_to(ROOT)}")


def _needs_gpu(path: Path) -> bool:
    meta = nbformat.read(path, as_version=4).metadata.get("jupyter_gpumem", {})
    return isinstance(meta, dict) and meta.get("needs") == "gpu"


def main(names: list[str]) -> None:
    paths = [EXAMPLES / n for n in names] if names else [
        p for p in sorted(EXAMPLES.glob("*.ipynb")) if not _needs_gpu(p)]
    for p in paths:
        refresh(p)


if __name__ == "__main__":
    main(sys.argv[1:])
