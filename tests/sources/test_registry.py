"""Which sources exist and which the views read: the built-in ones, ``register_source``, the
``jupyter_gpumem.sources`` entry-point group, and ``use_sources`` with ``both`` and ``all``."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from toy_source import ToySource

import jupyter_gpumem
from jupyter_gpumem import sources
from jupyter_gpumem.sources import registry


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    registry.reset()
    yield
    registry.reset()


def test_the_built_in_sources_come_first_and_cupy_is_read_by_default() -> None:
    assert sources.source_names()[:3] == ("cupy", "torch", "jax")
    assert sources.selected() == ("cupy",)


def test_register_source_makes_a_source_every_view_can_pick() -> None:
    toy = ToySource()
    jupyter_gpumem.register_source("toy", toy)
    assert "toy" in sources.source_names()
    assert sources.use_sources(["cupy", "toy"]) == ("cupy", "toy")
    assert sources.source("toy") is toy
    assert [s.name for s in sources.current_sources()] == ["toy"]  # no allocator: cupy unread
    toy.readable = False
    assert list(sources.current_sources()) == []
    jupyter_gpumem.unregister_source("toy")
    assert sources.selected() == ("cupy",)
    assert "toy" not in sources.source_names()


def test_a_factory_is_called_once_on_first_use() -> None:
    made: list[ToySource] = []

    def make() -> ToySource:
        made.append(ToySource())
        return made[-1]

    sources.register_source("toy", make)
    assert made == []  # nothing is made at registration
    first = sources.get_source("toy")
    assert sources.get_source("toy") is first and made == [first]


@pytest.mark.parametrize(("name", "source", "error", "match"), [
    ("Toy", ToySource(), ValueError, "a source name is a lowercase word"),
    ("all", ToySource(), ValueError, "a source name is a lowercase word"),
    ("both", ToySource(), ValueError, "a source name is a lowercase word"),
    ("torch", ToySource(), ValueError, "'torch' is a built-in source"),
    ("toy", 42, TypeError, "takes a MemorySource or a function that makes one, got int"),
])
def test_bad_registrations_are_refused_and_change_nothing(name, source, error, match) -> None:
    before = sources.source_names()
    with pytest.raises(error, match=match):
        sources.register_source(name, source)
    assert sources.source_names() == before


def test_an_object_that_is_not_a_source_is_refused_when_made() -> None:
    sources.register_source("half", lambda: object())
    with pytest.raises(sources.SourceError, match=r"source 'half' is not a MemorySource \(it "
                                                   r"lacks name, title, shows"):
        sources.use_sources(["half"])
    assert sources.selected() == ("cupy",)


def test_unknown_names_say_which_exist() -> None:
    with pytest.raises(sources.SourceError,
                       match=r"no source 'tf': the sources are cupy, torch, jax$"):
        sources.use_sources(["cupy", "tf"])
    assert sources.selected() == ("cupy",)
    with pytest.raises(TypeError, match="source names are strings"):
        sources.use_sources([3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="no source 'toy' was registered"):
        sources.unregister_source("toy")


def test_a_missing_library_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    with pytest.raises(sources.SourceError, match="source 'torch' needs torch, which is not "
                                                   "installed here"):
        sources.use_sources(["torch"])
    assert sources.selected() == ("cupy",)


def test_all_is_every_source_that_can_be_read_here(sim) -> None:
    sources.register_source("toy", ToySource())
    off = ToySource()
    off.readable = False
    sources.register_source("off", off)
    # torch and jax are not installed here: "all" leaves them out, as it leaves out "off"
    assert sources.use_sources(["all"]) == ("cupy", "toy")


@pytest.fixture
def entry_point_dist(tmp_path: Path, monkeypatch) -> Path:
    """A distribution on ``sys.path`` that registers ``toy`` (and a broken ``bad``) in the
    ``jupyter_gpumem.sources`` group, as ``pip install`` of a package would."""
    package = tmp_path / "toy_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""
        from toy_source import ToySource

        def make():
            return ToySource()
    """))
    info = tmp_path / "toy_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[jupyter_gpumem.sources]\ntoy = toy_plugin:make\nbad = toy_plugin:missing\n"
        "cupy = toy_plugin:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_entry_point_adds_a_source(entry_point_dist) -> None:
    names = sources.source_names()
    assert "toy" in names and "bad" in names
    assert names.count("cupy") == 1  # a built-in name stays ours
    sources.use_sources(["toy"])
    made = sources.source("toy")
    assert made is not None and made.title == "the toy library's pool"
    with pytest.raises(sources.SourceError, match=r"source 'bad': its entry point "
                                                   r"'toy_plugin:missing' failed to load"):
        sources.use_sources(["bad"])
    assert sources.selected() == ("toy",)


def test_a_run_time_registration_wins_over_an_entry_point(entry_point_dist) -> None:
    mine = ToySource()
    sources.register_source("toy", mine)
    sources.use_sources(["toy"])
    assert sources.source("toy") is mine
