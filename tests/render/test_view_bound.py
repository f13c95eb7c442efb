"""A traced cell's saved output stays within its bound whatever the trace holds (Note [A bounded
view]): a trace built to overflow every part of the view payload at once (block and segment
lives, stacks with long file names, surviving blocks and their holders, cell marks)."""

from __future__ import annotations

import json

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.render.payload_columns import decode_column
from jupyter_gpumem.render.trace_result import analyze
from jupyter_gpumem.render.view_detail import NAMES_BUDGET
from jupyter_gpumem.render.view_lives import STACK_LEFT_OUT
from jupyter_gpumem.render.view_payload import (
    MAX_CELL_MARKS,
    MAX_LIVES,
    MAX_SEGMENT_LIVES,
    MAX_SURVIVING,
    TIMELINE_COLUMNS,
)

MiB = 1 << 20
#: The bound the README and ``view_payload`` state for a traced cell's saved output.
SAVED_OUTPUT_BOUND = 2_000_000


def _allocators(count: int) -> list:
    """``count`` functions, each in its own file with a long name: as many distinct stacks."""
    made = []
    for i in range(count):
        name = f"/{'deep/' * 400}module_{i}.py"  # 2,000 characters a frame
        scope: dict = {}
        exec(compile("def alloc(a, n):\n    return a.malloc(n)\n", name, "exec"), scope)
        made.append(scope["alloc"])
    return made


def overflowing_result():
    a = CachingAllocator(SimulatedDevice(64 << 30))
    a.record_history(True, stacks=True, max_entries=1_000_000)
    allocs = _allocators(400)
    kept = []
    for i in range(16_000):
        a.current_cell = i % 1500  # a new run of cells every event: thousands of cell marks
        p = allocs[i % len(allocs)](a, (1 + i % 13) * 64 * 1024)
        if i % 90 == 0:
            kept.append(p)  # survivors
        else:
            a.free(p)
        if i % 5 == 0:  # a large block in its own segment, given back: segment churn
            a.free(a.malloc(40 * MiB))
            a.empty_cache()
    holders = {p: [f"model.layers[{j}].{'cache' * 40}" for j in range(3)] for p in kept}
    result = analyze(a.snapshot())
    result.holders = holders
    return result, holders


def test_every_part_of_a_saved_trace_view_keeps_its_bound() -> None:
    result, _ = overflowing_result()
    payload = result.to_json()
    lives = payload["lives"]
    n = payload["n_events"]
    assert n > 40_000
    assert len(decode_column(payload["timeline"]["index"])) <= TIMELINE_COLUMNS
    assert lives["checkpoints"] is not None and lives["dropped"] > 0  # cut, and says so
    assert len(decode_column(lives["blocks"]["start"])) <= MAX_LIVES
    assert len(decode_column(lives["segments"]["start"])) <= MAX_SEGMENT_LIVES
    names = len(json.dumps(payload["stacks"])) + len(json.dumps(payload["sites"]))
    assert names <= NAMES_BUDGET
    stack_ids = decode_column(lives["blocks"]["stack"])
    assert (stack_ids == STACK_LEFT_OUT).any() and (stack_ids >= 0).any()  # the budget cut
    assert len(payload["surviving"]) == MAX_SURVIVING
    rest = payload["surviving_rest"]
    assert rest["count"] == len(result.surviving) - MAX_SURVIVING > 0
    assert len(payload["cells"]) <= MAX_CELL_MARKS < n  # cells change every event


def test_a_traced_cells_saved_output_is_at_most_two_megabytes() -> None:
    import nbformat

    result, _ = overflowing_result()
    bundle = result._repr_mimebundle_()
    assert {"text/plain", "text/html", "application/vnd.jupyter-gpumem.trace+json"} <= set(bundle)
    assert "<img" in bundle["text/html"]  # the picture is kept
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "%%gpumem_trace", outputs=[nbformat.v4.new_output("display_data", data=bundle)])])
    empty = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%%gpumem_trace")])
    saved = len(nbformat.writes(nb).encode()) - len(nbformat.writes(empty).encode())
    assert saved <= SAVED_OUTPUT_BOUND, {m: len(json.dumps(d)) for m, d in bundle.items()}
    assert f"and {len(result.surviving) - 20:,} more blocks" in bundle["text/plain"]
