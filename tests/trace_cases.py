"""Random traces for the ``.gpumem`` tests: every column, each with values of its own kind
(wide and negative streams, growing times and cells, stacks and extra keys), valid under
``schema.check_snapshot``."""

from __future__ import annotations

import numpy as np

from jupyter_gpumem.data.columns import TraceColumns

FRAMES = [{"filename": "train.py", "line": 12, "name": "step"},
          {"filename": "model.py", "line": 40, "name": "forward"}]


def random_trace(seed: int, n: int) -> TraceColumns:
    """``n`` events drawn from ``seed`` (the same trace for the same arguments: a file of
    format 1, data/fixtures/trace_format1.gpumem, was written from ``random_trace(1, 1500)``)."""
    rng = np.random.default_rng(seed)
    stacks = [FRAMES[:1], FRAMES, FRAMES[1:]]
    stream = rng.integers(-5, 1 << 40, n)
    if n >= 2:
        stream[:2] = (-(1 << 63), (1 << 63) - 1)  # the widest offsets: every bit comes back
    cols = {
        "action": rng.integers(0, 9, n),
        "addr": rng.integers(0, 1 << 40, n) & ~511,
        "size": rng.choice([512, 1 << 20, 3 << 20, 0], n),
        "stream": stream,
        "time_us": (1 << 50) + np.cumsum(rng.integers(0, 1000, n)),
        "stack": rng.integers(-1, len(stacks), n),
        "cell": np.maximum.accumulate(rng.integers(-1, 40, n)) if n else np.zeros(0),
        "task": rng.integers(-1, 6, n),
        "extra": rng.integers(0, 1 << 30, n),
        "device_free": rng.integers(0, 3, n),
    }
    others = {i: {"compile_context": f"c{i}"} for i in range(0, n, 97)}
    return TraceColumns(cols, stacks, others)
