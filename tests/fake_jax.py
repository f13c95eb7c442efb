"""A stand-in for ``jax`` with the surface ``sources.jax`` reads, as JAX 0.11 showed it on an
H200 (CUDA 13): ``jax.devices()``, ``Device.memory_stats()`` (XLA's BFC counters, its limit 75 %
of the device, preallocated at the first array unless ``XLA_PYTHON_CLIENT_PREALLOCATE=false``;
None with the platform allocator), ``jax.live_arrays()`` (arrays with ``nbytes``,
``unsafe_buffer_pointer()``, ``devices()``, ``addressable_shards`` and a creation
``traceback``), ``jax.profiler.device_memory_profile()`` (a gzip-compressed pprof, encoded here
by protobuf's rules), ``jax.errors.JaxRuntimeError`` (``RESOURCE_EXHAUSTED: Out of memory while
trying to allocate 160.00GiB with allocator GPU_0_bfc``) and whether the backends started
(``jax._src.xla_bridge.backends_are_initialized()``, false until the first array or
``devices()``).

``FakeJax.array(nbytes, line=...)`` makes an array as a cell's line would; deleting the last
reference frees it, as in JAX.
"""

from __future__ import annotations

import gzip
import types
import weakref
from dataclasses import dataclass
from typing import Any

MiB, GiB = 1 << 20, 1 << 30
#: What the H200 showed: NVML's total, XLA's limit (75 % of what was free), the first address.
H200_TOTAL = 150_754_820_096
H200_LIMIT = 112_583_507_968
FIRST_ADDRESS = 12_918_456_320
#: The frames JAX puts inside a stack (innermost first), above the user's line.
JAX_FRAMES = (
    ("/venv/lib/python3.12/site-packages/jax/_src/interpreters/pxla.py",
     "ExecuteReplicated.__call__", 420),
    ("/venv/lib/python3.12/site-packages/jax/_src/pjit.py", "_pjit_call_impl_python", 1166),
    ("/venv/lib/python3.12/site-packages/jax/_src/numpy/array_creation.py", "zeros", 95),
)


class JaxRuntimeError(RuntimeError):
    """``jax.errors.JaxRuntimeError``."""


def human_bytes(n: int) -> str:
    """XLA's ``HumanReadableNumBytes``: ``512B``, ``160.00GiB``."""
    if n < 1024:
        return f"{n}B"
    value, units = float(n) / 1024, "KMGTPE"
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.2f}{units[0]}iB"


@dataclass(frozen=True)
class Frame:
    """jaxlib's ``Frame``."""

    file_name: str
    function_name: str
    function_start_line: int
    line_num: int


class Traceback:
    """jaxlib's ``Traceback``: frames innermost first; equal when the frames are."""

    def __init__(self, frames: tuple[Frame, ...]) -> None:
        self.frames = list(frames)
        self._key = frames

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Traceback) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)


def traceback_at(filename: str, line: int, name: str = "<module>") -> Traceback:
    inner = tuple(Frame(f, fn, 1, n) for f, fn, n in JAX_FRAMES)
    return Traceback((*inner, Frame(filename, name, 1, line)))


