"""Fixtures of the browser tests: one saved notebook (executed once), and a JupyterLab server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from saved_views import execute_saved_notebook, jupyter_server


@pytest.fixture(scope="session")
def saved_notebook(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The notebook of saved_views.CELLS, executed by nbclient and saved with its outputs (the
    kernel shut down): its path and its JSON."""
    path = tmp_path_factory.mktemp("saved") / "gpumem-saved.ipynb"
    return path, execute_saved_notebook(path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server for this module's tests: its URL and root folder."""
    with jupyter_server(tmp_path_factory.mktemp("lab")) as server:
        yield server
