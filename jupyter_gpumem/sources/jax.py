"""JAX's device memory (XLA's client allocator) as a ``MemorySource``: "jax".

What JAX lets a reader see, and how each part of the protocol is filled from it (seen with
JAX 0.11 on an H200; ``jax`` is injected, so tests pass a fake module):

- counters: ``Device.memory_stats()``, XLA's BFC allocator's, mapped to PyTorch's keys
  (``STAT_KEYS``: Note [XLA's counters in PyTorch's words]); the peak never resets, so each
  cell's peak follows Note [Cell peak from counters] (``sources.base``);
- the memory now: ``jax.live_arrays()``, each array's buffer on this device (a sharded array's
  shard here) with its address (``unsafe_buffer_pointer()``), its bytes and the stack that made
  it (the array's ``traceback``, the one ``jax.profiler.device_memory_profile()`` reports).
  XLA's pool itself, its regions and its free blocks are not visible: the snapshot has one
  segment a live buffer (Note [One segment a live array]);
- the history: none. XLA records no allocation events; ``recorded_trace`` says so and what JAX
  gives instead, the stacks of the live arrays (``memory_profile()`` reads them from
  ``device_memory_profile()``'s pprof);
- out of memory: ``jax.errors.JaxRuntimeError`` whose message starts ``RESOURCE_EXHAUSTED``
  (``Out of memory while trying to allocate 160.00GiB with allocator GPU_0_bfc``), and the next
  steps only JAX has: XLA's memory fraction and preallocation, ``jax.clear_caches()``;
- the status line's note: what XLA's client preallocates (Note [XLA preallocates]).

JAX's GPU backend is never started here: until the user's first array starts it, the source is
not readable (``unavailable``), so that ``%gpumem source all`` takes no memory for JAX, and
``XLA_PYTHON_CLIENT_*`` set in a later cell still apply.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.data.owners import Owner
from jupyter_gpumem.data.schema import Frame
from jupyter_gpumem.data.units import format_bytes
from jupyter_gpumem.sources.base import SourceBase, wall_us
from jupyter_gpumem.sources.protocol import NO_STACK, CellMark, CellPeak, HistoryMode, LiveBlocks

if TYPE_CHECKING:
    from jupyter_gpumem.data.pprof import MemoryProfile
    from jupyter_gpumem.data.schema import SegmentInfo, Snapshot
    from jupyter_gpumem.engine.oom import OomReport

__all__ = ["DEFAULT_MEM_FRACTION", "JAX_OWNERS", "STAT_KEYS", "JaxSource", "preallocation_note"]

#: The share of the device XLA's client takes when ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is unset.
DEFAULT_MEM_FRACTION = 0.75
#: XLA's BFC allocator rounds every request up to this many bytes.
XLA_ROUNDING = 256
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")

#: PyTorch's flat key <- XLA's ``memory_stats()`` key (Note [XLA's counters in PyTorch's words]).
STAT_KEYS = (
    ("allocated_bytes.all.current", "bytes_in_use"),
    ("allocated_bytes.all.peak", "peak_bytes_in_use"),
    ("active_bytes.all.current", "bytes_in_use"),
    ("active_bytes.all.peak", "peak_bytes_in_use"),
    ("reserved_bytes.all.current", "pool_bytes"),
    ("reserved_bytes.all.peak", "peak_pool_bytes"),
    ("allocation.all.allocated", "num_allocs"),
)


# -- the holder search's owner --------------------------------------------------------------------

def _jax_array_type(t: type) -> bool:
    """A ``jax.Array`` by its surface (jax is never imported for it)."""
    return (callable(getattr(t, "unsafe_buffer_pointer", None))
            and getattr(t, "addressable_shards", None) is not None
            and getattr(t, "nbytes", None) is not None)


def _jax_memory(obj: Any) -> tuple[int, int] | None:
    """The buffer of a JAX array: its own, or its first addressable shard's when it is sharded
    over several devices (``unsafe_buffer_pointer`` refuses those)."""
    try:
        return int(obj.unsafe_buffer_pointer()), int(obj.nbytes)
    except Exception:  # sharded, or deleted (then the shard raises too)
        shard = obj.addressable_shards[0].data
        return int(shard.unsafe_buffer_pointer()), int(shard.nbytes)


#: JAX's arrays (``jax.Array``; ``jaxlib``'s ``ArrayImpl``), found in pytrees by their paths.
JAX_OWNERS = (Owner("JAX array", _jax_array_type, _jax_memory),)

_REQUEST = re.compile(r"(?:trying to allocate|allocate request for) ([0-9.]+ ?[KMGTP]?i?B)"
                      r"(?: \((\d+)B\))?")


class _TracebackStacks:
    """The stacks of live arrays by stack id: one id for each distinct creation traceback (JAX's
    tracebacks compare equal when their frames do), turned into frames only when asked."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}
        self._tracebacks: list[Any] = []
        self._frames: dict[int, list[Frame]] = {}

    def add(self, traceback: Any) -> int:
        if traceback is None:
            return NO_STACK
        try:
            found = self._ids.get(traceback)
            if found is None:
                found = self._ids[traceback] = len(self._tracebacks)
                self._tracebacks.append(traceback)
        except TypeError:  # a traceback that cannot be hashed: one id of its own
            found = len(self._tracebacks)
            self._tracebacks.append(traceback)
        return found

    def frames(self, stack_id: int) -> list[Frame]:
        if not 0 <= stack_id < len(self._tracebacks):
            return []
        made = self._frames.get(stack_id)
        if made is None:
            made = self._frames[stack_id] = _frames_of(self._tracebacks[stack_id])
        return made


