"""The source table: read from each source's ``shows``, and the README's copy is today's."""

from __future__ import annotations

import sys
from pathlib import Path

from jupyter_gpumem.sources import FEATURES
from jupyter_gpumem.sources.table import built_in_shows, source_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_the_sources_own() -> None:
    text = README.read_text()
    start = text.index("<!-- source table: jupyter_gpumem.sources.table.source_table() -->\n")
    end = text.index("\n<!-- end of source table -->")
    assert text[text.index("\n", start) + 1:end] == source_table()


def test_every_built_in_source_answers_every_feature_without_importing_its_library() -> None:
    shows = built_in_shows()
    assert list(shows) == ["cupy", "torch", "jax"]
    for name, answers in shows.items():
        assert set(answers) == {key for key, _ in FEATURES}, name
    assert "torch" not in sys.modules and "jax" not in sys.modules


def test_a_feature_left_out_reads_no_and_a_bar_is_escaped() -> None:
    table = source_table({"mine": {"stats": "yes | mostly"}})
    lines = table.splitlines()
    assert lines[0] == "| what it shows | `mine` |"
    assert lines[2] == "| counters (memory_stats) | yes \\| mostly |"
    assert lines[3] == "| segments and blocks | no |"
    assert len(lines) == 2 + len(FEATURES)
