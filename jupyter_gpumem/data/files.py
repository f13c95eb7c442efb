"""Reading and writing snapshots (with their traces): our columnar file (``.gpumem``,
``data.trace_file``), our JSON, gzipped or not, and PyTorch's pickles.

A pickle is read with a restricted unpickler: only the opcodes for plain containers and scalars
work. Any global (a class, a function, ``os.system``...) raises ``UnsafePickleError`` before it
is looked up, so nothing in the file ever runs. Pickles are written with protocol 4, which
PyTorch's memory viewer reads.

Every way a file can be bad ends in one ``SnapshotFileError`` (a ValueError) naming the file and,
in one line, what is wrong: missing or unreadable, corrupt or truncated gzip, neither JSON nor a
pickle, a pickle asking for code, too big, or a field of the wrong type or value (see
``schema.check_snapshot``). The work is bounded by ``LoadLimits``: decompression streams and
stops at ``max_bytes``, and counts are checked before anything is walked. The text a pickle's
memo shares counts at each use, and long strings are cut at load (Note [Bounded numbers and
text] in ``schema``), so what reads a loaded file next takes time and output in proportion.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import pickle
import stat
import zlib
from typing import IO, Any, cast

from jupyter_gpumem.data.columns import TraceColumns, as_columns, plain_snapshot
from jupyter_gpumem.data.schema import (
    SCHEMA_VERSION,
    LoadLimits,
    Snapshot,
    check_snapshot,
    limit_hint,
)
from jupyter_gpumem.data.trace_file import (
    MAGIC,
    SUFFIX,
    is_trace_file,
    read_trace_file,
    write_trace_file,
)

PathLike = str | os.PathLike[str]
#: The protocol of the pickles we write (PyTorch's viewer reads 2–4).
PICKLE_PROTOCOL = 4


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for something other than plain containers and scalars."""


