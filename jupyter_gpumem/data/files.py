"""Reading and writing snapshots (with their traces): our JSON, gzipped or not, and PyTorch's
pickles.

A pickle is read with a restricted unpickler: only the opcodes for plain containers and scalars
work. Any global (a class, a function, ``os.system``...) raises ``UnsafePickleError`` before it
is looked up, so nothing in the file ever runs. Pickles are written with protocol 4, which
PyTorch's memory viewer reads.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
from typing import IO, Any, cast

from jupyter_gpumem.data.schema import SCHEMA_VERSION, Snapshot
from jupyter_gpumem.data.sizes import segment_type_of

PathLike = str | os.PathLike[str]
#: The protocol of the pickles we write (PyTorch's viewer reads 2–4).
PICKLE_PROTOCOL = 4


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for something other than plain containers and scalars."""


class SnapshotFormatError(ValueError):
    """A file that is not a snapshot we can read."""


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    # Protocol 2 stores bytes as ``_codecs.encode(str, "latin1")``: the one global we allow,
    # and only for that.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError("refusing _codecs.encode with anything but (str, 'latin1')")
    return text.encode("latin1")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        raise UnsafePickleError(
            f"refusing to load {module}.{name}: a memory snapshot pickle holds only dicts, "
            "lists, tuples, strings and numbers, so this file is not one (or was tampered with)")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refusing a pickle with persistent ids")


def loads_pickle(data: bytes) -> Any:
    """Unpickle plain data only; raises UnsafePickleError for anything else."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def _open(path: PathLike, mode: str) -> IO[bytes]:
    p = os.fspath(path)
    if p.endswith(".gz"):
        return cast(IO[bytes], gzip.open(p, mode + "b"))
    return open(p, mode + "b")


def _is_pickle_name(path: PathLike) -> bool:
    p = os.fspath(path).lower().removesuffix(".gz")
    return p.endswith((".pickle", ".pkl", ".pt"))


#: What the suffixes of a saved snapshot or trace say, in one place for every writer.
SAVE_FORMATS = ".html (a self-contained page), .pickle/.pkl (PyTorch's viewer) or .json (.gz too)"


def save_format(path: PathLike) -> str | None:
    """``"html"``, ``"pickle"`` or ``"json"`` by a file name's suffix; None if it names none."""
    p = os.fspath(path).lower()
    if p.endswith((".html", ".htm")):
        return "html"
    if _is_pickle_name(p):
        return "pickle"
    if p.removesuffix(".gz").endswith(".json"):
        return "json"
    return None


def normalize_snapshot(obj: Any) -> Snapshot:
    """A snapshot dict from what a file held: ours, PyTorch's, or a saved trace result.

    Fills keys that older PyTorch versions leave out (block addresses, ``device``, frames)."""
    if isinstance(obj, dict) and "snapshot" in obj and isinstance(obj["snapshot"], dict):
        obj = obj["snapshot"]  # a saved TraceResult
    if isinstance(obj, list):  # very old PyTorch: a bare list of segments
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise SnapshotFormatError("not a memory snapshot: expected a dict with 'segments'")
    obj.setdefault("device_traces", [])
    for seg in obj["segments"]:
        seg.setdefault("device", 0)
        seg.setdefault("stream", 0)
        seg.setdefault("frames", [])
        seg.setdefault("segment_type", segment_type_of(seg["total_size"]))
        cursor = seg["address"]
        for b in seg.get("blocks", []):
            b.setdefault("address", cursor)
            b.setdefault("requested_size", b["size"] if b["state"] != "inactive" else 0)
            b.setdefault("frames", [])
            cursor = b["address"] + b["size"]
    for trace in obj["device_traces"]:
        for e in trace:
            e.setdefault("frames", [])
            e.setdefault("stream", 0)
            e.setdefault("time_us", 0)
    return cast(Snapshot, obj)


def load_snapshot(path: PathLike) -> Snapshot:
    """Load ``.json``, ``.json.gz``, or a PyTorch pickle (``.pickle``/``.pkl``, gzipped or not).

    The format is told from the content, so a pickle with another name still loads."""
    with _open(path, "r") as f:
        data = f.read()
    if data[:1] == b"\x80" or _is_pickle_name(path):
        obj = loads_pickle(data)
    else:
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SnapshotFormatError(f"{os.fspath(path)}: neither JSON nor a pickle ({e})") from e
    return normalize_snapshot(obj)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def dumps_json(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), default=_jsonable)


def save_snapshot(snapshot: Snapshot, path: PathLike, *, pickled: bool | None = None) -> str:
    """Write ``snapshot``: a pickle for ``.pickle``/``.pkl`` names (PyTorch's viewer opens it),
    JSON otherwise, or as ``pickled`` says; ``.gz`` compresses. Returns the path written."""
    snap = dict(snapshot)
    snap.setdefault("schema", SCHEMA_VERSION)
    if _is_pickle_name(path) if pickled is None else pickled:
        data = pickle.dumps(snap, protocol=PICKLE_PROTOCOL)
    else:
        data = dumps_json(snap).encode("utf-8")
    with _open(path, "w") as f:
        f.write(data)
    return os.fspath(path)
