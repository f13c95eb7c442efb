"""What a cell showed, as text: of a cell run in the test shell (``capture_output``), and of a
notebook cell run by nbclient."""

from __future__ import annotations

from typing import Any


def text_of(captured: Any) -> str:
    """The stdout of a captured cell, then the text/plain of each display."""
    return "\n".join([captured.stdout] + [o.data.get("text/plain", "")
                                         for o in captured.outputs])


def notebook_text(cell: Any) -> str:
    """The outputs of a notebook cell in order: streams, text/plain of displays and results,
    and errors as ``Name: value``."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)
