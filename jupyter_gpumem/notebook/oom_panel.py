"""The out-of-memory explainer: one panel under the traceback of a cell that ran out of memory.

One panel for every memory source: ``source_of_oom`` (``oom_source``) finds the source whose
``is_oom`` holds for the error, and ``build_panel`` reads it. It says, from plain data (the
source's ``oom_report``, the ledger's end state of the cell for that source and the user's
namespace):

- what was asked for, and the largest free block there was;
- how many bytes were free but in blocks too small for the request (fragmented);
- which cells and lines hold the live memory, and the variables holding it (objects whose data
  lies in a block, and containers of them; never a plain int that equals an address);
- what other processes hold on the device;
- the next steps (``advice``): built once, each only when its condition holds, each said once
  in the cell's output (a step the error message above already gives is not repeated), in the
  source's words (``said_for``), then the source's own (``oom_steps``); the last, where the
  events before the error were recorded, a config that would have fit them
  (``replay_cmd.replay_offer``).

Code in the steps is written between backticks: kept in the text, ``<code>`` in the HTML.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.data.holders import FORGET_ERROR_CODE, find, group
from jupyter_gpumem.data.reach import DEFAULT_BUDGET, MODULE, TRACEBACK, VARIABLE, Budget, Chain
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.engine.oom import OomReport
from jupyter_gpumem.engine.oom import advice as report_advice
from jupyter_gpumem.notebook.ledger import Ledger, LiveBlock, group_blocks, where_of
from jupyter_gpumem.notebook.oom_source import is_oom_error, said_for, source_of_oom
from jupyter_gpumem.render.table import Table
from jupyter_gpumem.sources.protocol import NO_STACK, MemorySource

__all__ = ["OomPanel", "advice", "build_panel", "code_html", "is_oom_error", "next_step",
           "said_for", "source_of_oom"]

#: Rows of the "who holds the memory" table.
TOP_HOLDERS = 6


@dataclass(frozen=True)
class HolderRow:
    """Live bytes allocated by one line of one cell, and the variables that hold them."""

    cell: int | None
    site: str | None
    bytes: int
    blocks: int
    names: tuple[str, ...] = ()
    held: int = 0  # bytes of the group's blocks that ``names`` hold (the group may have more)
    #: what ``del`` takes to drop the named holders (``hooks[3]`` for
    #: ``hooks[3].<closure>.buf``); ``caching_allocator_delete`` for ``handles``
    roots: tuple[str, ...] = ()
    handles: tuple[str, ...] = ()  # holders that are ints from ``caching_allocator_alloc``
    error_held: int = 0  # bytes of the group's blocks that the last error's traceback keeps

    @property
    def where(self) -> str:
        if self.site is not None:
            return self.site
        return f"cell [{self.cell}]" if self.cell is not None else "before the ledger started"


@dataclass
class OomPanel:
    """Plain data of the explainer, with text/plain and text/html displays."""

    message: str  # the first line of the error
    report: OomReport | None
    fragmented: int  # bytes of cached free blocks each too small for the request
    holders: list[HolderRow] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)  # next steps, each once; code in backticks
    cell: int | None = None
    worker: str | None = None  # the Dask worker that ran out of memory (the error names it)
    tasks: tuple[str, ...] = ()  # the tasks running there at the time
    source: str = "cupy"  # whose allocator ran out: "cupy" (ours) or "torch"

    def lines(self) -> list[tuple[str, str]]:
        """``(heading, text)`` pairs, shared by both displays."""
        r = self.report
        where = f" in cell [{self.cell}]" if self.cell is not None else ""
        if self.worker is not None:
            where += f" on Dask worker {self.worker}" + (
                f" in task {', '.join(repr(k) for k in self.tasks)}" if self.tasks else "")
        out: list[tuple[str, str]] = []
        if r is None:
            out.append(("GPU out of memory" + where, self.message))
        else:
            out.append((
                "GPU out of memory" + where,
                f"asked for {format_bytes(r.requested)} ({format_bytes(r.rounded)} after rounding)"
                f" on device {r.device} ({r.device_name}); the largest free block was "
                f"{format_bytes(r.largest_free_block)}.",
            ))
            out.append((
                "Memory",
                f"{format_bytes(self.fragmented)} free but fragmented (cached in blocks too "
                f"small for the request) · "
                f"{'the worker' if self.worker is not None else 'this process'}: "
                f"{format_bytes(r.allocated)} allocated, "
                f"{format_bytes(r.reserved)} reserved · device: {format_bytes(r.device_free)} "
                f"free of {format_bytes(r.device_total)}{self._outside()}"
                + (f" · cap {format_bytes(r.cap)} (fraction {r.fraction:g})"
                   if r.cap is not None and r.fraction is not None else "") + ".",
            ))
            if r.processes:
                listed = ", ".join(f"pid {pid} ({name}) {format_bytes(n)}"
                                   for pid, name, n in r.processes[:5])
                more = f" and {len(r.processes) - 5} more" if len(r.processes) > 5 else ""
                out.append(("Other processes", listed + more + "."))
            else:
                out.append(("Other processes", "none hold memory on this device, as far as "
                                               "the driver reports."))
        return out

    def _outside(self) -> str:
        """``, 136 GiB of it in use outside the allocator`` when the device's used bytes are
        more than the allocator reserved (a CUDA context, libraries, other allocators or
        processes), else ""."""
        r = self.report
        if r is None or self.worker is not None:
            return ""
        outside = r.device_total - r.device_free - r.reserved
        if outside <= 0:
            return ""
        return f", {format_bytes(outside)} of it in use outside the allocator"

    @property
    def next_step(self) -> str:
        """The first of ``advice``, or ""."""
        return self.advice[0] if self.advice else ""

    def holder_rows(self) -> list[tuple[str, str, str, str]]:
        return [(format_bytes(h.bytes), f"{h.blocks} block{'s' if h.blocks != 1 else ''}",
                 h.where, _names(h.names)) for h in self.holders]

    def _holder_table(self, *, arrows: bool) -> Table:
        if arrows:  # text: the holders after the line, as "← x, y"
            rows = [(size, blocks, f"{where}  ← {names}" if names else where)
                    for size, blocks, where, names in self.holder_rows()]
            return Table(("bytes", "blocks", "allocated at"), rows, "><")
        return Table(("bytes", "blocks", "allocated at", "held by"), self.holder_rows(), "><")

    def text(self) -> str:
        lines = []
        for i, (head, body) in enumerate(self.lines()):
            lines.append(f"{head}: {body}")
            if i == 1 or (i == 0 and self.report is None):
                if self.holders:
                    lines.append("Live memory by cell and line:")
                    lines.append(self._holder_table(arrows=True).text(indent="  ",
                                                                      header=False))
                elif self.worker is not None:
                    lines.append("Live memory by cell and line: held by the worker, not this "
                                 "process; `%%gpumem_trace --cluster` shows its tasks.")
                else:
                    lines.append("Live memory by cell and line: nothing is allocated.")
        if len(self.advice) == 1:
            lines.append(f"Next step: {self.advice[0]}")
        elif self.advice:
            lines.append("Next steps:")
            lines.extend(f"  - {step}" for step in self.advice)
        return "\n".join(lines)

    def html(self) -> str:
        parts = ['<div class="jupyter-gpumem-oom" style="border-left:4px solid #d62728;'
                 'padding:4px 10px;margin:4px 0">']
        for i, (head, body) in enumerate(self.lines()):
            parts.append(f"<p><b>{html.escape(head)}:</b> {html.escape(body)}</p>")
            if (i == 1 or (i == 0 and self.report is None)) and self.holders:
                parts.append(self._holder_table(arrows=False).html())
        if len(self.advice) == 1:
            parts.append(f"<p><b>Next step:</b> {code_html(self.advice[0])}</p>")
        elif self.advice:
            items = "".join(f"<li>{code_html(step)}</li>" for step in self.advice)
            parts.append(f"<p><b>Next steps:</b></p><ul>{items}</ul>")
        parts.append("</div>")
        return "".join(parts)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


def _fragmented(source: MemorySource | None, report: OomReport) -> int:
    """Cached free bytes in blocks too small for the request, at the error: all of them when
    even the largest was too small (the report says so); else the source's inactive blocks now
    (its snapshot), which the cell may have changed since (a ``finally`` that freed its
    arrays), at most what was cached."""
    if report.largest_free_block < report.rounded:
        return report.free_cached
    if source is None:
        return 0
    device = source.device_index
    now = sum(b["size"] for seg in source.snapshot()["segments"]
              if seg.get("device", device) == device
              for b in seg["blocks"] if b["state"] == "inactive" and b["size"] < report.rounded)
    return min(now, report.free_cached)


def blocks_now(source: MemorySource, cell_files: Mapping[str, int] | None = None
               ) -> list[LiveBlock]:
    """The live blocks of ``source`` now, each with the line that allocated it (its site) and
    the cell of that line (None without a stack)."""
    live = source.live_blocks()
    wheres: dict[int, tuple[str | None, tuple[int, int] | None]] = {}
    out = []
    for address, size, requested, stack_id in live.rows:
        if stack_id not in wheres:
            frames = (live.stacks.frames(stack_id)
                      if live.stacks is not None and stack_id != NO_STACK else [])
            wheres[stack_id] = where_of(frames, cell_files or {}) if frames else (None, None)
        site, origin = wheres[stack_id]
        out.append(LiveBlock(address, size, requested, site, None, origin))
    return out


_CODE = re.compile(r"`([^`]+)`")


def code_html(text: str) -> str:
    """``text`` escaped for HTML, its `code` spans as ``<code>``."""
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


def holder_rows(blocks: Iterable[LiveBlock], namespace: Mapping[str, Any] | None,
                top: int = TOP_HOLDERS, *, cell_files: Mapping[str, int] | None = None,
                budget: Budget = DEFAULT_BUDGET) -> list[HolderRow]:
    """The biggest groups of live blocks by (cell, line), with what holds them: the chains of
    ``holders.find``, as the footer names them (a plain int holds nothing)."""
    blocks = list(blocks)
    found = find(namespace or {}, [(b.address, b.size) for b in blocks], cell_files=cell_files,
                 modules=namespace is not None, last_error=namespace is not None, budget=budget)
    sizes = {b.address: b.size for b in blocks}
    rows: dict[tuple[int | None, str | None], list[Chain]] = {}
    for b in blocks:
        if b.address in found.held:
            rows.setdefault((b.cell, b.site), []).append(found.chain(b.address))
    out = []
    for cell, site, size, count in group_blocks(blocks)[:top]:
        chains = rows.get((cell, site), [])
        targets: list[str] = []
        handles: list[str] = []
        for chain in chains:
            if chain.root.kind in (VARIABLE, MODULE):
                _add(handles if chain.handle else targets, chain.target)
        out.append(HolderRow(
            cell, site, size, count, tuple(g.describe() for g in group(chains, sizes)),
            sum(sizes[c.address] for c in chains), tuple(targets), tuple(handles),
            sum(sizes[c.address] for c in chains if c.root.kind == TRACEBACK)))
    return out


def _add(names: list[str], name: str) -> None:
    if name not in names:
        names.append(name)


def _free_step(picked: list[HolderRow]) -> str:
    listed = "; ".join(f"{', '.join((*h.roots, *h.handles))} ({format_bytes(h.held)}, {h.where})"
                       for h in picked)
    targets = list(dict.fromkeys(n for h in picked for n in h.roots))
    handles = list(dict.fromkeys(n for h in picked for n in h.handles))
    how = []
    if targets:
        them = "it" if len(targets) == 1 else "them"
        how.append(f"`del {', '.join(targets)}` (if nothing else refers to {them})")
    how += [f"`caching_allocator_delete({n})`" for n in handles]
    return f"free {listed}: {' and '.join(how)} and run the cell again."


def _forget_step(error_bytes: int) -> str:
    return (f"the error's traceback keeps {format_bytes(error_bytes)} alive in its frames' "
            f"locals: `%gpumem forget-error` frees it (or `{FORGET_ERROR_CODE}`).")


def advice(report: OomReport | None, holders: list[HolderRow], *, said: str = "") -> list[str]:
    """The next steps, each once, the most specific first.

    Freeing named variables leads when it would make room: what they hold, with what the device
    has free, covers the segment the allocator asked for (and no cap refused it). The rest is
    the report's own ``engine.oom.advice``. ``said`` is text already shown (the error message):
    a step in it is left out."""
    named = [h for h in holders if (h.roots or h.handles) and h.held > h.error_held]
    error_bytes = sum(h.error_held for h in holders)
    steps: list[str] = [_forget_step(error_bytes)] if error_bytes else []
    if report is None:
        if named:
            steps.append(_free_step(named[:1]))
        elif not steps:
            steps.append("free memory you no longer need: `del` the arrays holding it.")
    else:
        r = report
        capped = r.cap is not None and r.reserved + r.segment_size > r.cap
        if named and not capped:
            need = r.segment_size - r.device_free
            picked: list[HolderRow] = []
            freeable = 0
            for h in named:
                picked.append(h)
                freeable += h.held - h.error_held
                if freeable + error_bytes >= need:
                    steps.append(_free_step(picked))
                    break
        others = sum(n for _, _, n in r.processes)
        for step in report_advice(r, others):
            if steps and step.startswith("free memory you no longer need"):
                continue  # the named variables above say it better
            steps.append(step)
    out: list[str] = []
    for step in steps:
        if step not in out and step not in said:
            out.append(step)
    return out


def next_step(report: OomReport | None, holders: list[HolderRow]) -> str:
    """The first of ``advice``, or ""."""
    steps = advice(report, holders)
    return steps[0] if steps else ""


def build_panel(exc: BaseException, source: MemorySource | None = None, *,
                ledger: Ledger | None = None, namespace: Mapping[str, Any] | None = None,
                cell: int | None = None, replay: bool = True) -> OomPanel:
    """The explainer for ``exc``, an out-of-memory error of ``source`` (by default the one
    ``source_of_oom`` finds).

    The report is the source's ``oom_report``; the live blocks come from the ledger's end state
    of ``cell`` for that source when it has one, else from the source now. ``replay``: where the
    source recorded the events before the error, replay them under a small grid of configs (for
    about a second at most) and offer one that would have fit. A Dask worker's error (it names
    the worker) is explained from its own report only: this process's memory is not the
    worker's."""
    if source is None:
        source = source_of_oom(exc)
    report = source.oom_report(exc) if source is not None else None
    if report is None:
        report = _carried(exc)
    worker = getattr(exc, "worker", None)
    tasks = getattr(exc, "tasks", None)
    if isinstance(worker, str):
        readable = None
        ledger = namespace = None
        replay = False
    else:
        worker = None
        readable = source if source is not None and source.unavailable() is None else None
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    cell_files = ledger.cell_files if ledger is not None else None
    blocks: list[LiveBlock] = []
    states = ledger.states_of(source.name) if ledger is not None and source is not None else {}
    if readable is not None and cell is not None and cell in states:
        blocks = list(states[cell].values())
    elif readable is not None:
        blocks = blocks_now(readable, cell_files)
    holders = holder_rows(blocks, namespace, cell_files=cell_files,
                          budget=ledger.search_budget if ledger is not None else DEFAULT_BUDGET)
    fragmented = _fragmented(readable, report) if report is not None else 0
    steps = said_for(source, advice(report, holders, said=str(exc)))
    if source is not None:
        steps += [step for step in source.oom_steps(report)
                  if step not in steps and step not in str(exc)]
    if replay and readable is not None:  # a config that would have fit the recorded trace
        from jupyter_gpumem.notebook.replay_cmd import replay_offer

        _add_offer(steps, replay_offer(readable), fragmented)
    return OomPanel(message=message, report=report, fragmented=fragmented, holders=holders,
                    advice=steps, cell=cell, worker=worker,
                    tasks=tuple(str(k) for k in tasks) if isinstance(tasks, list | tuple) else (),
                    source=source.name if source is not None else "cupy")


def _carried(exc: BaseException) -> OomReport | None:
    """The report an error carries itself (ours, from a Dask worker too), if any."""
    report = getattr(exc, "report", None)
    return report if isinstance(report, OomReport) else None


def _names(names: Sequence[str], shown: int = 3) -> str:
    """``a, b, c and 9 more``: the first names of a row, so a row stays one line."""
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def _add_offer(steps: list[str], offer: str | None, fragmented: int) -> None:
    """The replay's offer among ``steps``: first when cached memory was fragmented (a config
    that fits then fixes the cause), else last."""
    if offer is not None:
        steps.insert(0 if fragmented else len(steps), offer)


