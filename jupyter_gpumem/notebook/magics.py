"""``%gpumem`` and ``%%gpumem_trace``: thin shells over the library.

Every subcommand is a plain call underneath (``api``, ``CachingAllocator``, ``Ledger``,
``trace()``). Arguments are parsed completely, and checked, before anything changes: a bad
subcommand or value raises a one-line ``UsageError`` (pointing at ``%gpumem?`` for the usage) and
leaves every setting alone. Arguments are split as a POSIX shell would, so a quoted path may hold
spaces.

This module parses the line; the table in ``subcommands`` checks it, says which function does it
(in ``readouts`` or ``controls``) and writes the list ``%gpumem?`` shows. The magics reach the
extension that made them only through ``host.Host``, so nothing here imports ``extension``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import IPython.core.magic as _ipy_magic
import IPython.core.magic_arguments as _ipy_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics

from jupyter_gpumem.data.codes import BANDS
from jupyter_gpumem.data.sizes import MAX_HISTORY_ENTRIES, RING_EVENT_BYTES
from jupyter_gpumem.data.units import MAX_INTERVAL, check_seconds, parse_bytes
from jupyter_gpumem.notebook import subcommands
from jupyter_gpumem.notebook.arguments import variable_name, writable_path
from jupyter_gpumem.notebook.host import Host, require_allocator
from jupyter_gpumem.notebook.output import display, one_line

if TYPE_CHECKING:
    from jupyter_gpumem.sources.protocol import MemorySource

# IPython's decorators are untyped: give them types once, here.
F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


_arguments: Any = _ipy_arguments


def argument(*args: Any, **kwargs: Any) -> Callable[[F], F]:
    return cast("Callable[[F], F]", _arguments.argument(*args, **kwargs))


def magic_arguments() -> Callable[[F], F]:
    return cast("Callable[[F], F]", _arguments.magic_arguments())


def kwds(**kwargs: Any) -> Callable[[F], F]:
    return cast("Callable[[F], F]", _arguments.kwds(**kwargs))


class _HelpFormatter(_ipy_arguments.MagicHelpFormatter):
    """IPython's help formatter without the ``::`` (reStructuredText) before the usage line."""

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any = "usage: %") -> None:
        add_usage: Any = super().add_usage
        add_usage(usage, actions, groups, prefix)


MAX_ENTRIES = MAX_HISTORY_ENTRIES


def _max_entries(text: str) -> int:
    """argparse ``type`` of ``--max-entries``: events, an int in [1, MAX_ENTRIES], or the ring's
    size (``64MiB``: as many events of ``RING_EVENT_BYTES`` as fit in it)."""
    try:
        value = int(text)
    except ValueError:
        try:
            if not text.rstrip()[-1:].isalpha():  # a size names its unit: 64MiB, not 1e3
                raise ValueError(text)
            size = parse_bytes(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of events (1000000) or the ring's size (64MiB), got "
                f"{text!r}") from None
        value = size // RING_EVENT_BYTES
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"{text} holds no event: each takes {RING_EVENT_BYTES} B of the ring") from None
    if not 1 <= value <= MAX_ENTRIES:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_ENTRIES}, got {text}")
    return value


