"""Rows of strings as a table, in both displays: aligned text and an escaped HTML table.

Every text/HTML pair of tables (the ledger, a block diff, the OOM panel, a trace result, the
stats) is one ``Table``: the cells are formatted once, and only here are they aligned or
escaped. A left-aligned last column is not padded, so free text there (a line of source, a
site) leaves no trailing spaces.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    header: Sequence[str]  # one heading a column ("" for none)
    rows: Sequence[Sequence[str]]  # the cells, already formatted
    align: str = ""  # "<" (left) or ">" (right) a column; left where missing
    css_class: str = ""  # the HTML table's class

    def text(self, *, indent: str = "", header: bool = True) -> str:
        """The rows as lines of columns two spaces apart, each column as wide as its widest
        cell (with the header, when shown), trailing spaces dropped."""
        lines = [self.header, *self.rows] if header else list(self.rows)
        if not lines:
            return ""
        widths = [max(len(r[i]) for r in lines) for i in range(len(self.header))]
        out = []
        for r in lines:
            cells = [c.rjust(w) if self.align[i:i + 1] == ">" else c.ljust(w)
                     for i, (c, w) in enumerate(zip(r, widths, strict=True))]
            out.append((indent + "  ".join(cells)).rstrip())
        return "\n".join(out)

    def html(self) -> str:
        """An HTML table, every cell escaped, each column aligned as in the text (JupyterLab
        right-aligns every cell of an output's table by default)."""
        cls = f' class="{html.escape(self.css_class)}"' if self.css_class else ""
        sides = [' style="text-align: right"' if self.align[i:i + 1] == ">" else
                 ' style="text-align: left"' for i in range(len(self.header))]
        head = "".join(f"<th{side}>{html.escape(h)}</th>"
                       for side, h in zip(sides, self.header, strict=True))
        body = "".join("<tr>" + "".join(f"<td{side}>{html.escape(c)}</td>"
                                        for side, c in zip(sides, r, strict=True)) + "</tr>"
                       for r in self.rows)
        return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
