"""A pprof profile (gzip-compressed protobuf, ``profile.proto``) read into plain data: what
``jax.profiler.device_memory_profile()`` returns, the device memory JAX holds now by the stack
that allocated it.

Only the fields a memory profile fills are read, by hand (no protobuf dependency): the sample
types, each sample's location ids, values and labels, the locations' lines, the functions' names
and files, and the string table. Anything else is skipped by its wire type, so a newer writer's
extra fields do no harm. What JAX writes (seen with JAX 0.11 on an H200): two sample types,
``allocations/count`` and ``space/bytes``; one sample per live buffer or compiled executable,
labelled ``kind`` (``buffer`` or ``executable``) and, for a buffer, ``device`` (``cuda:0``); its
stack innermost first, the user's line last; an executable's bytes are its code's on the
device (0 on a GPU).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from jupyter_gpumem.data.schema import Frame

__all__ = ["MemoryProfile", "ProfileError", "Sample", "read_profile"]

#: The most bytes a profile may hold once decompressed (a memory profile is a few KiB a stack).
MAX_PROFILE_BYTES = 256 << 20


class ProfileError(ValueError):
    """The bytes are not a pprof profile; the message says where they stop making sense."""


@dataclass(frozen=True)
class Sample:
    """One stack and what is held through it: ``count`` allocations of ``bytes`` in all."""

    frames: tuple[Frame, ...]  # innermost first
    count: int
    bytes: int
    labels: dict[str, str] = field(default_factory=dict)  # "kind": "buffer", "device": "cuda:0"

    @property
    def kind(self) -> str:
        return self.labels.get("kind", "")


@dataclass(frozen=True)
class MemoryProfile:
    """The samples of a memory profile, and its sample types (``("space", "bytes")``...)."""

    samples: tuple[Sample, ...]
    sample_types: tuple[tuple[str, str], ...]

    def buffers(self, device: str | None = None) -> list[Sample]:
        """The samples of live buffers (of ``device``, ``"cuda:0"``, when given)."""
        return [s for s in self.samples if s.kind == "buffer"
                and (device is None or s.labels.get("device") == device)]


# -- the wire format -----------------------------------------------------------------------------

def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(data):
            raise ProfileError(f"a number runs past the end, at byte {i}")
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ProfileError(f"a number longer than 64 bits, at byte {i}")


_Field = tuple[int, int | bytes]


def _fields(data: bytes) -> list[_Field]:
    """``(field number, value)`` of a message: an int for a varint, bytes for the rest."""
    out: list[_Field] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            length, i = _varint(data, i)
            if i + length > len(data):
                raise ProfileError(f"field {number} runs past the end, at byte {i}")
            value, i = data[i:i + length], i + length
        elif wire in (1, 5):  # fixed 64 or 32 bits: no field we read
            width = 8 if wire == 1 else 4
            value, i = data[i:i + width], i + width
        else:
            raise ProfileError(f"wire type {wire} of field {number} is not protobuf's")
        out.append((number, value))
    return out


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field's values: packed (bytes) or one varint."""
    if isinstance(value, int):
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


def _signed(v: int) -> int:  # int64 in two's complement
    return v - (1 << 64) if v >= 1 << 63 else v


def _message(value: int | bytes, what: str) -> list[_Field]:
    if not isinstance(value, bytes):
        raise ProfileError(f"{what} is a number, not a message")
    return _fields(value)


# -- the profile ---------------------------------------------------------------------------------

def read_profile(data: bytes) -> MemoryProfile:
    """The profile in ``data`` (gzip-compressed, as pprof writes it, or not). ProfileError when
    it is not one."""
    if data[:2] == b"\x1f\x8b":
        try:
            stream = zlib.decompressobj(wbits=31)
            raw = stream.decompress(data, MAX_PROFILE_BYTES)
        except (zlib.error, EOFError) as exc:
            raise ProfileError(f"not a gzip stream ({exc})") from exc
        if stream.unconsumed_tail:
            raise ProfileError(f"larger than {MAX_PROFILE_BYTES:,} bytes once decompressed")
    else:
        raw = bytes(data)
    top = _fields(raw)
    strings = [v.decode("utf-8", "replace") if isinstance(v, bytes) else "" for n, v in top
               if n == 6]

    def text(index: int) -> str:
        return strings[index] if 0 <= index < len(strings) else ""

    functions: dict[int, tuple[str, str]] = {}
    for n, v in top:
        if n == 5:
            f = dict(_message(v, "a function"))
            functions[_int(f, 1)] = (text(_int(f, 2)), text(_int(f, 4)))
    locations: dict[int, list[Frame]] = {}
    for n, v in top:
        if n == 4:
            parts = _message(v, "a location")
            lines = []
            for m, line in parts:
                if m == 4:
                    fl = dict(_message(line, "a line"))
                    name, filename = functions.get(_int(fl, 1), ("", ""))
                    lines.append(Frame(filename=filename, line=_signed(_int(fl, 2)), name=name))
            # a location's lines are inlined calls, the caller last: innermost first, as ours
            locations[_int(dict(parts), 1)] = lines
    types = []
    for n, v in top:
        if n == 1:
            t = dict(_message(v, "a sample type"))
            types.append((text(_int(t, 1)), text(_int(t, 2))))
    samples = []
    for n, v in top:
        if n == 2:
            samples.append(_sample(_message(v, "a sample"), types, locations, text))
    return MemoryProfile(tuple(samples), tuple(types))


def _int(message: dict[int, int | bytes], number: int) -> int:
    value = message.get(number, 0)
    return value if isinstance(value, int) else 0


def _sample(parts: list[_Field], types: list[tuple[str, str]],
            locations: dict[int, list[Frame]], text: Callable[[int], str]) -> Sample:
    ids: list[int] = []
    values: list[int] = []
    labels: dict[str, str] = {}
    for m, value in parts:
        if m == 1:
            ids += _ints(value)
        elif m == 2:
            values += [_signed(v) for v in _ints(value)]
        elif m == 3:
            label = dict(_message(value, "a label"))
            key = text(_int(label, 1))
            labels[key] = text(_int(label, 2)) if 2 in label else str(_signed(_int(label, 3)))
    frames = tuple(f for i in ids for f in locations.get(i, ()))
    by_type = {unit: v for (_kind, unit), v in zip(types, values, strict=False)}
    count = by_type.get("count", values[0] if values else 0)
    size = by_type.get("bytes", values[1] if len(values) > 1 else 0)
    return Sample(frames, count, size, labels)
