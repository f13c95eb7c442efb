"""A trace of ten million events on the simulated device, and a saved notebook showing it.

The allocator's C core records a training-like loop (two allocating lines, a ring of 48 live
blocks, one spike of 640 MiB halfway) with history and stacks on; the notebook holds the output a
``%%gpumem_trace --save run.gpumem`` cell leaves there when its kernel saved it: the linked
trace widget's view, with the bundle every reader without the widget draws (the view payload,
the picture, the text). The whole trace is written to ``run.gpumem`` beside the notebook, as
``--save`` does, and the saved view names it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from saved_views import NO_KERNEL

MiB = 1 << 20
#: What the notebook's traced cell says it ran (the trace itself is recorded here, faster).
CELL = """%%gpumem_trace --max-entries 10000000 --save run.gpumem
kept = train(gm.get_allocator(), steps=3_333_400)"""


def record(events: int) -> Any:
    """An allocator whose history holds the last ``events`` events of the loop."""
    from jupyter_gpumem import CachingAllocator, SimulatedDevice

    a = CachingAllocator(SimulatedDevice(80 << 30))
    a.record_history(True, stacks=True, max_entries=events)
    sizes = [(1 + (k * 7919) % 23) * MiB // 2 for k in range(64)]
    small = [(1 + k) * 4096 for k in range(16)]
    malloc, free = a.malloc, a.free
    live: deque[int] = deque()
    steps = events // 3 + 64
    for i in range(steps):
        if i & 3:
            live.append(malloc(sizes[i & 63]))  # activations
        else:
            live.append(malloc(small[i & 15]))  # temporaries
        if len(live) > 48:
            free(live.popleft())
        if i == steps // 2:
            free(malloc(640 * MiB))  # one spike
    return a


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


def saved_notebook(folder: Path, events: int = 10_000_000) -> tuple[str, dict[str, Any]]:
    """Write the notebook (and ``run.gpumem``) into ``folder``; its file name and the view
    payload it saved."""
    import json

    from jupyter_gpumem.render.display import MIME_TYPE
    from jupyter_gpumem.render.trace_result import analyze

    a = record(events)
    result = analyze(a.snapshot(), title="cell [2]", cell=2)
    with _inside(folder):
        result.save("run.gpumem")  # as --save does: its views name the file
    bundle = result._repr_mimebundle_()
    # what the kernel's TraceWidget adds: its view, which no kernel will ever show again
    bundle["application/vnd.jupyter.widget-view+json"] = {
        "version_major": 2, "version_minor": 0, "model_id": uuid.uuid4().hex}
    cells = [
        {"cell_type": "code", "execution_count": 1, "id": "load", "metadata": {}, "outputs": [],
         "source": "%load_ext jupyter_gpumem\n%gpumem device sim\nimport jupyter_gpumem as gm"},
        {"cell_type": "code", "execution_count": 2, "id": "trace", "metadata": {},
         "outputs": [{"output_type": "display_data", "data": bundle, "metadata": {}}],
         "source": CELL},
    ]
    nb = {"cells": cells, "metadata": {"kernelspec": dict(NO_KERNEL)}, "nbformat": 4,
          "nbformat_minor": 5}
    name = f"ten million {uuid.uuid4().hex[:8]}.ipynb"
    (folder / name).write_text(json.dumps(nb))
    return name, bundle[MIME_TYPE]
