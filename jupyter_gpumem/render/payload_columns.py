"""The columns of a view payload: ``{"dtype": "f8"|"i4"|"u1", "data": D}``, ``D`` the
little-endian bytes of the array, as ``bytes`` (a widget's binary buffers) or as a base64
string of the same bytes (a MIME bundle, a page). ``split_buffers`` takes the bytes out of a
message into a list of buffers, as a widget's custom message carries them."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["COLUMN_DTYPES", "column", "decode_column", "encode", "split_buffers"]

#: numpy dtype of each column dtype name; all little-endian, as the browser's typed arrays.
COLUMN_DTYPES = {"f8": "<f8", "i4": "<i4", "u1": "u1"}


def column(values: npt.ArrayLike, dtype: str = "f8") -> dict[str, Any]:
    """A column of ``values`` as bytes."""
    arr = np.ascontiguousarray(values, dtype=COLUMN_DTYPES[dtype])
    return {"dtype": dtype, "data": arr.tobytes()}


def _is_column(value: Mapping[str, Any]) -> bool:
    return set(value) == {"dtype", "data"} and value["dtype"] in COLUMN_DTYPES


def encode(payload: Any, transport: Literal["bytes", "base64"]) -> Any:
    """``payload`` with every column's data as ``bytes`` or as a base64 string; a new object."""
    if isinstance(payload, Mapping):
        if _is_column(payload):
            data = payload["data"]
            raw = base64.b64decode(data) if isinstance(data, str) else bytes(data)
            out = raw if transport == "bytes" else base64.b64encode(raw).decode("ascii")
            return {"dtype": payload["dtype"], "data": out}
        return {k: encode(v, transport) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return [encode(v, transport) for v in payload]
    return payload


def decode_column(col: Mapping[str, Any]) -> npt.NDArray[Any]:
    """A column's array, from either transport (what the browser's decoder does)."""
    data = col["data"]
    raw = base64.b64decode(data) if isinstance(data, str) else bytes(data)
    return np.frombuffer(raw, dtype=COLUMN_DTYPES[col["dtype"]])


def split_buffers(payload: Any) -> tuple[Any, list[bytes]]:
    """``payload`` (bytes columns) with each column's data replaced by ``{"buffer": j}``, and
    the buffers: JSON and binary parts of a widget's custom message (the browser's
    ``joinBuffers`` puts them back)."""
    buffers: list[bytes] = []

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            if _is_column(value) and isinstance(value["data"], bytes | bytearray | memoryview):
                buffers.append(bytes(value["data"]))
                return {"dtype": value["dtype"], "buffer": len(buffers) - 1}
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        return value

    return walk(payload), buffers
