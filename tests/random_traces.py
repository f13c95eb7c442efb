"""Random traces as lists of trace entries, and what they mean, worked out event by event.

The views read a trace through vectorised code (``data.pairs``, ``data.intervals``,
``render.view_lives``); these references walk the entries one at a time, in the plainest way,
to say what that code must give: the allocation each free matches, the life of every block,
its bytes by band at any event, the free_completed that ends each life.

``random_trace`` makes two kinds: an allocator's (each address allocated and freed by turns,
some frees completed at once and some later, blocks older than the trace, segments, OOMs)
and a damaged one (any action at any of a few addresses: double frees, double allocations).
"""

from __future__ import annotations

import random
from typing import Any

from jupyter_gpumem.data.sizes import round_size
from jupyter_gpumem.data.timeline import Timeline, trace_columns

ALLOC, REQUESTED, COMPLETED = "alloc", "free_requested", "free_completed"
#: Stacks the allocations pick from: two lines of a user's file, and none.
STACKS: list[list[dict[str, Any]]] = [
    [{"filename": "/home/me/train.py", "line": 10 + k, "name": "<module>"}] for k in range(3)
] + [[]]
OOM_STACK = [{"filename": "/home/me/train.py", "line": 99, "name": "<module>"}]


def _entry(action: str, addr: int, size: int, rng: random.Random, *,
           block: bool = True) -> dict[str, Any]:
    frames = (rng.choice(STACKS) if action == ALLOC else
              OOM_STACK if action == "oom" else [])  # (a line only an oom has: no block's site)
    e: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": 0,
                         "time_us": 0, "frames": frames}
    if block and action in (ALLOC, REQUESTED, COMPLETED):
        e["block_size"] = round_size(size)
    return e


