"""``MemorySource``: everything a view reads of a library's GPU memory, as one protocol.

Every view (the status line, the per-cell ledger and footer, ``%%gpumem_trace``, the session
plot, the replay, the OOM explainer, the live view, ``%gpumem summary/stats/snapshot/diff``) is
written once over this protocol and loops over the sources the user picked
(``%gpumem source NAME``). A source is a small adapter: our allocator (``sources.cupy``),
PyTorch's (``sources.torch``), JAX's (``sources.jax``), or a third party's, registered through
the entry-point group ``jupyter_gpumem.sources`` or ``jupyter_gpumem.register_source``.

What a source gives, in our data model (PyTorch's where PyTorch has a name):

- counters: ``memory_stats()`` in PyTorch's flat key grammar; keys it cannot fill are left out
  and read as 0;
- the memory now: ``snapshot()`` (segments and their blocks) and ``live_blocks()`` (the live
  blocks with their sizes and stacks, cheaply: the ledger asks after every cell);
- the history: ``record_history`` and ``recorded_trace`` (the events, or one line saying why
  there are none and what the source shows instead);
- a cell's own numbers: ``start_cell``/``end_cell`` give its peak without resetting the
  user's peak counters (Note [Cell peak from counters] in ``sources.base``);
- out of memory: ``is_oom(exc)`` and ``oom_report(exc)`` (an ``OomReport``);
- the status line's numbers and notes: ``status()``;
- for the holder search: ``owners`` (how to see that an object's memory lies in a block) and
  ``library_files`` (the frames of the library itself, passed over when naming a line);
- what it can show at all: ``shows`` (a row of the README's source table).

``SourceBase`` (``sources.base``) fills most of it from ``memory_stats`` and ``snapshot``.

Optional members (``OPTIONAL``), read where a source has them, with these defaults:
``history_mode()`` ("all" when ``history_on()``, else "off"), ``trace_history(stacks=,
max_entries=)`` (what a traced block does to the history, returning what puts it back; default:
``record_history("all")`` when off, "off" again after), ``trace_bands`` (a trace's timeline
bands: "site", or "holder" for a library of models and tensors), ``device_processes()`` (the
other processes on the source's device as ``(pid, name, bytes)``; default: None, not known) and
``allocator_config()`` (the allocator's settings in ``key:value,...`` form, "" for the defaults;
default: None, not known). JupyterLab's panel reads the last two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from jupyter_gpumem.data.codes import NO_STACK  # a block whose stack is not known
from jupyter_gpumem.data.owners import Owner

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Frame, Snapshot
    from jupyter_gpumem.engine.oom import OomReport

__all__ = [
    "FEATURES",
    "MEMBERS",
    "NO_STACK",
    "CellEnd",
    "CellMark",
    "CellPeak",
    "HistoryMode",
    "LiveBlocks",
    "MemorySource",
    "Owner",
    "Stacks",
    "Status",
    "missing_members",
    "shows_row",
]

HistoryMode = Literal["all", "state", "off"]

#: The rows of the source table (README): what a view can show, by the key a source's
#: ``shows`` answers under.
FEATURES: tuple[tuple[str, str], ...] = (
    ("stats", "counters (memory_stats)"),
    ("blocks", "segments and blocks"),
    ("stacks", "the line that allocated a live block"),
    ("history", "event history (timeline, %%gpumem_trace, replay)"),
    ("cell_peak", "each cell's own peak"),
    ("oom", "out-of-memory explainer"),
    ("holders", "the variables holding memory"),
    ("replay", "replay under other allocator configs"),
)


@dataclass(frozen=True)
class CellPeak:
    """The highest allocated bytes while a cell ran: exactly ``bytes``, or at most ``bytes``
    when ``exact`` is false (Note [Cell peak from counters] in ``sources.base``)."""

    bytes: int
    exact: bool = True
    how: str = "counter"  # "counter", "watermark", "history" or "bound"

    def text(self, format_bytes: Callable[[int], str]) -> str:
        return format_bytes(self.bytes) if self.exact else f"≤ {format_bytes(self.bytes)}"


@dataclass
class CellMark:
    """What a source read at the start of a cell, to work out the cell's own numbers at its end."""

    cell: int
    stats: dict[str, int]  # ``memory_stats()`` at the start
    start_us: int  # the wall clock at the start (µs), to cut the history's events
    start_event: int = -1  # position in the source's history, -1 when it records no events
    token: Any = None  # the source's own (our allocator: its watermark and the cell before)

    @property
    def allocated(self) -> int:
        return self.stats.get("allocated_bytes.all.current", 0)

    @property
    def peak(self) -> int:
        return self.stats.get("allocated_bytes.all.peak", 0)


@dataclass(frozen=True)
class CellEnd:
    """What a source says at the end of a cell: its peak, and the range of history events it
    made (``(-1, -1)`` when the source records none or cannot say)."""

    peak: CellPeak
    events: tuple[int, int] = (-1, -1)


class Stacks(Protocol):
    """Stack ids to frames (innermost first): our history's frame table, or a snapshot's."""

    def frames(self, stack_id: int) -> list[Frame]: ...