class SnapshotFileError(ValueError):
    """A file that cannot be loaded as a snapshot. ``str()`` is one line, ``"FILE: reason"``;
    ``path`` and ``reason`` hold the two parts."""

    def __init__(self, path: PathLike, reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


#: The older name of ``SnapshotFileError``.
SnapshotFormatError = SnapshotFileError


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
SAVE_FORMATS = (".gpumem (ours: columns, compressed; the smallest and fastest), .html (a "
                "self-contained page), .pickle/.pkl (PyTorch's viewer) or .json (.gz too)")


def save_format(path: PathLike) -> str | None:
    """``"gpumem"``, ``"html"``, ``"pickle"`` or ``"json"`` by a file name's suffix; None if
    it names none."""
    p = os.fspath(path).lower()
    if p.endswith(SUFFIX):
        return "gpumem"
    if p.endswith((".html", ".htm")):
        return "html"
    if _is_pickle_name(p):
        return "pickle"
    if p.removesuffix(".gz").endswith(".json"):
        return "json"
    return None


_CHUNK = 1 << 20
_JSON_SPACE = b" \t\r\n"
_UTF8_BOM = b"\xef\xbb\xbf"  # json.loads reads UTF-8 with a byte-order mark too


def _open_regular(path: PathLike) -> io.BufferedReader:
    """The file opened for reading; SnapshotFileError if it is missing, not a plain file, or
    unreadable."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise SnapshotFileError(path, "is a directory, not a snapshot file")
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotFileError(path, "is not a regular file")
        return open(path, "rb")
    except SnapshotFileError:
        raise
    except FileNotFoundError:
        raise SnapshotFileError(path, "no such file") from None
    except ValueError as exc:  # an embedded NUL byte
        raise SnapshotFileError(path, f"not a valid file name ({exc})") from None
    except OSError as exc:
        raise SnapshotFileError(path, f"cannot read it: {exc.strerror or exc}") from None


def _too_big(limit: int) -> str:
    from jupyter_gpumem.data.units import format_bytes

    return (f"more than {format_bytes(limit)} once decompressed (limit max_bytes={limit:,}); "
            + limit_hint("max_bytes", "4GiB"))


def _kind(head: bytes, pickle_name: bool) -> str | None:
    """``"pickle"`` or ``"json"`` from the first non-space bytes; None if neither."""
    first = head[:1]
    if first == b"\x80":  # PROTO: protocol 2 and later
        return "pickle"
    if first in (b"{", b"[", _UTF8_BOM[:1]):
        return "pickle" if pickle_name else "json"
    if pickle_name:  # protocols 0 and 1 start with any opcode
        import pickletools

        codes = {op.code for op in pickletools.opcodes}
        return "pickle" if first.decode("latin1") in codes else None
    return None


def _read_capped(path: PathLike, limit: int) -> tuple[bytes, str]:
    """The file's bytes, gunzipped if it is gzip data (told by its magic number), and what
    it looks like (``"json"`` or ``"pickle"``). Reads at most ``limit`` bytes, in chunks, and
    stops at the first chunk that shows it is neither."""
    name = os.fspath(path)
    pickle_name = _is_pickle_name(name)
    with _open_regular(path) as raw:
        try:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            src: IO[bytes] = cast(IO[bytes], gzip.GzipFile(fileobj=raw)) if gzipped else raw
            chunks: list[bytes] = []
            total = 0
            kind: str | None = None
            while chunk := src.read(min(_CHUNK, limit + 1 - total)):
                total += len(chunk)
                if total > limit:
                    raise SnapshotFileError(path, _too_big(limit))
                chunks.append(chunk)
                if kind is None:
                    head = chunk.lstrip(_JSON_SPACE)
                    if head:
                        kind = _kind(head, pickle_name)
                        if kind is None:
                            raise SnapshotFileError(path, _neither(head, gzipped, name))
        except EOFError:
            raise SnapshotFileError(path, "truncated gzip data: it ends before the end of the "
                                    "compressed stream") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise SnapshotFileError(path, f"corrupt gzip data ({exc})") from None
        except MemoryError:
            raise SnapshotFileError(path, "not enough memory to read it") from None
        except OSError as exc:
            raise SnapshotFileError(path, f"cannot read it: {exc.strerror or exc}") from None
    if kind is None:
        raise SnapshotFileError(path, "empty file" if not total else "holds only whitespace")
    return b"".join(chunks), kind


def _neither(head: bytes, gzipped: bool, name: str) -> str:
    what = "gzip data that holds neither" if gzipped else "neither"
    hint = ("" if gzipped or not name.lower().endswith(".gz")
            else ", and not gzip data though its name ends in .gz")
    return f"{what} JSON nor a pickle (it starts with {head[:8]!r}){hint}"


def _decode(data: bytes, kind: str) -> Any:
    """Objects from the bytes; a ValueError saying what is wrong with them."""
    if kind == "json":
        try:
            return json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"not valid JSON: not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start})") from None
        except RecursionError:
            raise ValueError("not valid JSON: nested too deeply") from None
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise ValueError(f"not valid JSON: {exc}") from None
    try:
        return loads_pickle(data)
    except UnsafePickleError as exc:
        raise ValueError(str(exc)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError) as exc:
        # Nothing from the file runs (find_class refuses every global): any error is the
        # file's. An unhashable dict key is a TypeError, a bad protocol a ValueError.
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, EOFError):
            reason = "it ends too early"
        raise ValueError(f"not a valid pickle: {reason}") from None


def load_snapshot(path: PathLike, *, limits: LoadLimits | None = None) -> Snapshot:
    """Load ``.json``, ``.json.gz``, or a PyTorch pickle (``.pickle``/``.pkl``, gzipped or not).

    The format is told from the content, so a pickle with another name still loads. Any
    problem with the file raises ``SnapshotFileError`` naming it and what is wrong, in one
    line. ``limits`` (default: ``LoadLimits.from_env()``, the defaults changed by the
    ``JUPYTER_GPUMEM_LOAD_LIMITS`` environment variable) bound the decompressed size (and the
    text, counted at its expanded size) and the number of segments, blocks, events, frames and
    items of the ``jupyter_gpumem`` dict."""
    if limits is None:
        limits = LoadLimits.from_env()
    with _open_regular(path) as f:
        try:
            ours = is_trace_file(f.read(len(MAGIC)))
            f.seek(0)
            if ours:
                return check_snapshot(read_trace_file(f, limits), limits)
        except MemoryError:
            raise SnapshotFileError(path, "not enough memory to load it") from None
        except ValueError as exc:  # SchemaError or LimitExceeded
            raise SnapshotFileError(path, str(exc)) from None
        except OSError as exc:
            raise SnapshotFileError(path, f"cannot read it: {exc.strerror or exc}") from None
    data, kind = _read_capped(path, limits.max_bytes)
    # Millions of fresh dicts would set off full garbage collections over everything built
    # so far, again and again (twice the time of a big JSON); plain data needs none of them.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        obj = _decode(data, kind)
        del data
        snap = check_snapshot(obj, limits)
        # read once as columns: every view after reads arrays (a dict a event, never again)
        snap["device_traces"] = [as_columns(t) for t in snap["device_traces"]]
        return snap
    except MemoryError:
        raise SnapshotFileError(path, "not enough memory to load it") from None
    except ValueError as exc:  # SchemaError, LimitExceeded, or a decoding error
        raise SnapshotFileError(path, str(exc)) from None
    finally:
        if gc_was_on:
            gc.enable()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, TraceColumns):  # a trace in JSON is PyTorch's list of dicts
        return obj.entries()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def dumps_json(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), default=_jsonable)


def save_snapshot(snapshot: Snapshot, path: PathLike, *, pickled: bool | None = None) -> str:
    """Write ``snapshot``: ours for ``.gpumem`` names (``data.trace_file``), a pickle for
    ``.pickle``/``.pkl`` names (PyTorch's viewer opens it), JSON otherwise, or as ``pickled``
    says; ``.gz`` compresses a pickle or JSON. Returns the path written."""
    if pickled is None and save_format(path) == "gpumem":
        with open(path, "wb") as f:
            write_trace_file({**snapshot, "schema": snapshot.get("schema", SCHEMA_VERSION)}, f)
        return os.fspath(path)
    snap = plain_snapshot(snapshot)
    snap.setdefault("schema", SCHEMA_VERSION)
    if _is_pickle_name(path) if pickled is None else pickled:
        data = pickle.dumps(snap, protocol=PICKLE_PROTOCOL)
    else:
        data = dumps_json(snap).encode("utf-8")
    with _open(path, "w") as f:
        f.write(data)
    return os.fspath(path)