def random_trace(seed: int, n: int = 200, *, damaged: bool = False,
                 requests: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(entries, blocks live at the end as a snapshot has them). ``requests``: frees are a
    free_requested then a free_completed (else a free_completed alone, as a trace without
    requests has them)."""
    rng = random.Random(seed)
    addrs = [(1 << 30) + 4096 * k for k in range(8)]
    sizes = {a: rng.choice([100, 512, 3000, 1 << 20]) for a in addrs}
    live = set(rng.sample(addrs, 3))  # allocated before the trace
    pending: list[int] = []  # requested, not yet completed
    out: list[dict[str, Any]] = []
    with_sizes = rng.random() < 0.7  # a PyTorch trace has no block sizes
    if rng.random() < 0.5:
        out.append(_entry(COMPLETED, addrs[-1], sizes[addrs[-1]], rng))  # requested before

    def free(a: int) -> None:
        """A free of the live block at ``a``: requested (completed later), or completed."""
        live.discard(a)
        out.append(_entry(REQUESTED if requests else COMPLETED, a, sizes[a], rng,
                          block=with_sizes))
        if requests:
            pending.append(a)

    while len(out) < n:
        r = rng.random()
        if damaged:
            action = rng.choice([ALLOC, REQUESTED, COMPLETED, ALLOC, REQUESTED, "segment_alloc",
                                 "oom"])
            a = rng.choice(addrs)
            out.append(_entry(action, a, sizes[a], rng, block=with_sizes))
            continue
        free_now = [a for a in addrs if a not in live and a not in pending]
        if r < 0.45 and free_now:
            a = rng.choice(free_now)
            live.add(a)
            out.append(_entry(ALLOC, a, sizes[a], rng, block=with_sizes))
            if rng.random() < 0.5:  # a temporary: freed by the next event
                free(a)
        elif r < 0.8 and live:
            free(rng.choice(sorted(live)))
        elif r < 0.93 and pending:
            a = pending.pop(0 if rng.random() < 0.7 else -1)  # at once, or later
            out.append(_entry(COMPLETED, a, sizes[a], rng, block=with_sizes))
        elif r < 0.97:
            out.append(_entry("segment_alloc" if rng.random() < 0.5 else "segment_free",
                              1 << 40, 2 << 20, rng))
        else:
            out.append(_entry("oom", 0, 1 << 30, rng))
    end_blocks = [{"address": a, "size": round_size(sizes[a]), "requested_size": sizes[a],
                   "state": "active_allocated", "frames": STACKS[0]} for a in sorted(live)]
    return out[:n], end_blocks


#: (seed, damaged, requests) of the random traces the vectorised code is checked on.
CASES = [(seed, damaged, requests) for seed in range(12) for damaged in (False, True)
         for requests in (True, False)]


def random_timeline(seed: int, damaged: bool, requests: bool, n: int = 200
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Timeline]:
    """``random_trace``'s entries and end blocks, and the timeline built from them."""
    entries, end_blocks = random_trace(seed, n, damaged=damaged, requests=requests)
    tl = trace_columns(entries, end_allocated=sum(b["size"] for b in end_blocks),
                       end_blocks=end_blocks)
    return entries, end_blocks, tl


def free_action(entries: list[dict[str, Any]]) -> str:
    """The action that ends a block's bytes: free_requested where the trace has any."""
    return REQUESTED if any(e["action"] == REQUESTED for e in entries) else COMPLETED


def block_bytes(e: dict[str, Any]) -> int:
    return int(e.get("block_size") or round_size(e["size"]))


def reference_pairs(entries: list[dict[str, Any]]) -> tuple[dict[int, int], list[int]]:
    """{allocation: its free} and the frees matched with none: a free matches the event
    before it at its address when that is an allocation."""
    free = free_action(entries)
    last: dict[int, tuple[int, str]] = {}
    pairs: dict[int, int] = {}
    orphans = []
    for i, e in enumerate(entries):
        if e["action"] not in (ALLOC, free):
            continue
        before = last.get(e["addr"])
        if e["action"] == free:
            if before is not None and before[1] == ALLOC:
                pairs[before[0]] = i
            else:
                orphans.append(i)
        last[e["addr"]] = (i, e["action"])
    return pairs, orphans


def reference_intervals(entries: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """(start, end, bytes, address) of every allocation of the trace and every block freed in
    it but allocated before, sorted."""
    n = len(entries)
    pairs, orphans = reference_pairs(entries)
    out = [(i, pairs.get(i, n), block_bytes(e), e["addr"])
           for i, e in enumerate(entries) if e["action"] == ALLOC]
    out += [(0, f, block_bytes(entries[f]), entries[f]["addr"]) for f in orphans]
    return sorted(out)


def reference_lives(entries: list[dict[str, Any]]) -> tuple[list[tuple[int, int, int]],
                                                            list[int]]:
    """(start, end, address) of the lives of the seen allocations and of the blocks freed in
    the trace but allocated before (start -1), each ending at the free_completed of its
    free_requested: the next event where it completes the same address, else the first later
    one of that address no such completion took; and the free_completed events that end no
    life."""
    n = len(entries)
    pairs, orphans = reference_pairs(entries)
    spans = [(i, pairs.get(i, n), e["addr"]) for i, e in enumerate(entries)
             if e["action"] == ALLOC]
    spans += [(-1, f, entries[f]["addr"]) for f in orphans]
    if free_action(entries) != REQUESTED:
        return sorted(spans), []

    def completes(k: int, addr: int) -> bool:
        return k < n and entries[k]["action"] == COMPLETED and entries[k]["addr"] == addr

    quick = {end + 1 for _, end, addr in spans
             if end < n and entries[end]["action"] == REQUESTED and completes(end + 1, addr)}
    lives = []
    for start, end, addr in spans:
        if end < n and entries[end]["action"] == REQUESTED:
            if completes(end + 1, addr):
                end += 1
            else:
                later = [k for k in range(end + 1, n) if completes(k, addr) and k not in quick]
                end = later[0] if later else end
        lives.append((start, end, addr))
    ends = {end for _, end, _ in lives}
    unended = [k for k, e in enumerate(entries) if e["action"] == COMPLETED and k not in ends]
    return sorted(lives), unended
