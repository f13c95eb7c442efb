"""``import jupyter_gpumem`` stays light: the heavy libraries load only when a feature needs them.

The one test of the promise in the package's docstring (and STYLE.md): importing the package
imports none of CuPy, IPython, matplotlib or the widget libraries (nor numpy, which only the
renderers and loaders need). Run in a fresh interpreter, where nothing else imported them first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("cupy", "cupy_backends", "IPython", "matplotlib", "ipywidgets", "anywidget", "traitlets",
         "numpy")

CODE = """\
import json, sys
heavy = {heavy!r}
def loaded():
    return sorted({{m.split(".")[0] for m in sys.modules}} & set(heavy))
import jupyter_gpumem as gm
after_import = loaded()
gm.save_html, gm.load_snapshot, gm.CachingAllocator  # the HTML page and the loader need no
after_lazy = sorted(set(loaded()) - {{"numpy"}})     # matplotlib (numpy is fine there)
live = gm.LiveSession.__module__
print(json.dumps([after_import, after_lazy, live, "matplotlib" in sys.modules]))
"""


def test_import_is_light() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", CODE.format(heavy=HEAVY)], capture_output=True,
                         text=True, check=True, env=env, cwd=ROOT).stdout
    after_import, after_lazy, live, matplotlib_at_end = json.loads(out)
    assert after_import == []
    assert after_lazy == []
    # a lazy name still resolves to the real thing, and that one pulls in no matplotlib either
    assert live == "jupyter_gpumem.notebook.widget"
    assert not matplotlib_at_end
