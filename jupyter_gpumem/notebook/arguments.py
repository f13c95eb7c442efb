"""Checks of argument values that several magics share, made before anything runs or changes.

- ``variable_name``: what ``-o NAME`` may store a result in (``%%gpumem_trace -o``,
  ``%gpumem replay -o``): an identifier that is no keyword and no name Python or IPython keeps
  for itself, so that storing the result never shadows the namespace's machinery.
- ``writable_path``: where ``--save PATH`` and ``%gpumem dump PATH`` write: a name of a known
  format, no NUL, not a folder, in a folder that exists and can be written.

Each problem is a one-line ``UsageError`` pointing at the magic's usage.
"""

from __future__ import annotations

import keyword
import os
import re
from collections.abc import Iterable

from jupyter_gpumem.data.files import SAVE_FORMATS, save_format
from jupyter_gpumem.notebook.output import usage_error

__all__ = ["RESERVED_NAMES", "variable_name", "writable_path"]

#: Names of a notebook's namespace that IPython or Python keep (besides every dunder name,
#: IPython's output and input history ``_N`` and ``_iN``, and the names the shell hides).
RESERVED_NAMES = frozenset({
    "In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___", "_i", "_ii", "_iii",
    "_oh", "_ih", "_dh",
})
_HISTORY = re.compile(r"_i*\d+|_i+|_+")  # _1, _i3, _ii, __ ...


def variable_name(text: str, magic: str, hidden: Iterable[str] = ()) -> str:
    """``text`` if ``-o`` may store a result under it; else a UsageError saying why.
    ``hidden``: more names the shell keeps (``InteractiveShell.user_ns_hidden``)."""
    if not text.isidentifier():
        raise usage_error(f"-o takes a variable name, got {text!r}", magic)
    if keyword.iskeyword(text):
        raise usage_error(f"-o takes a variable name, got the keyword {text!r}", magic)
    if (text in RESERVED_NAMES or text in set(hidden) or _HISTORY.fullmatch(text)
            or (text.startswith("__") and text.endswith("__"))):
        raise usage_error(f"-o {text}: Python or IPython keeps that name for itself; "
                          "choose another", magic)
    return text


def writable_path(text: str, magic: str, what: str, known: Iterable[str],
                  formats: str = SAVE_FORMATS) -> str:
    """``text`` (``~`` expanded) if a file can be written there in one of the ``known`` formats
    (``save_format``'s words: "html", "pickle", "json"), told by its suffix; else a UsageError
    starting with ``what`` (``"--save"``, ``"dump"``). ``formats``: how the usage names them."""
    if "\0" in text:
        raise usage_error(f"{what}: a file name cannot hold a NUL character, got {text!r}",
                          magic)
    path = os.path.expanduser(text)
    if save_format(path) not in set(known):
        raise usage_error(f"{what}: use {formats}, got {text!r}", magic)
    if os.path.isdir(path):
        raise usage_error(f"{what}: {text!r} is a folder; give a file name in it", magic)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise usage_error(f"{what}: no such folder {folder!r}", magic)
    problem = _cannot_write(path)
    if problem:
        raise usage_error(f"{what}: cannot write {text!r}: {problem}", magic)
    return path


def _cannot_write(path: str) -> str | None:
    """Why ``path`` cannot be written (None if it can), found by opening it for writing without
    changing it: an existing file is opened and closed untouched; a new one is made and removed
    at once (permissions alone do not tell, for root on /proc or a read-only mount)."""
    existed = os.path.exists(path)
    try:
        fd = os.open(path, os.O_WRONLY | (0 if existed else os.O_CREAT | os.O_EXCL), 0o644)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    if not existed:
        os.unlink(path)
    return None
