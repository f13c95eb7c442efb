"""The source table: what each source can show, row by row (the README's, and ``%gpumem
source``'s). Read from each source's ``shows``; the built-in ones are read from their classes,
so no library is imported for it."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence

from jupyter_gpumem.sources.protocol import FEATURES
from jupyter_gpumem.sources.registry import BUILT_IN

__all__ = ["built_in_shows", "source_table"]


def built_in_shows() -> dict[str, Mapping[str, str]]:
    """``shows`` of each built-in source, by name, from its class."""
    out: dict[str, Mapping[str, str]] = {}
    for name, spec in BUILT_IN.items():
        module, _, attr = spec.partition(":")
        out[name] = getattr(importlib.import_module(module), attr).shows
    return out


def source_table(shows: Mapping[str, Mapping[str, str]] | None = None,
                 columns: Sequence[str] | None = None) -> str:
    """A Markdown table: one row a feature of ``FEATURES``, one column a source (default: the
    built-in ones); a feature a source leaves out of its ``shows`` reads "no"."""
    shows = built_in_shows() if shows is None else shows
    names = list(columns if columns is not None else shows)
    lines = ["| what it shows | " + " | ".join(f"`{n}`" for n in names) + " |",
             "| --- |" + " --- |" * len(names)]
    for key, words in FEATURES:
        cells = [shows[n].get(key, "no").replace("|", "\\|") for n in names]
        lines.append(f"| {words} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
