"""Holders summed by variable: a list that grew in a loop reads as one line."""

from __future__ import annotations

from cupy_like import Array

from jupyter_gpumem.data.holders import MAX_CONTAINER_ITEMS, find_holders, holder_groups

MiB = 1 << 20
BLOCKS = [(0x10000000 + i * 64 * MiB, 64 * MiB) for i in range(20)] + [(0x90000000, 2 * MiB)]


def test_groups_by_variable_most_bytes_first() -> None:
    ns = {
        "losses": [Array(a, 64 * MiB - 100) for a, _ in BLOCKS[:20]],
        "w": Array(0x90000000 + 4096, 1024),  # a view inside the 2 MiB block
        "pair": (BLOCKS[0][0], 0x90000000),  # simulated handles: plain addresses
        "_hidden": BLOCKS[1][0], "n": 3, "flag": True,
    }
    groups = holder_groups(ns, BLOCKS)
    assert [g.describe() for g in groups] == [
        "losses (list of 20 × 64 MiB)", "pair (tuple of 2, 66.0 MiB)", "w (2.0 MiB)"]
    assert groups[0].addresses == tuple(a for a, _ in BLOCKS[:20])
    assert groups[0].bytes == 20 * 64 * MiB
    # the per-name form is unchanged
    assert find_holders(ns, BLOCKS)[BLOCKS[0][0]] == ["losses[0]", "pair[0]"]


def test_dicts_repeats_and_long_lists() -> None:
    a, b = BLOCKS[0][0], BLOCKS[20][0]
    ns = {"d": {"w": a, "b": b, "name": "x"}, "same": [a, a, a],
          "long": [a] * (MAX_CONTAINER_ITEMS + 5)}
    described = {g.name: g.describe() for g in holder_groups(ns, BLOCKS)}
    assert described == {
        "d": "d (dict of 2, 66.0 MiB)",
        "same": "same (list of 3 × 64 MiB)",  # three elements, one block: 64 MiB held
        "long": f"long (list of {MAX_CONTAINER_ITEMS + 5}, the first {MAX_CONTAINER_ITEMS} "
                f"looked at: {MAX_CONTAINER_ITEMS} × 64 MiB)",
    }
    assert {g.name: g.bytes for g in holder_groups(ns, BLOCKS)}["same"] == 64 * MiB
    assert holder_groups(ns, []) == []
    assert holder_groups({"n": 5}, BLOCKS) == []


def test_mixed_and_unhashable_containers_are_still_searched() -> None:
    a = BLOCKS[3][0]
    ns = {"mixed": [[1, 2], {"x": 1}, a], "floats": [0.5] * 50, "view": [Array(a + 512, 64)]}
    assert find_holders(ns, BLOCKS) == {a: ["mixed[2]", "view[0]"]}