def _frames_of(traceback: Any) -> list[Frame]:
    """A JAX traceback's frames (``file_name``, ``line_num``, ``function_name``), innermost
    first as JAX gives them."""
    try:
        return [Frame(filename=str(f.file_name), line=int(f.line_num), name=str(f.function_name))
                for f in traceback.frames]
    except Exception:  # a traceback of another shape: no frames rather than a wrong line
        return []


class JaxSource(SourceBase):
    """JAX's device memory as a ``MemorySource`` (see the module docstring).

    ``jax_module`` is ``jax`` (imported when not given); ``device`` the position of the device
    read in ``jax.devices()`` (the first by default); ``environ`` where ``XLA_PYTHON_CLIENT_*``
    are read (``os.environ``); ``device_memory(index)`` gives ``(free, total)`` bytes of the
    device (JAX cannot say: NVML by default, through ``CUDA_VISIBLE_DEVICES``)."""

    name = "jax"
    title = "JAX's allocator (XLA's client)"
    shows = MappingProxyType({
        "stats": "yes: XLA's counters (in use, peak, pool)",
        "blocks": "live arrays only: XLA's pool and its free blocks are not visible",
        "stacks": "yes: the stack that made each live array",
        "history": "no: XLA records no allocation events",
        "cell_peak": "yes; a bound (≤) where the counters cannot tell",
        "oom": "yes, with XLA's memory fraction and preallocation",
        "holders": "yes: JAX arrays, in pytrees too (`params['dense']['w']`)",
        "replay": "no: there are no events to replay"})
    owners = JAX_OWNERS
    library_files = ("/jax/", "/jaxlib/", "/flax/", "/optax/", "/equinox/", "\\jax\\",
                     "\\jaxlib\\", "\\flax\\", "\\optax\\", "\\equinox\\")

    def __init__(self, jax_module: Any = None, *, device: int | None = None,
                 environ: Mapping[str, str] | None = None,
                 device_memory: Callable[[int], tuple[int, int]] | None = None,
                 clock_us: Callable[[], int] = wall_us) -> None:
        super().__init__(clock_us=clock_us)
        if jax_module is None:
            import jax

            jax_module = jax
        self.jax = jax_module
        self._position = device
        self._environ = os.environ if environ is None else environ
        self._device_memory = device_memory

    # -- the device ------------------------------------------------------------------------

    def _started(self) -> bool:
        """Whether JAX has started its backends (asked without starting them); True for a JAX
        that cannot say."""
        bridge = getattr(getattr(self.jax, "_src", None), "xla_bridge", None)
        probe = getattr(bridge, "backends_are_initialized", None)
        if not callable(probe):
            return True
        return bool(probe())

    def unavailable(self) -> str | None:
        if not self._started():
            return ("JAX has not started its GPU backend yet (its first array does; gpumem "
                    "never does)")
        try:
            device = self.jax_device()
        except Exception as exc:
            return f"JAX cannot say its devices ({type(exc).__name__}: {exc})"
        if device.platform not in _GPU_PLATFORMS:
            return f"JAX sees no GPU (its default backend is {device.platform})"
        return None

    def jax_device(self) -> Any:
        """The ``jax.Device`` read."""
        return self.jax.devices()[self._position or 0]

    @property
    def device_index(self) -> int:
        return int(self.jax_device().id)

    @property
    def device_name(self) -> str:
        return str(getattr(self.jax_device(), "device_kind", "") or f"gpu:{self.device_index}")

    def mem_get_info(self) -> tuple[int, int]:
        device = self.jax_device()
        if self._device_memory is not None:
            free, total = self._device_memory(int(device.id))
            return int(free), int(total)
        from jupyter_gpumem.devices import nvml

        ordinal = int(getattr(device, "local_hardware_id", None) or device.id)
        free, total, _used = nvml.memory_info(_nvml_index(ordinal, self._environ))
        return int(free), int(total)

    # -- counters: Note [XLA's counters in PyTorch's words] -----------------------------------

    def xla_stats(self) -> dict[str, int] | None:
        """XLA's own ``memory_stats()`` of the device; None when its allocator keeps none
        (``XLA_PYTHON_CLIENT_ALLOCATOR=platform``)."""
        raw = self.jax_device().memory_stats()
        if raw is None:
            return None
        return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}

    def memory_stats(self) -> dict[str, int]:
        raw = self.xla_stats()
        if raw is None:  # no counters: the live arrays are all there is to count
            sizes = [size for _addr, size, _tb in self._buffers()]
            return {"allocated_bytes.all.current": sum(sizes), "active_bytes.all.current":
                    sum(sizes), "allocation.all.current": len(sizes)}
        return {ours: raw[theirs] for ours, theirs in STAT_KEYS if theirs in raw}

    def cell_peak(self, mark: CellMark, snapshot: Snapshot | None = None) -> CellPeak:
        """Note [Cell peak from counters]; with no counters (the platform allocator), the larger
        of the start and the end, which the peak is at least: not exact."""
        if "allocated_bytes.all.peak" in mark.stats:
            return super().cell_peak(mark, snapshot)
        end = self.memory_stats().get("allocated_bytes.all.current", 0)
        return CellPeak(max(mark.allocated, end), False, "bound")

    # -- the memory now: Note [One segment a live array] --------------------------------------

    def _buffers(self) -> Iterator[tuple[int, int, Any]]:
        """``(address, bytes, traceback)`` of every live array's buffer on this device, each
        buffer once."""
        device = self.jax_device()
        seen: set[int] = set()
        for array in self.jax.live_arrays():
            try:
                devices = array.devices()
                if len(devices) == 1:
                    if device not in devices:
                        continue
                    found = [(array.unsafe_buffer_pointer(), array.nbytes)]
                else:  # sharded: its shards on this device
                    found = [(s.data.unsafe_buffer_pointer(), s.data.nbytes)
                             for s in array.addressable_shards if s.device == device]
                traceback = getattr(array, "traceback", None)
            except Exception:  # deleted or donated since it was listed
                continue
            for address, size in found:
                address, size = int(address), int(size)
                if size > 0 and address not in seen:
                    seen.add(address)
                    yield address, size, traceback

    def live_blocks(self) -> LiveBlocks:
        stacks = _TracebackStacks()
        rows = [(address, size, size, stacks.add(tb)) for address, size, tb in self._buffers()]
        return LiveBlocks(rows, stacks, owner=(self.name, self.device_index))

    def snapshot(self) -> Snapshot:
        from jupyter_gpumem.data.schema import check_snapshot

        index = self.device_index
        stacks = _TracebackStacks()
        segments = [_segment(index, address, size, stacks.frames(stacks.add(tb)))
                    for address, size, tb in sorted(self._buffers(), key=lambda b: b[0])]
        try:
            free, total = self.mem_get_info()
            device: dict[str, object] = {"device_free": free, "device_total": total}
        except Exception:  # NVML missing: the snapshot says what it can
            device = {}
        info: dict[str, object] = {"device": index, "device_name": self.device_name,
                                   "source": "jax", **device}
        raw = self.xla_stats()
        if raw is not None:
            info["xla_memory_stats"] = raw
        snap: dict[str, Any] = {"segments": segments, "device_traces": [],
                                "jupyter_gpumem": info}
        return check_snapshot(snap)

    def memory_profile(self) -> MemoryProfile:
        """``jax.profiler.device_memory_profile()`` read: the live buffers and compiled
        executables of every device, by the stack that made them."""
        from jupyter_gpumem.data.pprof import read_profile

        return read_profile(self.jax.profiler.device_memory_profile())

    def memory_summary(self, abbreviated: bool = False) -> str:
        """XLA's counters of the device, in words (PyTorch's table would be mostly rows XLA
        does not keep); ``abbreviated`` leaves out the limit and the largest blocks."""
        raw = self.xla_stats()
        buffers = [size for _addr, size, _tb in self._buffers()]
        head = (f"JAX memory summary, device {self.device_index} ({self.device_name}): "
                f"XLA's counters")
        live = f"{len(buffers)} ({format_bytes(sum(buffers))})"
        if raw is None:
            return (f"{head}\n  XLA_PYTHON_CLIENT_ALLOCATOR=platform: no counters\n"
                    f"  {'live arrays':<24}{live}\n")
        rows = [("in use (allocated)", raw.get("bytes_in_use", 0), raw.get("peak_bytes_in_use")),
                ("pool (reserved)", raw.get("pool_bytes", 0), raw.get("peak_pool_bytes"))]
        if not abbreviated:
            rows += [("limit (bytes_limit)", raw.get("bytes_limit", 0), None),
                     ("largest free block", raw.get("largest_free_block_bytes", 0), None),
                     ("largest allocation", raw.get("largest_alloc_size", 0), None)]
        lines = [head]
        for label, value, peak in rows:
            line = f"  {label:<24}{format_bytes(value):>12}"
            lines.append(line + (f"   peak {format_bytes(peak)}" if peak is not None else ""))
        lines.append(f"  {'allocations so far':<24}{raw.get('num_allocs', 0):>12,}")
        lines.append(f"  {'live arrays':<24}{live:>12}")
        return "\n".join(lines) + "\n"

    # -- the status line: Note [XLA preallocates] ----------------------------------------------

    def history_words(self) -> str:
        return "no event history (JAX)"

    def status_notes(self) -> tuple[str, ...]:
        raw = self.xla_stats()
        try:
            total: int | None = self.mem_get_info()[1]
        except Exception:
            total = None
        note = preallocation_note(self._environ, raw, total)
        return (note,) if note else ()

    # -- history ---------------------------------------------------------------------------

    def history_on(self) -> bool:
        return False

    def record_history(self, mode: HistoryMode, *, stacks: bool = True,
                       max_entries: int = 100_000) -> None:
        """JAX always keeps the stacks of live arrays ("state") and can record no events."""
        if mode == "all":
            raise ValueError("JAX records no event history: XLA keeps no allocation events "
                             "(the stack of each live array it always keeps)")

    def recorded_trace(self) -> Snapshot | str:
        why = ("gpumem: JAX records no event history (XLA keeps no allocation events); what it "
               "gives is the stack that made each live array (jax.profiler."
               "device_memory_profile())")
        try:
            sites = self.profile_sites()
        except Exception as exc:  # a JAX without the profiler, or a profile we cannot read
            return f"{why}, which could not be read here ({type(exc).__name__})."
        if not sites:
            return f"{why}: no array is live on device {self.device_index}."
        held = sum(size for _site, size, _n in sites)
        arrays = sum(n for _site, _size, n in sites)
        top = ", ".join(f"{site} ({format_bytes(size)})" for site, size, _n in sites[:3])
        more = f" and {len(sites) - 3} more" if len(sites) > 3 else ""
        return (f"{why}: {arrays} live array{'s' if arrays != 1 else ''}, {format_bytes(held)}, "
                f"from {top}{more}.")

    def profile_sites(self, cell_files: Mapping[str, int] | None = None
                      ) -> list[tuple[str, int, int]]:
        """``(line, bytes, arrays)`` of this device's live buffers in the memory profile, by
        the line of the user's code that made them, most bytes first."""
        from jupyter_gpumem.data.sites import site_of

        device = f"{self.jax_device().platform}:{self.device_index}"
        names = {device, f"cuda:{self.device_index}", f"gpu:{self.device_index}",
                 f"rocm:{self.device_index}"}
        by_site: dict[str, list[int]] = {}
        for sample in self.memory_profile().buffers():
            if sample.labels.get("device", device) not in names:
                continue
            site = site_of(list(sample.frames), cell_files) or "(no line of yours)"
            entry = by_site.setdefault(site, [0, 0])
            entry[0] += sample.bytes
            entry[1] += sample.count
        return sorted(((s, b, n) for s, (b, n) in by_site.items()), key=lambda r: (-r[1], r[0]))

    # -- out of memory -------------------------------------------------------------------------

    @property
    def oom_errors(self) -> tuple[type[BaseException], ...]:  # type: ignore[override]
        found = getattr(getattr(self.jax, "errors", None), "JaxRuntimeError", None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return (found,)
        return ()

    def is_oom(self, exc: BaseException) -> bool:
        """XLA's out-of-memory error: a ``JaxRuntimeError`` (``XlaRuntimeError`` in older
        JAX) whose message starts ``RESOURCE_EXHAUSTED``."""
        runtime = isinstance(exc, self.oom_errors) or any(
            c.__name__ in ("JaxRuntimeError", "XlaRuntimeError")
            and c.__module__.split(".")[0] in ("jax", "jaxlib") for c in type(exc).__mro__)
        return runtime and str(exc).lstrip().startswith("RESOURCE_EXHAUSTED")

    def oom_report(self, exc: BaseException) -> OomReport | None:
        """The request from XLA's message ("trying to allocate 160.00GiB", so to two decimals;
        the exact bytes where XLA gives them), the rest from XLA's counters now. Where NVML
        cannot say the device's free and total bytes, XLA's limit stands for the device."""
        from jupyter_gpumem.data.units import parse_bytes
        from jupyter_gpumem.engine.oom import OomReport

        m = _REQUEST.search(str(exc))
        if m is None:
            return None
        try:
            requested = int(m.group(2)) if m.group(2) else parse_bytes(m.group(1).replace(" ", ""))
        except ValueError:
            return None
        raw = self.xla_stats() or {}
        st = self.memory_stats()
        allocated = st.get("allocated_bytes.all.current", 0)
        reserved = st.get("reserved_bytes.all.current", allocated)
        try:
            free, total = self.mem_get_info()
        except Exception:
            total = raw.get("bytes_limit", reserved)
            free = max(0, total - reserved)
        rounded = -(-requested // XLA_ROUNDING) * XLA_ROUNDING
        return OomReport(requested=requested, rounded=rounded, segment_size=rounded, stream=0,
                         device=self.device_index, device_name=self.device_name,
                         device_free=free, device_total=total, allocated=allocated,
                         reserved=reserved,
                         largest_free_block=raw.get("largest_free_block_bytes", 0),
                         free_cached=max(0, reserved - allocated), cap=None, fraction=None,
                         max_split_size=None)

    def oom_steps(self, report: OomReport | None) -> list[str]:
        """What only JAX has for an out-of-memory error, each step given when it is true of
        ``report``: XLA's limit (``XLA_PYTHON_CLIENT_MEM_FRACTION``), a fragmented pool, the
        arrays to ``del`` (``jax.live_arrays()``), and ``jax.clear_caches()``."""
        raw = self.xla_stats() or {}
        limit = raw.get("bytes_limit")
        steps: list[str] = []
        if report is not None and limit:
            fraction = _fraction(self._environ) or DEFAULT_MEM_FRACTION
            if report.rounded <= report.device_total and report.allocated + report.rounded > limit:
                steps.append(
                    f"XLA lets JAX use at most {format_bytes(limit)} of this device "
                    f"({fraction:.0%}, `XLA_PYTHON_CLIENT_MEM_FRACTION`): set "
                    f"`XLA_PYTHON_CLIENT_MEM_FRACTION=.95` before JAX starts (restart the "
                    f"kernel) to let it use more.")
            if report.free_cached >= report.rounded > report.largest_free_block:
                steps.append(
                    f"XLA's pool has {format_bytes(report.free_cached)} free, but in pieces of at "
                    f"most {format_bytes(report.largest_free_block)}: "
                    f"`XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async` (set before JAX starts) leaves "
                    f"placing each array to CUDA.")
        if report is None or report.allocated:
            steps.append("`del` the arrays you no longer need (`jax.live_arrays()` lists every "
                         "live one): their memory goes back to XLA's pool at once.")
        steps.append("`jax.clear_caches()` drops the functions JAX compiled, and what they keep "
                     "on the device.")
        return steps


def _segment(device: int, address: int, size: int, frames: list[Frame]) -> SegmentInfo:
    """One live buffer as a segment of its own, wholly allocated."""
    from jupyter_gpumem.data.sizes import MiB

    return {"device": device, "address": address, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "small" if size <= MiB else "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": frames,
            "blocks": [{"address": address, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": frames}]}


def _nvml_index(ordinal: int, environ: Mapping[str, str]) -> int:
    """NVML's index of the CUDA device ``ordinal`` (``CUDA_VISIBLE_DEVICES`` renumbers CUDA's
    devices, not NVML's); LookupError when it lists devices by UUID."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return ordinal
    listed = [v.strip() for v in visible.split(",")]
    if ordinal >= len(listed) or not listed[ordinal].isdigit():
        raise LookupError(f"CUDA_VISIBLE_DEVICES={visible!r}: NVML's index of CUDA device "
                          f"{ordinal} is not known")
    return int(listed[ordinal])


def _fraction(environ: Mapping[str, str]) -> float | None:
    text = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0.0 < value <= 1.0 else None


def _preallocates(environ: Mapping[str, str]) -> bool:
    return environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true") not in ("0", "false", "False")


def preallocation_note(environ: Mapping[str, str], stats: Mapping[str, int] | None,
                       device_total: int | None) -> str | None:
    """What XLA's client takes of the device, for the status line (Note [XLA preallocates]);
    None when there is nothing to say."""
    allocator = environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    if allocator == "platform" or stats is None:
        return ("XLA_PYTHON_CLIENT_ALLOCATOR=platform: XLA takes each array from the device and "
                "keeps no counters (allocated is the live arrays' bytes; no peak, no pool)")
    limit = stats.get("bytes_limit")
    if not limit:
        return None
    fraction = _fraction(environ)
    share = fraction if fraction is not None else (
        limit / device_total if device_total else DEFAULT_MEM_FRACTION)
    named = "`XLA_PYTHON_CLIENT_MEM_FRACTION`" if fraction is not None else "XLA's default"
    if _preallocates(environ) and allocator != "cuda_async":
        tail = ("`XLA_PYTHON_CLIENT_PREALLOCATE=false` takes only what JAX uses" +
                ("" if fraction is not None else
                 ", `XLA_PYTHON_CLIENT_MEM_FRACTION=.5` less") + " (set before JAX starts)")
        return (f"XLA preallocates {share:.0%} of the device for JAX ({format_bytes(limit)}, "
                f"{named}), used or not: {tail}")
    return (f"XLA takes memory as JAX needs it, up to {share:.0%} of the device "
            f"({format_bytes(limit)}, {named})")


# Note [XLA's counters in PyTorch's words]: XLA's GPU client allocates through a BFC allocator
# (TensorFlow's) over a pool it takes from the device. Its ``memory_stats()``: ``bytes_in_use``
# (the live buffers, each rounded to 256 bytes) and its peak, which is PyTorch's allocated;
# ``pool_bytes`` (what the pool holds of the device: with preallocation all of ``bytes_limit``
# from the first array on; else the regions grown so far) and its peak, which is PyTorch's
# reserved; ``num_allocs`` (every allocation so far, so allocation.all.allocated). Not
# ``bytes_reserved``: that is memory set aside for XLA's own reservations (TPU programs), 0 on
# a GPU, and not what PyTorch calls reserved. ``bytes_limit`` (the most the pool may take),
# ``largest_alloc_size`` and ``largest_free_block_bytes`` have no PyTorch key: ``xla_stats``
# gives them, the snapshot keeps them under ``xla_memory_stats``, and the OOM report reads the
# largest free block. XLA keeps no count of live allocations nor of frees. With
# ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` there is no pool and ``memory_stats()`` is None:
# allocated is then the live arrays' bytes, and a cell's peak only a bound.
#
# Note [One segment a live array]: XLA's pool, its regions and its free blocks are not visible
# from Python, only the live arrays' buffers are (``jax.live_arrays()``). So the snapshot has one
# segment a live buffer, wholly allocated, and no free block: its segments add up to allocated,
# not to reserved (``memory_stats`` says reserved). A buffer XLA holds for itself (a compiled
# function's temporaries while it runs, its constants) is in ``bytes_in_use`` but in no segment.
# A sharded array is one buffer on each device: a source reads one device, so it lists the
# shards on its own.
#
# Note [XLA preallocates]: by default XLA's client takes 75% of the device at JAX's first array,
# whether JAX uses it or not (``bytes_limit``: 104.9 GiB of an H200's 140.4 GiB), so another
# library in the same process, or another process, finds the device nearly full: the first
# thing JAX users meet. ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` grows the pool as JAX needs it
# (up to the same limit), ``XLA_PYTHON_CLIENT_MEM_FRACTION`` sets the share, and
# ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` takes each array from the device itself; each is read
# when JAX starts, so the status line says which apply, from the environment and XLA's limit.
