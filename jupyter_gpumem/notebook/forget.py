"""``%gpumem forget-error``: free what the last exception's traceback keeps alive.

When a function raises, the traceback keeps each of its frames, and every frame keeps its
locals: an array made inside the function stays allocated for as long as the traceback lives.
IPython keeps the last one (``sys.last_traceback``, ``sys.last_value``, ``sys.last_exc`` on
Python 3.12, and its own traceback printer's ``tb``) so that ``%debug`` and ``%tb`` can show it:
until the next error, the memory stays taken (IPython #11572, PyTorch #27600). The footer and
the OOM panel name it (``data.holders``: ``the traceback of the error in cell [4]: prepare's
local tmp``) and offer this.

``forget_error(shell)`` clears the locals of every function frame of that traceback, and of the
exceptions chained to it (``frame.clear()``, then a read of ``f_locals`` that empties the
snapshot of them that Python 3.11 and 3.12 keep), drops IPython's references, collects garbage
once, and says how many bytes the sources' allocators got back. Afterwards ``%debug``
and ``%tb`` have nothing to show.
"""

from __future__ import annotations

import gc
import sys
import types
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem import sources
from jupyter_gpumem.data.reach import user_file
from jupyter_gpumem.data.units import format_bytes

__all__ = ["ForgottenError", "do_forget_error", "forget_error"]

_CO_OPTIMIZED = 0x1  # a function's frame (a cell's own frame is the namespace: never cleared)


@dataclass(frozen=True)
class ForgottenError:
    """What ``forget_error`` did: the error it forgot, and the allocated bytes before and after,
    by source (``"cupy"``, ``"torch"``)."""

    error: str | None  # ``ValueError: bad shape``; None when there was no error to forget
    functions: tuple[str, ...]  # the user's functions whose frames' locals were cleared
    before: dict[str, int]
    after: dict[str, int]

    @property
    def freed(self) -> int:
        return sum(max(0, self.before[k] - self.after.get(k, 0)) for k in self.before)

    def text(self) -> str:
        if self.error is None:
            return "gpumem: no error to forget (sys.last_traceback is not set)"
        names = list(dict.fromkeys(self.functions))
        whose = (", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1
                 else names[0] if names else "its frames")
        head = f"gpumem: forgot {self.error}: cleared the locals of {whose}"
        if not self.before:
            return head + "; %debug and %tb have nothing to show now"
        moves = ", ".join(f"{label} {format_bytes(self.before[label])} → "
                          f"{format_bytes(self.after.get(label, 0))}" for label in self.before)
        return (f"{head}; {format_bytes(self.freed)} freed (allocated: {moves}); %debug and %tb "
                "have nothing to show now")

    def __repr__(self) -> str:
        return self.text()


def _allocated() -> dict[str, int]:
    out: dict[str, int] = {}
    for source in sources.current_sources():
        try:
            out[source.name] = source.memory_allocated()
        except Exception:  # a source that cannot be read now (PyTorch without CUDA)
            continue
    return out


def _errors(shell: Any) -> list[BaseException]:
    """The last exception and those chained to it, each once."""
    first = [getattr(sys, "last_exc", None), getattr(sys, "last_value", None)]
    result = getattr(shell, "last_execution_result", None)
    first += [getattr(result, "error_in_exec", None), getattr(result, "error_before_exec", None)]
    out: list[BaseException] = []
    todo = [e for e in first if isinstance(e, BaseException)]
    while todo and len(out) < 64:
        exc = todo.pop()
        if any(exc is seen for seen in out):
            continue
        out.append(exc)
        todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return out


def _clear(tb: types.TracebackType | None) -> list[str]:
    """Clear the locals of ``tb``'s function frames; the names of the user's among them."""
    cleared: list[str] = []
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_flags & _CO_OPTIMIZED:
            try:
                frame.clear()
            except RuntimeError:  # still running (a generator suspended in it): leave it
                pass
            else:
                # Python 3.11 and 3.12 keep a snapshot of the locals once anything has read
                # them (IPython's traceback printer does); reading them again empties it.
                _ = frame.f_locals
                if user_file(frame.f_code.co_filename):
                    cleared.append(frame.f_code.co_name)
        tb = tb.tb_next
    return cleared


def forget_error(shell: Any = None) -> ForgottenError:
    """Free what the last error's traceback keeps alive (see the module docstring); ``shell``
    is the IPython shell whose references go too (default: the running one, if any)."""
    if shell is None and "IPython" in sys.modules:
        from IPython.core.getipython import get_ipython

        get: Any = get_ipython
        shell = get()
    errors = _errors(shell)
    tracebacks = [e.__traceback__ for e in errors]
    tracebacks.append(getattr(sys, "last_traceback", None))
    printer = getattr(shell, "InteractiveTB", None)
    tracebacks.append(getattr(printer, "tb", None))
    if not errors and all(tb is None for tb in tracebacks):
        return ForgottenError(None, (), {}, {})
    last = errors[0] if errors else None
    words = (f"the error {type(last).__name__}: {str(last).splitlines()[0][:80]}"
             if last is not None and str(last) else
             f"the error {type(last).__name__}" if last is not None else "the last error")
    before = _allocated()
    functions: list[str] = []
    seen: set[int] = set()
    for tb in tracebacks:
        if tb is not None and id(tb) not in seen:
            seen.add(id(tb))
            functions += _clear(tb)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    if printer is not None and getattr(printer, "tb", None) is not None:
        printer.tb = None
    del errors, tracebacks, last
    gc.collect()
    return ForgottenError(words, tuple(functions), before, _allocated())


def do_forget_error(host: Any, args: Any) -> None:
    """``%gpumem forget-error``: prints what it freed (``jupyter_gpumem.forget_error()`` returns
    it)."""
    print(forget_error(getattr(host, "shell", None)).text())