def _interval(text: str) -> float:
    """argparse ``type`` of ``--interval``: seconds in [0.05, 3600]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    try:
        return check_seconds("--interval", value, least=0.05, least_ok=True, most=MAX_INTERVAL)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _without_comment(line: str) -> str:
    """``line`` up to a comment: a ``#`` that starts a word outside quotes, as a shell reads it
    (``%gpumem device sim  # a note`` is ``device sim``); a ``#`` inside a word (``a#b.json``)
    or in quotes stays."""
    quote = ""
    escaped = False
    word_start = True  # after the start or unquoted, unescaped whitespace
    for i, ch in enumerate(line):
        starts, word_start = word_start, False
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'" and os.name != "nt":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch.isspace():
            word_start = True
        elif ch == "#" and starts:
            return line[:i]
    return line


def parse_argstring(fn: Any, line: str, magic: str = "%gpumem") -> Any:
    """Split ``line`` as a POSIX shell would (quotes group; a ``#`` starting a word begins a
    comment) and parse it with the magic's parser; any problem is a one-line UsageError."""
    try:
        lexer = shlex.shlex(_without_comment(line), posix=True)
        lexer.whitespace_split = True
        lexer.commenters = ""  # '#' is an ordinary character in a path
        if os.name == "nt":
            lexer.escape = ""  # keep the backslashes of Windows paths
        argv = list(lexer)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(one_line(f"cannot split the arguments: {exc}", magic)) from None
    try:
        return fn.parser.parse_args(argv)
    except UsageError as exc:  # IPython's parser raises UsageError in place of exiting
        raise UsageError(one_line(str(exc), magic)) from None


def _parse_body(shell: Any, line: str, cell: str, count: int) -> tuple[ast.Module, str]:
    """The body of a ``%%gpumem_trace`` cell, parsed, and the file name it is compiled under.

    Its lines are numbered as the editor numbers them, the magic's own line being line 1, so a
    site, a traceback and the ledger's source column (which reads the cell as typed) name the
    line the user sees. The cached text has the magic's line on top, for tracebacks to quote."""
    code = shell.transform_cell(cell)
    code = "\n" * (_leading_blank_lines(cell) - _leading_blank_lines(code)) + code  # kept
    header = f"%%gpumem_trace {line}".rstrip()
    filename: str = shell.compile.cache(f"{header}\n{code}", count,
                                        raw_code=f"{header}\n{cell}")
    return ast.parse("\n" + code, filename), filename


def _leading_blank_lines(text: str) -> int:
    """How many lines of ``text`` come before its first that is not blank (IPython's
    ``transform_cell`` drops them)."""
    lines = text.splitlines()
    return next((i for i, t in enumerate(lines) if t.strip()), len(lines))


def _traced_sources(host: Host) -> list[MemorySource]:
    """The sources a ``%%gpumem_trace`` cell records on: those picked that can be read now; a
    UsageError saying why when none can (our allocator's: no GPU, and how to simulate one)."""
    from jupyter_gpumem.sources.registry import current_sources, get_source, selected

    found = list(current_sources())
    if found:
        return found
    if "cupy" in selected():
        require_allocator(host)
    why = []
    for name in selected():
        try:
            said = get_source(name).unavailable()
        except Exception as exc:  # a source that cannot even be made or asked
            said = str(exc)
        why.append(f"{name}: {said or 'cannot be read'}")
    raise UsageError(f"jupyter_gpumem: no source can be read now ({'; '.join(why)}).")


def line_magic(fn: F) -> F:
    return cast("F", _ipy_magic.line_magic(fn))


def cell_magic(fn: F) -> F:
    return cast("F", _ipy_magic.cell_magic(fn))


def magics_class(cls: C) -> C:
    decorate: Any = _ipy_magic.magics_class
    return cast("C", decorate(cls))


@magics_class
class GpuMemMagics(Magics):
    """The magics of one loaded extension (its ``host``)."""

    def __init__(self, shell: Any, ext: Host) -> None:
        init: Any = super().__init__
        init(shell)
        self.ext = ext

    # -- %gpumem ---------------------------------------------------------------------------

    @magic_arguments()
    @kwds(formatter_class=_HelpFormatter, description=subcommands.description())
    @argument("subcommand", nargs="?", default=None, help="what to do (see the list above); "
              "none prints a one-line status")
    @argument("values", nargs="*", help="the subcommand's arguments")
    @argument("--full", action="store_true", help="summary: every pool, not just the totals")
    @argument("--json", action="store_true", help="stats: the counters as JSON")
    @argument("--stacks", dest="stacks", action="store_true", default=None,
              help="history: record Python stacks")
    @argument("--no-stacks", dest="stacks", action="store_false", default=None,
              help="history: do not record stacks")
    @argument("--max-entries", type=_max_entries, default=None, metavar="N|SIZE",
              help="history: events to keep, or the ring's size (64MiB: 32 B an event)")
    @argument("--capacity", default=None, metavar="SIZE",
              help="device sim: capacity of the simulated device (e.g. 16GiB); replay: the "
              "device's size (default: the recorded one)")
    @argument("--config", action="append", default=None, metavar="KEY:VALUE,...",
              help="replay: a config to compare (repeat it); 'recorded' or 'defaults' too")
    @argument("--suggest", action="store_true",
              help="replay: search a small grid for the config that fits with the least reserved")
    @argument("-o", "--output", metavar="NAME", default=None,
              help="replay: store the result object in this variable")
    @argument("--interval", type=_interval, default=None, metavar="SECONDS",
              help="cluster: seconds between samples of the live view (default 1)")
    @argument("--no-live", dest="live", action="store_false", default=None,
              help="cluster: the table only, no live view")
    @argument("--stop", action="store_true", help="cluster: stop the live view")
    @line_magic
    def gpumem(self, line: str = "") -> Any:
        """``%gpumem [subcommand] [values]``; IPython shows the parser's help in place of this:
        the subcommands come from ``subcommands.SUBCOMMANDS``."""
        magic: Any = self.gpumem
        args = parse_argstring(magic, line)
        sub = subcommands.find(args.subcommand, args.values)
        defaults = {dest: magic.parser.get_default(dest) for dest in vars(args)
                 if dest not in ("subcommand", "values")}
        subcommands.check(sub, args, defaults)
        return sub.handler(self.ext, args)

    # -- %%gpumem_trace --------------------------------------------------------------------

    @magic_arguments()
    @kwds(formatter_class=_HelpFormatter)
    @argument("-o", "--output", metavar="NAME", default=None,
              help="store the result object in this variable")
    @argument("--stacks", dest="stacks", action="store_true", default=True,
              help="record Python stacks (the default)")
    @argument("--no-stacks", dest="stacks", action="store_false",
              help="do not record stacks (cheaper; no allocation sites)")
    @argument("--max-entries", type=_max_entries, default=1_000_000, metavar="N|SIZE",
              help="events to keep (default 1000000), or the ring's size (64MiB: 32 B an "
                   "event)")
    @argument("--save", metavar="PATH", default=None,
              help="also save the whole trace: .gpumem (ours: every event, compressed; the "
                   "saved view names it), .html (self-contained view), .pickle or .json "
                   "(.gz too)")
    @argument("--no-plot", action="store_true", help="text and tables only, no picture")
    @argument("--cluster", action="store_true",
              help="record on every worker of the current Dask client instead, and show each")
    @argument("--bands", choices=BANDS, default=None,
              help="timeline bands by allocating site or by holder (parameters, gradients, "
                   "optimizer state, other variables, none, freed); default: holder for "
                   "PyTorch, site for CuPy")
    @cell_magic
    def gpumem_trace(self, line: str, cell: str) -> Any:
        """Run the cell with allocation history on and show what it did to GPU memory.

        Shows the timeline, the block layout at the peak and at the end, the top allocation
        sites by bytes live at the peak, and the blocks that survive the cell with the line
        that allocated them and the variable holding them. The plain-Python form is
        ``with jupyter_gpumem.trace() as t: ...``. A cell that raises still shows its trace.
        """
        # IPython leaves out of a traceback the frames that set this: an error in the cell
        # shows the user's lines, not the magic's (as %%time and %%capture do).
        __tracebackhide__ = True
        from jupyter_gpumem.notebook.trace import trace

        args = parse_argstring(self.gpumem_trace, line, "%%gpumem_trace")
        shell: Any = self.shell
        if args.output is not None:
            variable_name(args.output, "%%gpumem_trace", shell.user_ns_hidden)
        if args.save is not None:
            args.save = writable_path(args.save, "%%gpumem_trace", "--save",
                                      ("gpumem", "html", "pickle", "json"))
        if args.cluster:
            from jupyter_gpumem.notebook.cluster import current_client

            client = current_client()
            traced = []
        else:
            traced = _traced_sources(self.ext)
        running = self.ext.ledger.running  # the cell's number, as pre_run_cell worked it out
        count = running if running is not None else int(shell.execution_count)
        tree, filename = _parse_body(shell, line, cell, count)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined,unused-ignore]
        body = compile(tree, filename, "exec")
        expr = compile(last, filename, "eval") if last is not None else None
        cell_files = dict(self.ext.ledger.cell_files)
        cell_files[filename] = count
        options = {"stacks": args.stacks, "max_entries": args.max_entries,
                   "namespace": shell.user_ns, "plot": not args.no_plot, "cell": count,
                   "cell_files": cell_files}
        if args.bands is not None:
            options["bands"] = args.bands
        tracers: list[Any] = []
        if args.cluster:
            from jupyter_gpumem.dask.trace import cluster_trace

            tracers.append(cluster_trace(client, stacks=args.stacks, plot=not args.no_plot,
                                         max_entries=args.max_entries, title=f"cell [{count}]",
                                         cell_files=cell_files, save=args.save))
        # One tracer a source, in the order picked: the live view follows the first, --save
        # writes the last one's trace.
        live = self.ext.settings.live_view
        for i, src in enumerate(traced):
            tracers.append(trace(source=src, live=live and i == 0,
                                 save=args.save if i == len(traced) - 1 else None, **options))
        error: BaseException | None = None
        value = None
        try:
            with contextlib.ExitStack() as stack:
                for tracer in tracers:
                    stack.enter_context(tracer)
                exec(body, shell.user_global_ns, shell.user_ns)
                if expr is not None:
                    value = eval(expr, shell.user_global_ns, shell.user_ns)
        except BaseException as exc:
            error = exc
        results = [t.result for t in tracers if t.result is not None]
        if results and args.output:  # several sources: a list, in the order picked
            shell.user_ns[args.output] = results[0] if len(results) == 1 else results
        for result in results:
            display(result)  # a long one: a view that asks this kernel (trace_view)
        if args.save is not None and results:
            print(f"gpumem: trace saved to {args.save}")
        if error is not None:
            from jupyter_gpumem.notebook.no_gpu import no_gpu_hint

            hint = no_gpu_hint(error)  # CuPy with no GPU: one line, not CuPy's traceback
            raise error if hint is None else UsageError(hint)
        return value