@dataclass(frozen=True)
class LiveBlocks:
    """The allocated blocks of a source now, cheaply: ``(address, size, requested, stack id)``
    rows in no order, and the table their stack ids index (None: no stacks known).

    ``owner`` is what the blocks belong to (our allocator object, a device): when it changes
    between two cells, the blocks are of another allocator and are not compared."""

    rows: Sequence[tuple[int, int, int, int]]
    stacks: Stacks | None = None
    owner: Any = None


@dataclass(frozen=True)
class Status:
    """The numbers and words of a source's status line."""

    backend: str  # the word before "device": "cuda", "sim", "torch", "jax"
    device: int
    device_name: str
    allocated: int
    peak: int
    reserved: int
    device_free: int | None  # None where the source cannot say
    device_total: int | None
    history: str  # "history on", "history off", "no event history (JAX)"...
    #: more to say, each a short phrase (JAX's preallocation, a cache hint)
    notes: tuple[str, ...] = field(default_factory=tuple)


class MemorySource(Protocol):
    """One library's GPU memory, as every view reads it. See the module docstring."""

    @property
    def name(self) -> str:
        """"cupy", "torch", "jax", or a third party's: the word in labelled rows."""

    @property
    def title(self) -> str:
        """What it is, in words: "PyTorch's allocator (torch.cuda.memory)"."""

    @property
    def shows(self) -> Mapping[str, str]:
        """The README table's answer for each key of ``FEATURES``: "yes", or what it shows
        instead."""

    @property
    def owners(self) -> Sequence[Owner]:
        """The array types whose memory the holder search should find."""

    @property
    def library_files(self) -> Sequence[str]:
        """File-name fragments of the library's own frames, passed over when naming a line."""

    def unavailable(self) -> str | None:
        """None when the source can be read now, else why not, in a few words."""

    @property
    def device_index(self) -> int: ...

    @property
    def device_name(self) -> str: ...

    def memory_stats(self) -> dict[str, int]:
        """PyTorch's flat ``memory_stats()`` keys (those the source can fill)."""

    def memory_allocated(self) -> int: ...

    def memory_reserved(self) -> int: ...

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device."""

    def snapshot(self) -> Snapshot:
        """Segments and blocks now, in our schema. A view's read: where the source can, it adds
        nothing to the user's own history."""

    def live_blocks(self) -> LiveBlocks:
        """The allocated blocks now, with their stack ids (cheaper than ``snapshot``)."""

    def memory_summary(self, abbreviated: bool = False) -> str: ...

    def status(self) -> Status: ...

    def history_on(self) -> bool:
        """Whether trace events are being recorded now."""

    def record_history(self, mode: HistoryMode, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        """Record every event ("all"), the stacks of live blocks only ("state"), or nothing."""

    def recorded_trace(self) -> Snapshot | str:
        """The events the source recorded (its snapshot with them in ``device_traces``, without
        the "snapshot" marks its own reads log), or one line saying why there are none and what
        it shows instead."""

    def start_cell(self, cell: int) -> CellMark: ...

    def end_cell(self, mark: CellMark, snapshot: Snapshot | None = None) -> CellEnd:
        """The cell's peak and events; ``snapshot`` is one the caller already read at the end."""

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this source's out-of-memory error."""

    def oom_report(self, exc: BaseException) -> OomReport | None:
        """The facts of an out-of-memory error of this source (None where it gives none)."""

    def oom_steps(self, report: OomReport | None) -> list[str]:
        """Next steps only this library has, for its out-of-memory error (JAX: XLA's
        preallocation), code between backticks; the explainer adds them to its own."""

    def replay_setting(self) -> str | None:
        """How a user sets an allocator config for this source (``PYTORCH_CUDA_ALLOC_CONF``...),
        for the replay's offer; None when its traces cannot be replayed."""


#: The members a source may have beside ``MEMBERS`` (see the module docstring).
OPTIONAL = ("history_mode", "trace_history", "trace_bands", "device_processes",
            "allocator_config")

#: The members every source has (what ``missing_members`` checks).
MEMBERS = ("name", "title", "shows", "owners", "library_files", "unavailable", "device_index",
           "device_name", "memory_stats", "memory_allocated", "memory_reserved", "mem_get_info",
           "snapshot", "live_blocks", "memory_summary", "status", "history_on",
           "record_history", "recorded_trace", "start_cell", "end_cell", "is_oom", "oom_report",
           "oom_steps", "replay_setting")


def missing_members(obj: object) -> list[str]:
    """The members of ``MemorySource`` that ``obj`` lacks (read from its class and its own
    attributes, so no property runs); every one for a class."""
    if isinstance(obj, type):
        return list(MEMBERS)
    own = getattr(obj, "__dict__", {})
    return [m for m in MEMBERS if m not in own and not hasattr(type(obj), m)]


def offers(source: MemorySource, feature: str) -> bool:
    """Whether ``source`` can show ``feature`` (a key of ``FEATURES``) at all: its ``shows``
    answer is there and does not begin with "no"."""
    answer = source.shows.get(feature, "no")
    return not answer.lower().startswith("no")


def shows_row(shows: Mapping[str, str]) -> list[str]:
    """``shows`` in ``FEATURES`` order, "no" for a key left out."""
    return [shows.get(key, "no") for key, _ in FEATURES]