class Device:
    """A ``jax.Device`` with XLA's BFC allocator counters."""

    def __init__(self, owner: FakeJax, index: int, *, platform: str = "gpu",
                 kind: str = "NVIDIA H200", total: int = H200_TOTAL, limit: int = H200_LIMIT,
                 preallocate: bool = True, allocator: str = "bfc") -> None:
        self._owner = owner
        self.id = self.local_hardware_id = index
        self.platform = platform
        self.device_kind = kind
        self.total = total
        self.limit = limit
        self.preallocate = preallocate
        self.allocator = allocator
        self.in_use = self.peak = self.pool = self.num_allocs = 0
        self.largest_alloc = 0
        self.largest_free: int | None = None  # None: the pool's free bytes are one piece
        self._next = FIRST_ADDRESS + index * (1 << 40)

    def __repr__(self) -> str:
        return f"CudaDevice(id={self.id})"

    def memory_stats(self) -> dict[str, int] | None:
        if self.allocator == "platform":
            return None
        free = self.pool - self.in_use
        return {"num_allocs": self.num_allocs, "bytes_in_use": self.in_use,
                "peak_bytes_in_use": self.peak, "largest_alloc_size": self.largest_alloc,
                "bytes_limit": self.limit, "bytes_reserved": 0, "peak_bytes_reserved": 0,
                "largest_free_block_bytes": free if self.largest_free is None
                else self.largest_free,
                "pool_bytes": self.pool, "peak_pool_bytes": self.pool}

    def allocate(self, nbytes: int) -> int:
        rounded = max(256, -(-nbytes // 256) * 256)
        if self.in_use + rounded > self.limit:
            raise JaxRuntimeError(
                f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                f"{human_bytes(nbytes)} with allocator GPU_{self.id}_bfc on device {self.id}. "
                f"[tf-allocator-allocation-error=''] [executable_name='jit_broadcast_in_dim']")
        self.in_use += rounded
        self.peak = max(self.peak, self.in_use)
        self.num_allocs += 1
        self.largest_alloc = max(self.largest_alloc, rounded)
        if self.preallocate:
            self.pool = self.limit
        else:  # the pool grows by 2 MiB regions at least
            self.pool = max(self.pool, -(-self.in_use // (2 * MiB)) * 2 * MiB)
        address = self._next
        self._next += rounded
        return address

    def release(self, nbytes: int) -> None:
        self.in_use -= max(256, -(-nbytes // 256) * 256)


@dataclass
class Shard:
    """``jax.Shard``: a device and the single-device array of its buffer."""

    device: Device
    data: ArrayImpl


class ArrayImpl:
    """``jaxlib._jax.ArrayImpl``: one buffer on one device, or shards on several."""

    def __init__(self, owner: FakeJax, device: Device | None, nbytes: int,
                 traceback: Traceback | None, shards: list[ArrayImpl] | None = None) -> None:
        self._owner = owner
        self._device = device
        self._nbytes = nbytes
        self._shards = shards
        self.traceback = traceback
        self._deleted = True  # until its buffer is allocated: a failed one frees nothing
        self._address = device.allocate(nbytes) if device is not None and nbytes else 0
        self._deleted = False

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def unsafe_buffer_pointer(self) -> int:
        if self._deleted:
            raise JaxRuntimeError("INVALID_ARGUMENT: UnsafeBufferPointer called on deleted or "
                                  "donated buffer")
        if self._shards is not None:
            raise JaxRuntimeError("INVALID_ARGUMENT: unsafe_buffer_pointer() is supported only "
                                  "for unsharded arrays.")
        return self._address

    def devices(self) -> set[Device]:
        if self._shards is not None:
            return {s._device for s in self._shards if s._device is not None}
        return {self._device} if self._device is not None else set()

    @property
    def addressable_shards(self) -> list[Shard]:
        if self._shards is not None:
            return [Shard(s._device, s) for s in self._shards if s._device is not None]
        assert self._device is not None
        return [Shard(self._device, self)]

    def is_deleted(self) -> bool:
        return self._deleted

    def delete(self) -> None:
        if not self._deleted:
            self._deleted = True
            if self._device is not None and self._nbytes:
                self._device.release(self._nbytes)
            for shard in self._shards or ():
                shard.delete()

    def __del__(self) -> None:
        self.delete()


class FakeJax(types.SimpleNamespace):
    """The ``jax`` module: its devices, live arrays, profiler, errors and backend state."""

    def __init__(self, *, gpus: int = 1, platform: str = "gpu", preallocate: bool = True,
                 allocator: str = "bfc", started: bool = True) -> None:
        super().__init__()
        self._devices = [Device(self, i, platform=platform, preallocate=preallocate,
                                allocator=allocator) for i in range(gpus)]
        self._started = started
        self._arrays: weakref.WeakSet[ArrayImpl] = weakref.WeakSet()
        self._order: dict[int, int] = {}  # id -> when made: live_arrays() lists newest first
        self.errors = types.SimpleNamespace(JaxRuntimeError=JaxRuntimeError)
        self.profiler = types.SimpleNamespace(device_memory_profile=self.device_memory_profile)
        bridge = types.SimpleNamespace(backends_are_initialized=lambda: self._started)
        self._src = types.SimpleNamespace(xla_bridge=bridge)
        self.Array = ArrayImpl
        self.cleared = 0

    def devices(self) -> list[Device]:
        self._started = True  # as jax.devices() starts the backends
        return list(self._devices)

    def live_arrays(self) -> list[ArrayImpl]:
        arrays = [a for a in self._arrays if not a.is_deleted()]
        return sorted(arrays, key=lambda a: -self._order.get(id(a), 0))

    def clear_caches(self) -> None:
        self.cleared += 1

    def array(self, nbytes: int, *, line: int = 1, file: str = "<ipython-input-3-abc>",
              device: int = 0, traceback: Traceback | None = None) -> ArrayImpl:
        """An array of ``nbytes`` on ``device``, made at ``file:line``."""
        self._started = True
        tb = traceback if traceback is not None else traceback_at(file, line)
        return self._keep(ArrayImpl(self, self._devices[device], nbytes, tb))

    def sharded(self, nbytes_each: int, *, line: int = 1,
                file: str = "<ipython-input-3-abc>") -> ArrayImpl:
        """An array sharded over every device, ``nbytes_each`` on each."""
        self._started = True
        tb = traceback_at(file, line)
        shards = [ArrayImpl(self, d, nbytes_each, tb) for d in self._devices]
        return self._keep(ArrayImpl(self, None, nbytes_each * len(shards), tb, shards))

    def _keep(self, array: ArrayImpl) -> ArrayImpl:
        self._arrays.add(array)
        self._order[id(array)] = len(self._order) + 1
        return array

    def device_memory_profile(self) -> bytes:
        """The live buffers as pprof writes them: gzip-compressed ``profile.proto``."""
        return gzip.compress(encode_profile(
            [(a.traceback, s.data.nbytes, f"cuda:{s.device.id}") for a in self.live_arrays()
             for s in a.addressable_shards]))


# -- pprof, by protobuf's rules -----------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _packed(values: list[int]) -> bytes:
    return b"".join(_varint(v) for v in values)


def encode_profile(buffers: list[tuple[Any, int, str]]) -> bytes:
    """A pprof ``Profile`` of ``(traceback, bytes, device)`` buffers, one sample each, as JAX
    writes it: sample types allocations/count and space/bytes, labels kind and device."""
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    functions: dict[tuple[str, str], int] = {}
    locations: dict[tuple[int, int], int] = {}
    samples = []
    types_ = [_field(1, _field(1, s("allocations")) + _field(2, s("count"))),
              _field(1, _field(1, s("space")) + _field(2, s("bytes")))]
    for tb, nbytes, device in buffers:
        ids = []
        for f in (tb.frames if tb is not None else ()):
            fn = functions.setdefault((f.function_name, f.file_name), len(functions) + 1)
            ids.append(locations.setdefault((fn, f.line_num), len(locations) + 1))
        labels = (_field(3, _field(1, s("kind")) + _field(2, s("buffer")))
                  + _field(3, _field(1, s("device")) + _field(2, s(device))))
        samples.append(_field(2, _field(1, _packed(ids)) + _field(2, _packed([1, nbytes]))
                              + labels))
    body = b"".join(types_) + b"".join(samples)
    for (fn, line), lid in locations.items():
        body += _field(4, _field(1, lid) + _field(4, _field(1, fn) + _field(2, line)))
    for (name, filename), fid in functions.items():
        body += _field(5, _field(1, fid) + _field(2, s(name)) + _field(3, s(name))
                       + _field(4, s(filename)))
    for text in strings:
        body += _field(6, text.encode())
    return body
