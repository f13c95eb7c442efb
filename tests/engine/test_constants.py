"""The C core is a translation of the Python one: its copies of the vocabulary must match."""

from __future__ import annotations

import re
from pathlib import Path

from jupyter_gpumem.data import codes, sizes

HEADER = (Path(__file__).parents[2] / "jupyter_gpumem" / "engine" / "csrc" / "core.h").read_text()


def _define(name: str) -> int:
    m = re.search(rf"^#define {name} (.+)$", HEADER, re.M)
    assert m, f"core.h defines no {name}"
    text = m.group(1).replace("LL", "").strip("() ")
    base, _, shift = text.partition("<<")
    return int(base) << int(shift or 0)


def test_sizes_match_the_c_core() -> None:
    for name in ("MIN_BLOCK_SIZE", "SMALL_SIZE", "SMALL_BUFFER", "LARGE_BUFFER",
                 "MIN_LARGE_ALLOC", "ROUND_LARGE", "MAX_VIRTUAL_RANGE", "MAX_ALLOC_SIZE"):
        assert _define(name) == getattr(sizes, name), name


def test_codes_match_the_c_core() -> None:
    assert _define("MAX_FRAMES") == codes.RECORDED_FRAMES
    assert _define("NO_STACK") == codes.NO_STACK
    m = re.search(r"enum \{ (A_ALLOC[^}]*)\}", HEADER)
    assert m
    names = [n.strip().removeprefix("A_").lower() for n in m.group(1).split(",") if n.strip()]
    assert tuple(names) == codes.ACTIONS


def test_guessed_block_sizes_are_the_policys_rounding() -> None:
    from jupyter_gpumem.data.replay import _block_size
    from jupyter_gpumem.data.timeline import trace_columns

    requests = [0, 1, 511, 512, 513, 300 * 1024 + 17, 3 * sizes.MiB + 1]
    trace = [{"action": "alloc", "addr": 0x1000 * (i + 1), "size": n, "stream": 0,
              "time_us": i, "frames": []} for i, n in enumerate(requests)]
    expected = [sizes.round_size(n) for n in requests]
    assert trace_columns(trace).block_size.tolist() == expected  # type: ignore[arg-type]
    assert [_block_size(e) for e in trace] == expected  # type: ignore[arg-type]
    assert expected[:5] == [512, 512, 512, 512, 1024]
